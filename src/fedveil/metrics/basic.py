"""Loss, accuracy and MSE: the task's headline numbers, summed batch by batch."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..data.arrays import ArrayDataset
from .base import CLASSIFICATION, REGRESSION, Metric, register


def summed_loss(outputs: torch.Tensor, y: torch.Tensor, task: str) -> float:
    """Cross-entropy (classification) or squared error (regression) summed over the batch."""
    if task == CLASSIFICATION:
        return float(F.cross_entropy(outputs, y, reduction="sum"))
    return float(F.mse_loss(outputs.reshape(y.shape), y, reduction="sum"))


class _Mean(Metric):
    """A per-row quantity averaged over the split (sums kept as Python floats per batch)."""

    def __init__(self, task: str, group: str | None = None) -> None:
        super().__init__(task, group)
        self.total, self.n = 0.0, 0

    def update(self, outputs: torch.Tensor, batch: ArrayDataset) -> None:
        self.total += self.batch_sum(outputs, batch.y)
        self.n += len(batch)

    def batch_sum(self, outputs: torch.Tensor, y: torch.Tensor) -> float:
        raise NotImplementedError

    def compute(self) -> dict[str, float]:
        return {self.name: self.total / self.n} if self.n else {}


@register
class Loss(_Mean):
    """Mean cross-entropy (classification) or mean squared error (regression)."""

    name = "loss"
    higher_is_better = False

    def batch_sum(self, outputs: torch.Tensor, y: torch.Tensor) -> float:
        """The batch's summed cross-entropy (classification) or squared error (regression)."""
        return summed_loss(outputs, y, self.task)


@register
class Accuracy(_Mean):
    """Share of rows whose arg-max class is the label."""

    name = "accuracy"
    tasks = (CLASSIFICATION,)

    def batch_sum(self, outputs: torch.Tensor, y: torch.Tensor) -> float:
        """The number of the batch's rows whose arg-max class is the label."""
        return int((outputs.argmax(dim=1) == y).sum())


@register
class MeanSquaredError(_Mean):
    """Mean squared error of a regression model (equal to its loss)."""

    name = "mse"
    higher_is_better = False
    tasks = (REGRESSION,)

    def batch_sum(self, outputs: torch.Tensor, y: torch.Tensor) -> float:
        """The batch's summed squared error."""
        return summed_loss(outputs, y, REGRESSION)
