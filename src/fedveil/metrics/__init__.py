"""Evaluation metrics by name (DESIGN idea 5): a registry of accumulators that the runtime
feeds a split's model outputs batch by batch and that return named floats.

``loss``, ``accuracy``, ``mse``; group metrics reading ``ArrayDataset.groups[group]``:
``group_accuracy``, ``worst_group_accuracy``, ``equalized_odds_gap`` (FADE Eq. 3.9),
``demographic_parity_gap``; ``auprc`` (scikit-learn's average precision). Adding a metric
is one subclass of :class:`Metric` with the :func:`register` decorator. See
docs/evaluation.md.
"""
from .base import CLASSIFICATION, METRICS, REGRESSION, Concatenating, Metric, build_metrics, metric_class, register
from .basic import summed_loss  # importing the modules registers their metrics
from .fairness import demographic_parity_gap, equalized_odds_gap, group_accuracies
from .ranking import auprc

__all__ = [
    "CLASSIFICATION", "Concatenating", "METRICS", "Metric", "REGRESSION", "auprc", "build_metrics",
    "demographic_parity_gap", "equalized_odds_gap", "group_accuracies", "metric_class", "register",
    "summed_loss",
]
