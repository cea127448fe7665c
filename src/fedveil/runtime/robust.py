"""Robust aggregation: bound what one client's update can do to the aggregate.

Applied to the cohort's messages before the algorithm's ``aggregate`` (a simulation and a
deployed server alike), on each message's ``delta`` (the FedAvg family, MR-MTL):

* ``update_norm_bound = B``: every delta scaled to global L2 norm <= B (Sun et al. 2019,
  "Can You Really Backdoor Federated Learning?": norm bounding at the server). One client
  then moves a weighted mean by at most ``w_k B / sum_j w_j``.
* ``aggregation = "median"``: the coordinate-wise median of the deltas; ``"trimmed_mean"``:
  per coordinate, the mean after dropping the ``trim_fraction`` largest and smallest
  values (Yin et al. 2018, "Byzantine-Robust Distributed Learning", Def. 1-2). Every
  message's delta is replaced by that one robust delta, so the algorithm's own weighted
  mean returns it whatever the weights: a client cannot buy influence with a large claimed
  weight. Both tolerate fewer than half (median) or ``trim_fraction`` (trimmed mean) of the
  cohort being arbitrary, at a cost: they ignore the weights (unequal silos count alike),
  and on heterogeneous honest updates they are biased towards the typical client.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from ..params import Params

AGGREGATIONS = ("mean", "median", "trimmed_mean")


def bound_norm(delta: Params, bound: float) -> Params:
    """``delta`` scaled by ``min(1, bound / ||delta||)`` (global L2 norm over all tensors)."""
    norm = math.sqrt(sum(float(v.double().pow(2).sum()) for v in delta.values()))
    if norm <= bound:
        return delta
    factor = bound / norm
    return {k: v * factor for k, v in delta.items()}


def coordinate_median(deltas: list[Params]) -> Params:
    """The coordinate-wise median (the mean of the two middle values for an even count)."""
    m = len(deltas)
    out = {}
    for k in deltas[0]:
        if not deltas[0][k].is_floating_point():
            out[k] = deltas[0][k]
            continue
        ordered = torch.stack([d[k] for d in deltas]).sort(dim=0).values
        out[k] = ordered[(m - 1) // 2 : m // 2 + 1].mean(dim=0)
    return out


def trimmed_mean(deltas: list[Params], trim_fraction: float) -> Params:
    """Per coordinate, the mean of the values left after dropping ``floor(trim_fraction * m)``
    of the largest and as many of the smallest (at least one value is always kept)."""
    m = len(deltas)
    cut = min(int(math.floor(trim_fraction * m)), (m - 1) // 2)
    out = {}
    for k in deltas[0]:
        stacked = torch.stack([d[k] for d in deltas])
        if not stacked.is_floating_point():
            out[k] = deltas[0][k]
            continue
        ordered = stacked.sort(dim=0).values
        out[k] = ordered[cut : m - cut].mean(dim=0)
    return out


def robust_messages(
    messages: list[tuple[int, dict[str, Any]]], aggregation: str = "mean", trim_fraction: float = 0.0,
    norm_bound: float | None = None,
) -> list[tuple[int, dict[str, Any]]]:
    """The cohort's ``(client, message)`` pairs with each ``delta`` norm-bounded, then (median,
    trimmed mean) replaced by the robust aggregate of all deltas; other keys unchanged."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; choose one of {', '.join(AGGREGATIONS)}")
    if (aggregation == "mean" and norm_bound is None) or not any(m for _, m in messages):
        return messages  # also when every message is empty: nothing was sent (FedAvg-then-local's local phase)
    if any("delta" not in m for _, m in messages):
        raise ValueError("robust aggregation needs messages with a 'delta' (the FedAvg family, MR-MTL)")
    out = [(cid, {**m, "delta": bound_norm(m["delta"], norm_bound)}) if norm_bound is not None else (cid, m)
           for cid, m in messages]
    if aggregation == "mean":
        return out
    deltas = [m["delta"] for _, m in out]
    robust = coordinate_median(deltas) if aggregation == "median" else trimmed_mean(deltas, trim_fraction)
    return [(cid, {**m, "delta": robust}) for cid, m in out]
