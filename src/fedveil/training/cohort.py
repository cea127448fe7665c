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

from ..data.arrays import shared_rows
from ..engine import StackedModel
from ..engine.reused import ReusedBuffers
from ..engine.grad_terms import AffineGradTerm
from ..engine.stacked import LayerRecord
from ..models.functional import buffer_names
from ..params import Params
from ..privacy.dp_sgd import check_model_for_dp
from .local import LocalStats, LocalTrainer
from .private_stacked import private_stacked_gradients
from .request import Batch, GradHook, Objective, TrainRequest


def stacking_key(request: TrainRequest, trainer: LocalTrainer) -> tuple:
    """Requests with equal keys can be trained in one stacked computation: the same model
    variant, objective, kind of mask, privacy and row mix (shapes follow from the model)."""
    mask = None if request.param_mask is None else frozenset(request.param_mask)
    model = trainer.model if request.model is None else request.model
    return (id(model), trainer.objective_of(request), mask, request.dp is None, request.private_rows is not None,
            request.input_fn is not None)


def _losses(objective: Objective, out, batch: Batch, mask: torch.Tensor) -> torch.Tensor:
    """Each client's mean objective over its real rows, ``(K,)``: per example and masked when
    the objective allows it, else client by client on the real rows only."""
    k, width = mask.shape
    counts = mask.sum(1)
    if objective.per_example_ok:
        return (objective.per_example(out, batch).reshape(k, -1) * mask).sum(1) / counts.clamp(min=1)
    means = []
    for row in range(k):
        lo, m = row * width, int(counts[row])
        means.append(objective.mean(_rows(out, lo, lo + m), batch.rows(lo, lo + m)) if m else out_zero(out))
    return torch.stack(means)


def _rows(out, lo: int, hi: int):
    return out[lo:hi] if isinstance(out, torch.Tensor) else type(out)(_rows(o, lo, hi) for o in out)


def out_zero(out) -> torch.Tensor:
    """A zero scalar on ``out``'s graph (of its first tensor when a tuple): the loss of a client with no rows."""
    first = out if isinstance(out, torch.Tensor) else out[0]
    return first.sum() * 0.0


