"""Group metrics: per-group and worst-group accuracy, the equalized-odds gap (FADE Eq. 3.9)
and the demographic-parity gap.

Group labels come from ``ArrayDataset.groups[group]`` (e.g. ``sex`` of adult / compas,
1 = Male), the key being ``eval.group``. Groups are the distinct values present in the
evaluated split; a gap needs at least two of them and is otherwise not reported.
"""
from __future__ import annotations

import numpy as np

from .base import CLASSIFICATION, Concatenating, register


def group_accuracies(y_true: np.ndarray, y_pred: np.ndarray, groups: np.ndarray) -> dict[int, float]:
    """Accuracy within each group value present, ``{g: P(ŷ = y | a = g)}``."""
    y_true, y_pred, groups = np.asarray(y_true), np.asarray(y_pred), np.asarray(groups)
    return {int(g): float(np.mean(y_pred[groups == g] == y_true[groups == g])) for g in np.unique(groups)}


def equalized_odds_gap(y_true: np.ndarray, y_pred: np.ndarray, groups: np.ndarray) -> float | None:
    """ΔEO of Eq. 3.9 (spec 000 §2.9; Eq. 9 of the FADE paper, spec 004):

        ΔEO = |E_{z_{0,0}}[f] − E_{z_{1,0}}[f]| + |E_{z_{0,1}}[1 − f] − E_{z_{1,1}}[1 − f]|
            = |FPR_0 − FPR_1| + |FNR_0 − FNR_1|,

    with ``z_{g,y}`` the rows of group g and label y. Both terms are the gap between the
    groups in the error rate on rows of one true class: FPR_g = P(ŷ ≠ y | y = 0, g), FNR_g =
    P(ŷ ≠ y | y = 1, g). That reading extends the formula unchanged to

    * more than two classes: the sum over the classes y present in the split of the gap
      in P(ŷ ≠ y | y, g) (one minus the per-class recall), so range [0, #classes];
    * more than two groups: each term's |rate_0 − rate_1| becomes max_g − min_g.

    With two groups and binary labels both present this is exactly Eq. 3.9. None
    (undefined) when fewer than two groups are present or a class present in the split
    has no row in one of the groups.
    """
    y_true, y_pred, groups = np.asarray(y_true), np.asarray(y_pred), np.asarray(groups)
    present = np.unique(groups)
    if len(present) < 2:
        return None
    total = 0.0
    for y in np.unique(y_true):
        rates = []
        for g in present:
            rows = (y_true == y) & (groups == g)
            if not rows.any():
                return None
            rates.append(float(np.mean(y_pred[rows] != y)))
        total += max(rates) - min(rates)
    return total


def demographic_parity_gap(y_pred: np.ndarray, groups: np.ndarray) -> float | None:
    """ΔDP = |P(ŷ = 1 | a = 0) − P(ŷ = 1 | a = 1)|: the gap in positive-prediction rates.

    The FADE chapter does not define it; this is the standard definition. With more than
    two groups the gap is max_g − min_g of the rate; with more than two classes it is the
    largest such gap over the predicted classes c of P(ŷ = c | a = g) (for two classes
    c = 0 and c = 1 give the same gap, so this is the binary formula). None when fewer
    than two groups are present.
    """
    y_pred, groups = np.asarray(y_pred), np.asarray(groups)
    present = np.unique(groups)
    if len(present) < 2:
        return None
    gap = 0.0
    for c in np.unique(y_pred):
        rates = [float(np.mean(y_pred[groups == g] == c)) for g in present]
        gap = max(gap, max(rates) - min(rates))
    return gap


class _GroupMetric(Concatenating):
    tasks = (CLASSIFICATION,)
    needs_groups = True


@register
class GroupAccuracy(_GroupMetric):
    """Accuracy within each group: keys accuracy_group_<g> for the group values g present."""

    name = "group_accuracy"

    def compute(self) -> dict[str, float]:
        """``accuracy_group_<g>`` for every group value g present."""
        y, pred, groups, _ = self.arrays()
        return {f"accuracy_group_{g}": v for g, v in group_accuracies(y, pred, groups).items()}


@register
class WorstGroupAccuracy(_GroupMetric):
    """Accuracy of the worst group: min over the groups present of the group's accuracy."""

    name = "worst_group_accuracy"

    def compute(self) -> dict[str, float]:
        """The smallest group accuracy; nothing when no group was seen."""
        y, pred, groups, _ = self.arrays()
        accuracies = group_accuracies(y, pred, groups)
        return {self.name: min(accuracies.values())} if accuracies else {}


@register
class EqualizedOddsGap(_GroupMetric):
    """Equalized-odds gap ΔEO = |FPR_0 − FPR_1| + |FNR_0 − FNR_1| (FADE Eq. 3.9); 0 = fair."""

    name = "equalized_odds_gap"
    higher_is_better = False

    def compute(self) -> dict[str, float]:
        """ΔEO over the split (Eq. 3.9); nothing when fewer than two groups are present."""
        y, pred, groups, _ = self.arrays()
        gap = equalized_odds_gap(y, pred, groups)
        return {} if gap is None else {self.name: gap}


@register
class DemographicParityGap(_GroupMetric):
    """Demographic-parity gap |P(ŷ=1 | a=0) − P(ŷ=1 | a=1)|; 0 = fair."""

    name = "demographic_parity_gap"
    higher_is_better = False

    def compute(self) -> dict[str, float]:
        """The demographic-parity gap over the split; nothing when fewer than two groups are present."""
        _, pred, groups, _ = self.arrays()
        gap = demographic_parity_gap(pred, groups)
        return {} if gap is None else {self.name: gap}
