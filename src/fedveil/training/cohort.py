"""Local training of K clients at once on stacked parameters (DESIGN idea 4).

:func:`train_stacked` does for K requests exactly what :meth:`LocalTrainer.train`
does for one: the same batches (drawn from each client's own generator in the same
order), the same loss, gradient terms, weight decay, momentum and learning rate, and
under DP the same clipping and the same noise draws. The K models run as one
:class:`~fedveil.engine.StackedModel` forward and one backward; the loss is the sum
of the clients' batch-mean losses, so each client's gradient is its own.

Unequal clients: a step's batches are padded to the longest (padding rows are
masked out of the loss) and a client that has taken all its steps is left out of
later steps, so data sizes and step counts may differ freely.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import vmap

from ..data.arrays import ArrayDataset
from ..engine import StackedModel, stack_params
from ..engine.stacked import LayerRecord
from ..engine.grad_terms import AffineGradTerm
from ..params import Params
from ..privacy.dp_sgd import ExampleDP
from .local import GradHook, LocalStats, LocalTrainer
from .private_stacked import private_stacked_gradients


@dataclass
class TrainRequest:
    """The arguments of one :meth:`LocalTrainer.train` call."""

    params: Params
    data: ArrayDataset
    generator: torch.Generator
    round_idx: int
    grad_hook: GradHook | None = None
    dp: ExampleDP | None = None


def _per_example_loss(loss_fn):
    """The trainer's batch-mean loss applied to one example at a time: ``(N,)`` losses."""
    return vmap(lambda out, y: loss_fn(out.unsqueeze(0), y.unsqueeze(0)))


def _gather_batches(requests: list[TrainRequest], batches: list[torch.Tensor], active: list[int]):
    """Merged ``x``/``y`` of the active clients' batches padded to the longest, and the mask.

    Rows are copied straight into one preallocated tensor; padding repeats a real row
    (finite inputs), masked out of the loss.
    """
    width = max(1, max(len(b) for b in batches))
    first = requests[active[0]].data
    x = torch.empty((len(active) * width, *first.x.shape[1:]), dtype=first.x.dtype)
    y = torch.empty((len(active) * width, *first.y.shape[1:]), dtype=first.y.dtype)
    mask = torch.zeros(len(active), width)
    for row, (k, idx) in enumerate(zip(active, batches)):
        data, m, lo = requests[k].data, len(idx), row * width
        if m:
            torch.index_select(data.x, 0, idx, out=x[lo : lo + m])
            torch.index_select(data.y, 0, idx, out=y[lo : lo + m])
        if m < width:
            x[lo + m : lo + width] = data.x[0]
            y[lo + m : lo + width] = data.y[0]
        mask[row, :m] = 1.0
    return x, y, mask


@dataclass
class _AffineTerms:
    """The cohort's affine gradient terms stacked once per round: ``g += scale * w + offset``."""

    scales: torch.Tensor | None  # (K,), None when every scale is 0
    offsets: dict[str, torch.Tensor]  # name -> (K, *shape)
    clipped: bool  # added to every per-example gradient before DP clipping (AffineGradTerm.clipped)

    @classmethod
    def stack(cls, hooks: list[GradHook | None], w: dict) -> "_AffineTerms | None":
        """None unless every hook is affine (or absent) and at least one is present."""
        if all(h is None for h in hooks) or not all(h is None or isinstance(h, AffineGradTerm) for h in hooks):
            return None
        clipped = {h.clipped for h in hooks if h is not None}
        if len(clipped) > 1:
            raise ValueError("a cohort mixes clipped and unclipped gradient terms; an algorithm must use one kind")
        scales = [h.scale if h is not None else 0.0 for h in hooks]
        offsets = [h.offset if h is not None and h.offset is not None else {} for h in hooks]
        stacked = {}
        for name, value in w.items():
            if any(name in o for o in offsets):
                zero = torch.zeros_like(value[0])
                stacked[name] = torch.stack([o.get(name, zero) for o in offsets])
        return cls(torch.tensor(scales) if any(scales) else None, stacked, clipped.pop())

    def values(self, w: dict, index: torch.Tensor | None) -> dict:
        """The terms alone, ``scale_k * w_k + offset_k``, for every parameter: ``(K_active, *shape)``."""
        g = {name: torch.zeros_like(v) for name, v in w.items()}
        self.add_to(g, w, index)
        return g

    def add_to(self, g: dict, w: dict, index: torch.Tensor | None) -> None:
        scales = self.scales
        if scales is not None and index is not None:
            scales = scales.index_select(0, index)
        for name, grad in g.items():
            if scales is not None:
                grad.add_(scales.to(grad.dtype).view(-1, *([1] * (grad.dim() - 1))) * w[name])
            if name in self.offsets:
                grad.add_(self.offsets[name] if index is None else self.offsets[name].index_select(0, index))