class _BatchGatherer:
    """Merges the active clients' batches of a step, padded to the longest: a :class:`Batch`,
    the mask of real rows ``(K, width)`` and the mask of private rows (``None`` when all are).

    Padding repeats a client's first row (finite inputs), masked out of the loss. When the
    clients' rows are blocks of one packed tensor per field (:func:`~fedveil.data.arrays.packed`,
    as a simulation's training rows are), a step is one ``index_select`` per field into
    buffers reused across steps (and rounds, :class:`~fedveil.engine.reused.ReusedBuffers`);
    otherwise rows are copied client by client.
    """

    def __init__(self, requests: list[TrainRequest], reused: ReusedBuffers) -> None:
        self.requests, self.reused = requests, reused
        first = requests[0].data
        self.names = sorted(first.groups)
        self.fields = ["x", "y", *(f"g:{g}" for g in self.names)]
        self.device = first.x.device
        self.any_private = any(r.private_rows is not None for r in requests)
        shared = [shared_rows([self._source(r.data, f) for r in requests]) for f in self.fields]
        self.bases = None if any(s is None for s in shared) or len({tuple(s[1]) for s in shared}) != 1 else [s[0] for s in shared]
        self.starts = None if self.bases is None else torch.tensor(shared[0][1], device=self.device)
        self.buffers: dict[str, torch.Tensor] = {}  # this training's, overwritten step after step

    def _source(self, data, f: str) -> torch.Tensor:
        return data.x if f == "x" else data.y if f == "y" else data.groups[f[2:]]

    def __call__(self, batches: list[tuple[torch.Tensor, int]], active: list[int]):
        lengths = [len(idx) for idx, _ in batches]
        width = max(1, max(lengths))
        k = len(active)
        full = all(m == width for m in lengths)
        mask = torch.ones(k, width, device=self.device) if full else (
            torch.arange(width, device=self.device) < torch.tensor(lengths, device=self.device).unsqueeze(1)
        ).float()
        private = None
        if self.any_private:
            n_private = torch.tensor([n for _, n in batches], device=self.device)
            private = (torch.arange(width, device=self.device) < n_private.unsqueeze(1)).float()
        if self.bases is not None:
            merged = self._gather_packed(batches, active, lengths, width)
        else:
            merged = self._gather_each(batches, active, lengths, width)
        batch = Batch(merged["x"], merged["y"], {g: merged[f"g:{g}"] for g in self.names})
        return batch, mask, private

    def _gather_packed(self, batches, active: list[int], lengths: list[int], width: int) -> dict[str, torch.Tensor]:
        pad = torch.zeros(width, dtype=torch.long, device=self.device)
        rows = torch.cat([(idx.to(self.device) if m == width else torch.cat([idx.to(self.device), pad[: width - m]]))
                          for (idx, _), m in zip(batches, lengths)])
        starts = self.starts if len(active) == len(self.requests) else self.starts[torch.tensor(active, device=self.device)]
        rows = (rows.view(len(active), width) + starts.unsqueeze(1)).view(-1)
        merged = {}
        for f, base in zip(self.fields, self.bases):
            shape = (len(rows), *base.shape[1:])
            buf = self.buffers.get(f)
            if buf is None or buf.shape != shape:
                buf = self.buffers[f] = self.reused.take(("rows", f), shape, base.dtype, self.device)
            merged[f] = torch.index_select(base, 0, rows, out=buf)
        return merged

    def _gather_each(self, batches, active: list[int], lengths: list[int], width: int) -> dict[str, torch.Tensor]:
        first = self.requests[active[0]].data
        merged = {f: torch.empty((len(active) * width, *t.shape[1:]), dtype=t.dtype, device=self.device)
                  for f, t in ((f, self._source(first, f)) for f in self.fields)}
        for row, (k, (idx, _), m) in enumerate(zip(active, batches, lengths)):
            data, lo = self.requests[k].data, row * width
            idx = idx.to(self.device)
            for f, out in merged.items():
                source = self._source(data, f)
                if m:
                    torch.index_select(source, 0, idx, out=out[lo : lo + m])
                if m < width:
                    out[lo + m : lo + width] = source[0]
        return merged


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
        device = next(iter(w.values())).device
        return cls(torch.tensor(scales, device=device) if any(scales) else None, stacked, clipped.pop())

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
    """Train every request (all with one :func:`stacking_key`); returns ``(state, stats)`` per
    request, in order: the same result :meth:`LocalTrainer.run` gives for each."""
    if not requests:
        return []
    rounds = {r.round_idx for r in requests}
    if len(rounds) != 1:
        raise ValueError(f"one stacked batch trains one round, got rounds {sorted(rounds)}")
    if any(r.input_fn is not None for r in requests):
        raise ValueError("requests with an input_fn are trained one by one (LocalTrainer.run)")
    if len({stacking_key(r, trainer) for r in requests}) != 1:
        raise ValueError("one stacked batch needs requests of one model variant, objective, mask kind and privacy")
    first = requests[0]
    model = trainer.model if first.model is None else first.model
    objective = trainer.objective_of(first)
    cfg, names = trainer.config, stacked.names
    lr = trainer.lr_at(first.round_idx)
    if first.dp is not None:
        check_model_for_dp(model)
    for r in requests:
        if r.dp is not None:
            r.dp.begin_training()
    iters = [trainer.step_rows(r) for r in requests]
    steps = [trainer.num_steps(r.num_private, r.dp) for r in requests]
    hooks = [r.grad_hook for r in requests]
    w = {n: stacked.reused.stack(("param", n), [r.params[n] for r in requests]) for n in names}
    buffers = {n: stacked.reused.stack(("buffer", n), [r.params[n] for r in requests]) for n in buffer_names(model)}
    masks = None if first.param_mask is None else _stack_masks([r.param_mask for r in requests], w)
    momentum = {n: torch.zeros_like(v) for n, v in w.items()} if cfg.momentum else None
    affine = _AffineTerms.stack(hooks, w)
    grad_buffers = {n: torch.empty_like(w[n]) for n in _linear_weights(model)}
    workspace: dict = {}  # DP noise buffers
    plain_sgd = not cfg.momentum and not cfg.weight_decay and masks is None and all(h is None for h in hooks)
    losses: list[list[float]] = [[] for _ in requests]
    gather = _BatchGatherer(requests, stacked.reused)
    examples = [0] * len(requests)
    for step in range(max(steps, default=0)):
        active = [k for k, s in enumerate(steps) if step < s]
        batch, mask, private = gather([next(iters[k]) for k in active], active)
        index = None if len(active) == len(requests) else torch.tensor(active, device=mask.device)
        w_act = w if index is None else {n: v.index_select(0, index) for n, v in w.items()}
        b_act = buffers if index is None else {n: v.index_select(0, index) for n, v in buffers.items()}
        counts = mask.sum(1)
        in_clip = False
        if first.dp is None:
            # plain SGD on everyone: Linear weights are updated inside their gradient bmm
            fuse_lr = lr if plain_sgd and index is None else None
            g, step_losses = _gradients(
                stacked, objective, w_act, b_act, batch, mask, grad_buffers if index is None else {}, fuse_lr
            )
        else:
            dps = [requests[k].dp for k in active]
            in_clip = affine is not None and affine.clipped
            public = [0.0] * len(active) if private is None else (mask.sum(1) - private.sum(1)).tolist()
            g, loss_sums = private_stacked_gradients(
                stacked, model, w_act, batch.x, batch, mask, lambda out, b: objective.per_example(out, b), dps,
                [requests[k].dp.source(requests[k].generator) for k in active], workspace,
                term=affine.values(w_act, index) if in_clip else None, private=private,
                denominators=[dp.batch_size + pub for dp, pub in zip(dps, public)], buffers=b_act,
                sgd_lr=lr if plain_sgd and index is None else None,  # plain SGD on everyone: stepped in place
            )
            for dp in dps:
                dp.count_step()
            step_losses = torch.where(counts > 0, loss_sums / counts.clamp(min=1), torch.full_like(counts, math.nan))
        with torch.no_grad():
            if g is not None:  # else the private step was taken in place
                if not in_clip:  # a clipped term is already inside the private gradient
                    g = _apply_hooks(hooks, affine, w_act, g, active, index)
                m_act = None if masks is None else {n: v if index is None else v.index_select(0, index) for n, v in masks.items()}
                _sgd_step(w, w_act, g, momentum, index, lr, cfg.momentum, cfg.weight_decay, m_act)
            if index is not None:
                for n, v in b_act.items():
                    buffers[n].index_copy_(0, index, v)
        for k, loss, count in zip(active, step_losses.tolist(), counts.tolist()):
            losses[k].append(loss)
            examples[k] += int(count)
    out = []
    for k in range(len(requests)):
        seen = [v for v in losses[k] if not math.isnan(v)]
        stats = LocalStats(loss=sum(seen) / len(seen) if seen else float("nan"), steps=steps[k], examples=examples[k])
        state = {n: w[n][k] for n in names} | {n: buffers[n][k] for n in buffers}  # views into the stacked result
        out.append((state, stats))
    return out


