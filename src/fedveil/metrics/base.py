"""The metric contract and its registry: a metric accumulates one split's model outputs
batch by batch and returns named floats (DESIGN idea 5, "evaluation is named").

A metric reports one or more *keys*: ``accuracy`` reports ``accuracy``, the per-group
accuracy reports ``accuracy_group_<g>`` for every group value ``g`` in the data. A key
whose value is undefined on the data seen (a gap between groups with only one group
present, AUPRC without a positive row) is left out rather than reported as NaN.
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

from ..data.arrays import ArrayDataset
from ..registry import Registry, UnknownNameError

CLASSIFICATION, REGRESSION = "classification", "regression"


class Metric:
    """Accumulates ``update(outputs, batch)`` calls over one split; ``compute()`` gives
    ``{key: value}``. ``outputs`` are the model's outputs on ``batch.x`` (logits for
    classification, predictions for regression)."""

    name: ClassVar[str] = ""
    higher_is_better: ClassVar[bool] = True
    tasks: ClassVar[tuple[str, ...]] = (CLASSIFICATION, REGRESSION)
    needs_groups: ClassVar[bool] = False  # reads ``batch.groups[group]``

    def __init__(self, task: str, group: str | None = None) -> None:
        if task not in self.tasks:
            raise ValueError(f"metric '{self.name}' needs a {' or '.join(self.tasks)} task, not {task}")
        if self.needs_groups and group is None:
            raise ValueError(f"metric '{self.name}' needs a group key (eval.group)")
        self.task, self.group = task, group

    def update(self, outputs: torch.Tensor, batch: ArrayDataset) -> None:
        """Accumulates the model's ``outputs`` on one ``batch`` of the split."""
        raise NotImplementedError

    def compute(self) -> dict[str, float]:
        """``{key: value}`` over every batch seen; a key undefined on them is left out."""
        raise NotImplementedError

    def _groups_of(self, batch: ArrayDataset) -> torch.Tensor:
        if self.group not in batch.groups:
            have = ", ".join(sorted(batch.groups)) or "none"
            raise KeyError(f"metric '{self.name}' needs group '{self.group}', the data has groups: {have}")
        return batch.groups[self.group]


class Concatenating(Metric):
    """A metric computed once on the whole split: it keeps the predicted labels, the
    class-1 (or per-class) scores, the targets and the group labels of every batch.
    Evaluation splits are small, so this costs little and keeps the formulas exact."""

    keep_scores: ClassVar[bool] = False

    def __init__(self, task: str, group: str | None = None) -> None:
        super().__init__(task, group)
        self._pred: list[np.ndarray] = []
        self._scores: list[np.ndarray] = []
        self._y: list[np.ndarray] = []
        self._g: list[np.ndarray] = []

    def update(self, outputs: torch.Tensor, batch: ArrayDataset) -> None:
        """Keeps the batch's predicted labels, targets, softmax scores (with ``keep_scores``) and group labels."""
        outputs = outputs.detach()
        self._pred.append(outputs.argmax(dim=1).cpu().numpy())
        if self.keep_scores:
            self._scores.append(torch.softmax(outputs.double(), dim=1).cpu().numpy())
        self._y.append(batch.y.detach().cpu().numpy())
        if self.needs_groups:
            self._g.append(self._groups_of(batch).detach().cpu().numpy())

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
        """(y_true, y_pred, groups or None, class probabilities or None) of the whole split."""
        cat = lambda parts: np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)  # noqa: E731
        y, pred = cat(self._y), cat(self._pred)
        groups = cat(self._g) if self.needs_groups else None
        scores = np.concatenate(self._scores) if self._scores else None
        return y, pred, groups, scores


METRICS: Registry[type[Metric]] = Registry("metric")


def register(cls: type[Metric]) -> type[Metric]:
    """Class decorator: register ``cls`` under ``cls.name`` with its docstring's first line."""
    return METRICS.register(cls.name)(cls)


def metric_class(name: str) -> type[Metric]:
    """The registered metric ``name``; an unknown name raises with a did-you-mean hint."""
    return METRICS.get(name)


def build_metrics(names: list[str] | tuple[str, ...], task: str, group: str | None = None) -> list[Metric]:
    """Fresh accumulators for ``names`` (duplicates dropped, order kept)."""
    return [metric_class(n)(task, group) for n in dict.fromkeys(names)]


__all__ = [
    "CLASSIFICATION", "Concatenating", "METRICS", "Metric", "REGRESSION", "UnknownNameError",
    "build_metrics", "metric_class", "register",
]
