"""Named evaluation (DESIGN idea 5): which model, on which data, summarised how."""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from ..data.arrays import ArrayDataset
from ..params import Params


@torch.no_grad()
def evaluate(model: nn.Module, params: Params, data: ArrayDataset, task: str, batch_size: int = 1024) -> dict[str, float]:
    """Mean loss and accuracy (classification) or MSE (regression) of ``params`` on ``data``."""
    n = len(data)
    if n == 0:
        return {"n": 0}
    loss_sum, correct = 0.0, 0
    for start in range(0, n, batch_size):
        x, y = data.x[start : start + batch_size], data.y[start : start + batch_size]
        out = functional_call(model, params, (x,))
        if task == "classification":
            loss_sum += float(F.cross_entropy(out, y, reduction="sum"))
            correct += int((out.argmax(dim=1) == y).sum())
        else:
            loss_sum += float(F.mse_loss(out.reshape(y.shape), y, reduction="sum"))
    result = {"n": n, "loss": loss_sum / n}
    if task == "classification":
        result["accuracy"] = correct / n
    else:
        result["mse"] = loss_sum / n
    return result


def score_name(task: str) -> str:
    """The headline metric of a task: accuracy (higher is better) or mse (lower is better)."""
    return "accuracy" if task == "classification" else "mse"


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
