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
from typing import Any

import torch
from torch.func import vmap

from ..data.arrays import ArrayDataset
from ..engine import StackedModel, stack_params
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
    """Merged ``x``/``y`` of the active clients' batches padded to the longest, and the mask."""
    width = max(len(b) for b in batches)
    xs, ys = [], []
    mask = torch.zeros(len(active), max(width, 1))
    for row, (k, idx) in enumerate(zip(active, batches)):
        mask[row, : len(idx)] = 1.0
        pad = torch.zeros(max(width, 1) - len(idx), dtype=torch.long)
        full = torch.cat([idx.long(), pad])
        xs.append(requests[k].data.x[full])
        ys.append(requests[k].data.y[full])
    return torch.cat(xs), torch.cat(ys), mask


def _apply_hooks(hooks: list[GradHook | None], w: dict, g: dict, rows: list[int]) -> dict:
    """Add the clients' gradient terms: stacked when they are all affine, else one by one."""
    chosen = [hooks[k] for k in rows]
    if all(h is None for h in chosen):
        return g
    if all(h is None or isinstance(h, AffineGradTerm) for h in chosen):
        out = {}
        for name, grad in g.items():
            scale = torch.tensor([h.scale if h is not None else 0.0 for h in chosen], dtype=grad.dtype)
            grad = grad + scale.view(-1, *([1] * (grad.dim() - 1))) * w[name]
            if any(h is not None and h.offset is not None and name in h.offset for h in chosen):
                zero = torch.zeros_like(grad[0])
                grad = grad + torch.stack([
                    h.offset[name] if h is not None and h.offset is not None and name in h.offset else zero
                    for h in chosen
                ])
            out[name] = grad
        return out
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
    iters = [trainer._batches(len(r.data), r.generator, r.dp) for r in requests]
    steps = [trainer.num_steps(len(r.data), r.dp) for r in requests]
    hooks = [r.grad_hook for r in requests]
    w = {n: v.detach() for n, v in stack_params([r.params for r in requests], names).items()}
    momentum: dict[str, torch.Tensor] | None = None
    per_example_loss = _per_example_loss(trainer.loss_fn)
    losses: list[list[float]] = [[] for _ in requests]
    examples = [0] * len(requests)
    for step in range(max(steps)):
        active = [k for k, s in enumerate(steps) if step < s]
        batches = [next(iters[k]) for k in active]
        x, y, mask = _gather_batches(requests, batches, active)
        everyone = len(active) == len(requests)
        index = None if everyone else torch.tensor(active)
        w_act = {n: (v if everyone else v.index_select(0, index)) for n, v in w.items()}
        counts = mask.sum(1)
        if requests[active[0]].dp is None:
            leaves = {n: v.requires_grad_(True) for n, v in w_act.items()}
            out = stacked(leaves, x, len(active))
            ex_loss = per_example_loss(out, y).reshape(len(active), -1) * mask
            batch_loss = ex_loss.sum(1) / counts
            grads = torch.autograd.grad(batch_loss.sum(), list(leaves.values()))
            g = dict(zip(leaves.keys(), grads))
            w_act = {n: v.detach() for n, v in w_act.items()}
            step_losses = batch_loss.detach()
        else:
            dps = [requests[k].dp for k in active]
            g, loss_sums = private_stacked_gradients(
                stacked, trainer.model, w_act, x, y, mask, per_example_loss, dps,
                [requests[k].generator for k in active],
            )
            for dp in dps:
                dp.steps_taken += 1
            step_losses = torch.where(counts > 0, loss_sums / counts.clamp(min=1), torch.full_like(counts, math.nan))
        g = _apply_hooks(hooks, w_act, g, active)
        if cfg.weight_decay:
            g = {n: g[n] + cfg.weight_decay * w_act[n] for n in g}
        if cfg.momentum:
            # zero-initialised buffers: m * 0 + g = g, the serial trainer's first step exactly
            momentum = momentum or {n: torch.zeros_like(v) for n, v in w.items()}
            buf = {n: cfg.momentum * (v if everyone else v.index_select(0, index)) + g[n] for n, v in momentum.items()}
            _scatter(momentum, buf, index)
            g = buf
        new = {n: w_act[n] - lr * g[n] for n in g}
        _scatter(w, new, index)
        for row, k in enumerate(active):
            losses[k].append(float(step_losses[row]))
            examples[k] += int(counts[row])
    out = []
    for k in range(len(requests)):
        seen = [v for v in losses[k] if not math.isnan(v)]
        stats = LocalStats(loss=sum(seen) / len(seen) if seen else float("nan"), steps=steps[k], examples=examples[k])
        out.append(({n: w[n][k].clone() for n in names}, stats))
    return out


def _scatter(target: dict[str, torch.Tensor], rows: dict[str, torch.Tensor], index: torch.Tensor | None) -> None:
    for n, v in rows.items():
        if index is None:
            target[n] = v
        else:
            target[n] = target[n].index_copy(0, index, v)


__all__: list[Any] = ["TrainRequest", "train_stacked"]