def _stack_masks(masks: list[Params], w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each masked parameter's masks ``(K, *shape)``, broadcast to the parameter's shape."""
    return {n: torch.stack([m[n].to(w[n]).expand(w[n].shape[1:]) for m in masks]) for n in masks[0]}


def _gradients(stacked: StackedModel, objective: Objective, w, buffers, batch: Batch, mask, grad_buffers: dict,
               fuse_lr: float | None):
    """Each client's gradient of its batch-mean objective, and the losses ``(K,)``.

    Linear layers' weight gradients ``a^T g`` are written by one bmm straight into
    ``grad_buffers`` (reused every step) from their recorded inputs and output gradients;
    autograd computes only the output gradients and the other layers' gradients. With
    ``fuse_lr`` (plain SGD) Linear layers are instead updated in place,
    ``w <- w - lr a^T g`` in the same bmm, and left out of the returned gradients.
    ``buffers`` (BatchNorm statistics, ``(K, *shape)``) are updated from the real rows.
    """
    k = mask.shape[0]
    records: list[LayerRecord] = []
    leaves = {n: v.detach().requires_grad_(True) for n, v in w.items()}
    out = stacked(leaves, batch.x, k, records, buffers=buffers, rows=mask)
    batch_loss = _losses(objective, out, batch, mask)
    linear = [r for r in records if isinstance(r.module, nn.Linear)]
    by_bmm = {r.param_name(p) for r in linear for p in ("weight", "bias")}
    others = [n for n in leaves if n not in by_bmm]
    grads = torch.autograd.grad(batch_loss.sum(), [r.output for r in linear] + [leaves[n] for n in others], allow_unused=True)
    g = {n: torch.zeros_like(leaves[n]) if v is None else v for n, v in zip(others, grads[len(linear):])}
    with torch.no_grad():
        if fuse_lr is None:
            _linear_grads(linear, grads[: len(linear)], g, grad_buffers, k)
        else:
            _linear_updates(linear, grads[: len(linear)], w, fuse_lr, k)
    return g, batch_loss.detach()


def _linear_updates(linear: list[LayerRecord], out_grads, w: dict, lr: float, k: int) -> None:
    for rec, go in zip(linear, out_grads):
        if go is None:  # the objective did not use this layer's output: no update
            continue
        a = rec.saved.reshape(k, -1, rec.module.in_features)
        go = go.reshape(k, -1, rec.module.out_features).transpose(1, 2)
        w[rec.param_name("weight")].baddbmm_(go, a, alpha=-lr)
        if rec.module.bias is not None:
            w[rec.param_name("bias")].sub_(go.sum(2), alpha=lr)


def _linear_grads(linear: list[LayerRecord], out_grads, g: dict, buffers: dict, k: int) -> None:
    for rec, go in zip(linear, out_grads):
        if go is None:  # the objective did not use this layer's output: zero gradient
            for param, value in rec.module.named_parameters(recurse=False):
                name = rec.param_name(param)
                if name not in g:
                    g[name] = torch.zeros(k, *value.shape, dtype=rec.saved.dtype, device=rec.saved.device)
            continue
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


def _sgd_step(w, w_act, g, momentum, index, lr: float, beta: float, weight_decay: float, masks: dict | None = None) -> None:
    """The serial trainer's update (g += wd w; g *= mask; buf = beta buf + g; w -= lr buf),
    in place on the stacked tensors; with ``index``, only the active clients' rows change."""
    for name, grad in g.items():
        if weight_decay:
            grad.add_(w_act[name], alpha=weight_decay)
        if masks is not None and name in masks:
            grad.mul_(masks[name])
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


__all__ = ["stacking_key", "train_stacked"]