def _apply_hooks(hooks: list[GradHook | None], affine: _AffineTerms | None, w: dict, g: dict,
                 rows: list[int], index: torch.Tensor | None) -> dict:
    """Add the clients' gradient terms: stacked when they are all affine, else one client at a time."""
    if affine is not None:
        affine.add_to(g, w, index)
        return g
    chosen = [hooks[k] for k in rows]
    if all(h is None for h in chosen):
        return g
    rows_out = []
    for row, hook in enumerate(chosen):
        wk, gk = {n: v[row] for n, v in w.items()}, {n: v[row] for n, v in g.items()}
        rows_out.append(gk if hook is None else hook(wk, gk))
    return {n: torch.stack([r[n] for r in rows_out]) for n in g}


def train_stacked(trainer: LocalTrainer, stacked: StackedModel, requests: list[TrainRequest]) -> list[tuple[Params, LocalStats]]:
    """Train every request's model; returns ``(params, stats)`` per request, in order."""
    if not requests:
        return []
    rounds = {r.round_idx for r in requests}
    if len(rounds) != 1:
        raise ValueError(f"one stacked batch trains one round, got rounds {sorted(rounds)}")
    cfg, names = trainer.config, stacked.names
    lr = trainer.lr_at(requests[0].round_idx)
    for r in requests:
        if r.dp is not None:
            r.dp.begin_training()
    iters = [trainer._batches(len(r.data), r.generator, r.dp) for r in requests]
    steps = [trainer.num_steps(len(r.data), r.dp) for r in requests]
    hooks = [r.grad_hook for r in requests]
    w = {n: v.detach() for n, v in stack_params([r.params for r in requests], names).items()}
    momentum = {n: torch.zeros_like(v) for n, v in w.items()} if cfg.momentum else None
    affine = _AffineTerms.stack(hooks, w)
    buffers = {n: torch.empty_like(w[n]) for n in _linear_weights(trainer.model)}
    workspace: dict = {}  # DP noise buffers
    per_example_loss = _per_example_loss(trainer.loss_fn)
    plain_sgd = not cfg.momentum and not cfg.weight_decay and all(h is None for h in hooks)
    losses: list[list[float]] = [[] for _ in requests]
    examples = [0] * len(requests)
    for step in range(max(steps, default=0)):
        active = [k for k, s in enumerate(steps) if step < s]
        batches = [next(iters[k]) for k in active]
        x, y, mask = _gather_batches(requests, batches, active)
        index = None if len(active) == len(requests) else torch.tensor(active)
        w_act = w if index is None else {n: v.index_select(0, index) for n, v in w.items()}
        counts = mask.sum(1)
        in_clip = False
        if requests[active[0]].dp is None:
            # plain SGD on everyone: Linear weights are updated inside their gradient bmm
            fuse_lr = lr if plain_sgd and index is None else None
            g, step_losses = _gradients(
                stacked, w_act, x, y, mask, counts, per_example_loss, buffers if index is None else {}, fuse_lr
            )
        else:
            dps = [requests[k].dp for k in active]
            in_clip = affine is not None and affine.clipped
            g, loss_sums = private_stacked_gradients(
                stacked, trainer.model, w_act, x, y, mask, per_example_loss, dps,
                [requests[k].dp.source(requests[k].generator) for k in active], workspace,
                term=affine.values(w_act, index) if in_clip else None,
            )
            for dp in dps:
                dp.count_step()
            step_losses = torch.where(counts > 0, loss_sums / counts.clamp(min=1), torch.full_like(counts, math.nan))
        with torch.no_grad():
            if not in_clip:  # a clipped term is already inside the private gradient
                g = _apply_hooks(hooks, affine, w_act, g, active, index)
            _sgd_step(w, w_act, g, momentum, index, lr, cfg.momentum, cfg.weight_decay)
        for row, k in enumerate(active):
            losses[k].append(float(step_losses[row]))
            examples[k] += int(counts[row])
    out = []
    for k in range(len(requests)):
        seen = [v for v in losses[k] if not math.isnan(v)]
        stats = LocalStats(loss=sum(seen) / len(seen) if seen else float("nan"), steps=steps[k], examples=examples[k])
        out.append(({n: w[n][k] for n in names}, stats))  # views into the stacked result
    return out


