"""Arithmetic on parameter dicts (``name -> tensor``), the currency of every algorithm."""
from __future__ import annotations

from typing import Iterable, Sequence

import torch

Params = dict[str, torch.Tensor]


def clone(p: Params) -> Params:
    """A detached copy of every tensor of ``p``."""
    return {k: v.detach().clone() for k, v in p.items()}


def zeros_like(p: Params) -> Params:
    """Zeros of the shape, dtype and device of every entry of ``p``."""
    return {k: torch.zeros_like(v) for k, v in p.items()}


def add(a: Params, b: Params, scale: float = 1.0) -> Params:
    """a + scale * b."""
    return {k: a[k] + scale * b[k] for k in a}


def sub(a: Params, b: Params) -> Params:
    """a - b."""
    return {k: a[k] - b[k] for k in a}


def scale(a: Params, s: float) -> Params:
    """s * a."""
    return {k: s * v for k, v in a.items()}


def weighted_mean(items: Sequence[Params], weights: Iterable[float]) -> Params:
    """sum_i w_i x_i / sum_i w_i (the FedAvg average, McMahan et al. 2017)."""
    w = torch.tensor(list(weights), dtype=torch.float64, device="cpu")  # host-side scalars, whatever the run's device
    if len(w) != len(items) or len(items) == 0:
        raise ValueError(f"need one weight per item, got {len(w)} weights for {len(items)} items")
    if torch.any(w < 0) or w.sum() <= 0:
        raise ValueError("weights must be non-negative with a positive sum")
    w = w / w.sum()
    return {k: _keep_dtype(_weighted_sum([float(wi) for wi in w], [it[k] for it in items]), items[0][k]) for k in items[0]}


def _weighted_sum(weights: list[float], tensors: list[torch.Tensor]) -> torch.Tensor:
    """``((0 + w_0 x_0) + w_1 x_1) + ...``: the rounding of Python's ``sum``, accumulated in place."""
    total = weights[0] * tensors[0]
    total.add_(0)  # as 0 + w_0 x_0: a -0.0 becomes +0.0
    term = torch.empty_like(total)  # one buffer for every w_i x_i (a fresh one each time first-touches its pages)
    for wi, t in zip(weights[1:], tensors[1:]):
        total.add_(torch.mul(t, wi, out=term))
    return total


def partial_mean(items: Sequence[Params], weights: Iterable[float]) -> Params:
    """Per name, the weighted mean over the items that hold it (items may hold different
    names: Split-Mix's per-base aggregation, Alg. 4.1 lines 7-8, where c_i sums the weights
    of the clients that trained base i). A name no item holds is absent from the result."""
    weights = list(weights)
    if len(weights) != len(items):
        raise ValueError(f"need one weight per item, got {len(weights)} weights for {len(items)} items")
    holders: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        for name in item:
            holders.setdefault(name, []).append(i)
    out: Params = {}
    for name, which in holders.items():
        mean = weighted_mean([{name: items[i][name]} for i in which], [weights[i] for i in which])
        out[name] = mean[name]
    return out


def corner(shape: Sequence[int]) -> tuple[slice, ...]:
    """The leading block of that shape: HeteroFL's sub-model takes the first channels of every dimension."""
    return tuple(slice(0, n) for n in shape)


def corner_mean(params: Params, updates: Sequence[Params], weights: Iterable[float]) -> Params:
    """``params`` plus, entry by entry, the weighted mean of the updates that cover the entry;
    each update holds a leading block (:func:`corner`) of some tensors (HeteroFL's
    aggregation: entries no client trained keep their value)."""
    weights = list(weights)
    if len(weights) != len(updates):
        raise ValueError(f"need one weight per update, got {len(weights)} weights for {len(updates)} updates")
    out = dict(params)
    for name in {n for u in updates for n in u}:
        total = torch.zeros_like(params[name], dtype=torch.float64)
        count = torch.zeros_like(params[name], dtype=torch.float64)
        for update, w in zip(updates, weights):
            if name in update:
                block = corner(update[name].shape)
                total[block] += w * update[name].double()
                count[block] += w
        mean = torch.where(count > 0, total / count.clamp(min=1e-300), torch.zeros_like(total))
        new = params[name].double() + mean
        out[name] = (new if params[name].is_floating_point() else new.round()).to(params[name].dtype)
    return out


def masked_mean(params: Params, values: Sequence[Params], masks: Sequence[Params], weights: Iterable[float]) -> Params:
    """Entry by entry, the weighted mean of the ``values`` whose bool ``masks`` cover the
    entry; entries no mask covers keep their value in ``params`` (ADDS's indexed aggregation,
    Eq. 19, with equal weights). A name missing from a value is not covered by it."""
    weights = list(weights)
    if not len(weights) == len(values) == len(masks):
        raise ValueError(f"need one mask and one weight per value, got {len(values)}, {len(masks)}, {len(weights)}")
    out = dict(params)
    for name in {n for v in values for n in v}:
        total = torch.zeros_like(params[name], dtype=torch.float64)
        count = torch.zeros_like(params[name], dtype=torch.float64)
        for value, mask, w in zip(values, masks, weights):
            if name in value:
                m = mask[name].to(torch.float64)
                total += w * m * value[name].double()
                count += w * m
        mean = torch.where(count > 0, total / count.clamp(min=1e-300), params[name].double())
        out[name] = _keep_dtype(mean, params[name]).to(params[name].dtype)
    return out


def _keep_dtype(mean: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Integer buffers (BatchNorm's ``num_batches_tracked``) stay integers, rounded."""
    return mean.round().to(like.dtype) if not like.is_floating_point() else mean


def global_norm(p: Params) -> torch.Tensor:
    """L2 norm of all entries taken together."""
    return torch.sqrt(sum((v.double() ** 2).sum() for v in p.values()))

