"""AUPRC (average precision) for rare-event tasks, computed by scikit-learn."""
from __future__ import annotations

import numpy as np
from sklearn.metrics import average_precision_score

from .base import CLASSIFICATION, Concatenating, register


def auprc(y_true: np.ndarray, probabilities: np.ndarray) -> float | None:
    """Average precision AP = Σ_n (R_n − R_{n−1}) P_n (scikit-learn's
    ``average_precision_score``, the step-wise area under the precision-recall curve).

    Binary (two columns): the positive class is 1, scored by its probability. More
    classes: the mean over the classes present in ``y_true`` of the one-vs-rest AP
    (macro average). None when no class has a positive row to rank (binary: no 1s).
    """
    y_true, probabilities = np.asarray(y_true), np.asarray(probabilities)
    num_classes = probabilities.shape[1]
    if num_classes == 2:
        positives = y_true == 1
        return float(average_precision_score(positives, probabilities[:, 1])) if positives.any() else None
    present = [c for c in range(num_classes) if (y_true == c).any()]
    if not present:
        return None
    return float(np.mean([average_precision_score(y_true == c, probabilities[:, c]) for c in present]))


@register
class AUPRC(Concatenating):
    """Area under the precision-recall curve (average precision; binary: positive class 1)."""

    name = "auprc"
    tasks = (CLASSIFICATION,)
    keep_scores = True

    def compute(self) -> dict[str, float]:
        """Average precision of the kept class scores (:func:`auprc`); nothing without a positive row."""
        y, _, _, scores = self.arrays()
        value = None if scores is None else auprc(y, scores)
        return {} if value is None else {self.name: value}
