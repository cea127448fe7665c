"""Named evaluation (DESIGN idea 5): which model, on which data, summarised how.

:func:`evaluate` feeds a split batch by batch through a ``predict`` function (an
algorithm's :meth:`~fedveil.algorithms.base.Algorithm.predict`, by default the model's
forward in eval mode) into the metrics of :mod:`fedveil.metrics`.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from ..data.arrays import ArrayDataset
from ..data.federated import FederatedDataset
from ..errors import ConfigError
from ..metrics import build_metrics, metric_class
from ..models.functional import forward
from ..params import Params

Predict = Callable[[nn.Module, Params, torch.Tensor], torch.Tensor]


def score_name(task: str) -> str:
    """The headline metric of a task: accuracy (higher is better) or mse (lower is better)."""
    return "accuracy" if task == "classification" else "mse"


def default_metrics(task: str) -> list[str]:
    """What a run reports without ``eval.metrics``: the loss and the task's score."""
    return ["loss", score_name(task)]


@torch.no_grad()
def evaluate(
    model: nn.Module, params: Params, data: ArrayDataset, task: str, batch_size: int = 1024, *,
    metrics: Sequence[str] | None = None, group: str | None = None, predict: Predict = forward,
) -> dict[str, float]:
    """``n`` and the ``metrics`` (default: loss and accuracy, or loss and mse) of the model
    state ``params`` on ``data``; outputs come from ``predict(model, params, x)``."""
    result: dict[str, float] = {"n": len(data)}
    for values in evaluate_by_metric(model, params, data, task, batch_size, metrics=metrics, group=group,
                                     predict=predict).values():
        result.update(values)
    return result


@torch.no_grad()
def evaluate_by_metric(
    model: nn.Module, params: Params, data: ArrayDataset, task: str, batch_size: int = 1024, *,
    metrics: Sequence[str] | None = None, group: str | None = None, predict: Predict = forward,
) -> dict[str, dict[str, float]]:
    """Like :func:`evaluate`, but ``{metric name: {key: value}}`` (a metric may report
    several keys, e.g. one per group, or none where it is undefined); empty for no rows."""
    n = len(data)
    if n == 0:
        return {}
    scorers = build_metrics(list(metrics) if metrics is not None else default_metrics(task), task, group)
    for start in range(0, n, batch_size):
        batch = data.subset(slice(start, start + batch_size))
        outputs = predict(model, params, batch.x)
        for scorer in scorers:
            scorer.update(outputs, batch)
    return {scorer.name: scorer.compute() for scorer in scorers}


def higher_is_better(metric: str) -> bool:
    """Whether a larger value of ``metric`` is better (its metric class says)."""
    return metric_class(metric).higher_is_better


def check_metrics(metrics: Sequence[str], group: str | None, data: FederatedDataset) -> None:
    """Raise :class:`ConfigError` before a run starts if a metric does not fit the task or
    needs group labels the pooled test set or a client's test split lacks."""
    for name in metrics:
        cls = metric_class(name)
        if data.task not in cls.tasks:
            raise ConfigError(
                f"eval.metrics: '{name}' needs a {' or '.join(cls.tasks)} task; '{data.name}' is {data.task}"
            )
        if not cls.needs_groups:
            continue
        splits = [("the pooled test set", data.test)]
        splits += [(f"client {i}'s test split", c.test) for i, c in enumerate(data.clients)]
        for where, split in splits:
            if group not in split.groups:
                have = ", ".join(sorted(split.groups)) or "none"
                raise ConfigError(
                    f"eval.group: '{name}' reads group '{group}', but {where} of '{data.name}' has no such "
                    f"group (its groups: {have}); pick one of those, or a data set with groups (adult, compas)"
                )


def summarize_clients(values: list[float], weights: list[float], higher_is_better: bool = True) -> dict[str, float]:
    """Mean, sample-weighted mean, std and worst-10% mean of a per-client metric.

    worst10 is the mean over the ceil(10%) of clients with the worst value.
    """
    v, w = np.asarray(values, dtype=float), np.asarray(weights, dtype=float)
    k = max(1, math.ceil(0.1 * len(v)))
    ordered = np.sort(v) if higher_is_better else -np.sort(-v)
    return {
        "mean": float(v.mean()),
        "weighted_mean": float((v * w).sum() / w.sum()),
        "std": float(v.std()),
        "worst10": float(ordered[:k].mean()),
    }