def _gradients(stacked: StackedModel, w, x, y, mask, counts, per_example_loss, buffers: dict, fuse_lr: float | None):
    """Each client's gradient of its batch-mean loss, and the losses ``(K,)``.

    Linear layers' weight gradients ``a^T g`` are written by one bmm straight into
    ``buffers`` (reused every step) from their recorded inputs and output gradients;
    autograd computes only the output gradients and the other layers' gradients. With
    ``fuse_lr`` (plain SGD) Linear layers are instead updated in place,
    ``w <- w - lr a^T g`` in the same bmm, and left out of the returned gradients.
    """
    k = mask.shape[0]
    records: list[LayerRecord] = []
    leaves = {n: v.detach().requires_grad_(True) for n, v in w.items()}
    out = stacked(leaves, x, k, records)
    batch_loss = (per_example_loss(out, y).reshape(k, -1) * mask).sum(1) / counts
    linear = [r for r in records if isinstance(r.module, nn.Linear)]
    by_bmm = {r.param_name(p) for r in linear for p in ("weight", "bias")}
    others = [n for n in leaves if n not in by_bmm]
    grads = torch.autograd.grad(batch_loss.sum(), [r.output for r in linear] + [leaves[n] for n in others])
    g = dict(zip(others, grads[len(linear):]))
    with torch.no_grad():
        if fuse_lr is None:
            _linear_grads(linear, grads[: len(linear)], g, buffers, k)
        else:
            _linear_updates(linear, grads[: len(linear)], w, fuse_lr, k)
    return g, batch_loss.detach()


def _linear_updates(linear: list[LayerRecord], out_grads, w: dict, lr: float, k: int) -> None:
    for rec, go in zip(linear, out_grads):
        a = rec.saved.reshape(k, -1, rec.module.in_features)
        go = go.reshape(k, -1, rec.module.out_features).transpose(1, 2)
        w[rec.param_name("weight")].baddbmm_(go, a, alpha=-lr)
        if rec.module.bias is not None:
            w[rec.param_name("bias")].sub_(go.sum(2), alpha=lr)


def _linear_grads(linear: list[LayerRecord], out_grads, g: dict, buffers: dict, k: int) -> None:
    for rec, go in zip(linear, out_grads):
        a = rec.saved.reshape(k, -1, rec.module.in_features)
        go = go.reshape(k, -1, rec.module.out_features).transpose(1, 2)
        name = rec.param_name("weight")
        if name in g:  # a layer called more than once accumulates
            g[name].baddbmm_(go, a)
        elif name in buffers:
            g[name] = torch.bmm(go, a, out=buffers[name])
        else:
            g[name] = torch.bmm(go, a)
        if rec.module.bias is not None:
            bias = rec.param_name("bias")
            g[bias] = g[bias] + go.sum(2) if bias in g else go.sum(2)


def _linear_weights(model: nn.Module) -> list[str]:
    return [f"{name}.weight" if name else "weight" for name, m in model.named_modules() if isinstance(m, nn.Linear)]


def _sgd_step(w, w_act, g, momentum, index, lr: float, beta: float, weight_decay: float) -> None:
    """The serial trainer's update (g += wd w; buf = beta buf + g; w -= lr buf), in place on
    the stacked tensors; with ``index``, only the active clients' rows change."""
    for name, grad in g.items():
        if weight_decay:
            grad.add_(w_act[name], alpha=weight_decay)
        if momentum is not None:
            if index is None:
                grad = momentum[name].mul_(beta).add_(grad)
            else:
                grad = momentum[name].index_select(0, index).mul_(beta).add_(grad)
                momentum[name].index_copy_(0, index, grad)
        if index is None:
            w[name].sub_(grad, alpha=lr)
        else:
            w[name].index_copy_(0, index, w_act[name].sub_(grad, alpha=lr))


__all__ = ["TrainRequest", "train_stacked"]
