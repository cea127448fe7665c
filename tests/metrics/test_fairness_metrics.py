"""Group metrics on hand-built confusion tables; every expected number is worked out by
hand in the comments (not by re-running the implementation)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedveil.data.arrays import ArrayDataset
from fedveil.metrics import build_metrics, demographic_parity_gap, equalized_odds_gap, group_accuracies


def table(cells):
    """Rows from ``(group, label, predicted, count)`` cells, in a fixed shuffled order."""
    g, y, p = [], [], []
    for group, label, predicted, count in cells:
        g += [group] * count
        y += [label] * count
        p += [predicted] * count
    order = np.random.default_rng(0).permutation(len(y))
    return np.array(y)[order], np.array(p)[order], np.array(g)[order]


# Binary labels, two groups (a = sex):
#            y = 0 (20 rows)          y = 1 (14 rows)
#   a = 0:   10 rows, 2 predicted 1   10 rows, 3 predicted 0
#   a = 1:    5 rows, 3 predicted 1    4 rows, 1 predicted 0
BINARY = table([
    (0, 0, 0, 8), (0, 0, 1, 2), (0, 1, 1, 7), (0, 1, 0, 3),
    (1, 0, 0, 2), (1, 0, 1, 3), (1, 1, 1, 3), (1, 1, 0, 1),
])


def test_equalized_odds_gap_eq_3_9_binary():
    # FPR_0 = 2/10 = 0.2, FPR_1 = 3/5 = 0.6; FNR_0 = 3/10 = 0.3, FNR_1 = 1/4 = 0.25
    # ΔEO = |0.2 - 0.6| + |0.3 - 0.25| = 0.4 + 0.05 = 0.45
    y, p, g = BINARY
    assert equalized_odds_gap(y, p, g) == pytest.approx(0.45, abs=1e-12)


def test_equalized_odds_gap_is_symmetric_in_the_groups():
    y, p, g = BINARY
    assert equalized_odds_gap(y, p, 1 - g) == pytest.approx(0.45, abs=1e-12)


def test_demographic_parity_gap_binary():
    # P(ŷ=1 | a=0) = (2 + 7) / 20 = 9/20; P(ŷ=1 | a=1) = (3 + 3) / 9 = 2/3
    # ΔDP = 2/3 - 9/20 = 40/60 - 27/60 = 13/60
    _, p, g = BINARY
    assert demographic_parity_gap(p, g) == pytest.approx(13 / 60, abs=1e-12)


def test_group_and_worst_group_accuracy():
    # a = 0: correct 8 + 7 = 15 of 20 = 0.75; a = 1: correct 2 + 3 = 5 of 9
    y, p, g = BINARY
    accuracies = group_accuracies(y, p, g)
    assert accuracies == pytest.approx({0: 0.75, 1: 5 / 9}, abs=1e-12)


def test_a_fair_classifier_has_zero_gaps():
    # same error rates per class in both groups (1 of 4 wrong on y=0, 1 of 2 wrong on y=1)
    y, p, g = table([
        (0, 0, 0, 3), (0, 0, 1, 1), (0, 1, 1, 1), (0, 1, 0, 1),
        (1, 0, 0, 6), (1, 0, 1, 2), (1, 1, 1, 2), (1, 1, 0, 2),
    ])
    assert equalized_odds_gap(y, p, g) == 0.0
    # positive rates: a=0: (1 + 1)/6 = 1/3; a=1: (2 + 2)/12 = 1/3
    assert demographic_parity_gap(p, g) == 0.0


def test_three_groups_use_the_spread_max_minus_min():
    #          FPR                FNR
    #   a=0:   1/10 = 0.1         1/5 = 0.2
    #   a=1:   1/2  = 0.5         0/3 = 0.0
    #   a=2:   1/4  = 0.25        1/2 = 0.5
    # ΔEO = (0.5 - 0.1) + (0.5 - 0.0) = 0.9
    y, p, g = table([
        (0, 0, 0, 9), (0, 0, 1, 1), (0, 1, 1, 4), (0, 1, 0, 1),
        (1, 0, 0, 1), (1, 0, 1, 1), (1, 1, 1, 3),
        (2, 0, 0, 3), (2, 0, 1, 1), (2, 1, 1, 1), (2, 1, 0, 1),
    ])
    assert equalized_odds_gap(y, p, g) == pytest.approx(0.9, abs=1e-12)
    # positive rates: a=0: (1 + 4)/15 = 1/3; a=1: (1 + 3)/5 = 0.8; a=2: (1 + 1)/6 = 1/3
    # ΔDP = 0.8 - 1/3 = 7/15
    assert demographic_parity_gap(p, g) == pytest.approx(7 / 15, abs=1e-12)


def test_multiclass_sums_the_per_class_error_rate_gaps():
    # error rate P(ŷ != y | y, a) per true class (wrong rows predicted (y + 1) % 3):
    #            y=0          y=1          y=2
    #   a=0:     1/4 = .25    0/2 = 0      2/4 = .5
    #   a=1:     1/2 = .5     1/5 = .2     2/2 = 1
    # ΔEO = .25 + .2 + .5 = 0.95
    y, p, g = table([
        (0, 0, 0, 3), (0, 0, 1, 1), (0, 1, 1, 2), (0, 2, 2, 2), (0, 2, 0, 2),
        (1, 0, 0, 1), (1, 0, 1, 1), (1, 1, 1, 4), (1, 1, 2, 1), (1, 2, 0, 2),
    ])
    assert equalized_odds_gap(y, p, g) == pytest.approx(0.95, abs=1e-12)
    # predicted-class rates: a=0 (10 rows): c0 = (3+2)/10 = .5, c1 = (1+2)/10 = .3, c2 = 2/10 = .2
    #                        a=1 (9 rows):  c0 = (1+2)/9,       c1 = (1+4)/9,       c2 = 1/9
    # gaps: |.5 - 1/3| = 1/6, |.3 - 5/9| = 23/90, |.2 - 1/9| = 8/90; ΔDP = max = 23/90
    assert demographic_parity_gap(p, g) == pytest.approx(23 / 90, abs=1e-12)


def test_undefined_gaps_are_none():
    y, p, g = BINARY
    only_group_0 = g == 0
    assert equalized_odds_gap(y[only_group_0], p[only_group_0], g[only_group_0]) is None
    assert demographic_parity_gap(p[only_group_0], g[only_group_0]) is None
    # class 1 occurs, but group 1 has no row of it: its FNR is undefined
    keep = ~((g == 1) & (y == 1))
    assert equalized_odds_gap(y[keep], p[keep], g[keep]) is None
    # ... while DP needs no labels: a=0: 9/20, a=1: 3/5 -> 3/20
    assert demographic_parity_gap(p[keep], g[keep]) == pytest.approx(3 / 20, abs=1e-12)


def logits_for(predicted, num_classes=2):
    """Logits whose arg-max is ``predicted``."""
    out = torch.zeros(len(predicted), num_classes)
    out[torch.arange(len(predicted)), torch.as_tensor(predicted)] = 1.0
    return out


def test_metric_objects_accumulate_over_batches_and_name_their_keys():
    y, p, g = BINARY
    data = ArrayDataset(torch.zeros(len(y), 1), torch.as_tensor(y), {"sex": torch.as_tensor(g)})
    outputs = logits_for(p)
    names = ["accuracy", "group_accuracy", "worst_group_accuracy", "equalized_odds_gap", "demographic_parity_gap"]
    metrics = build_metrics(names, "classification", group="sex")
    for start in range(0, len(y), 7):  # uneven batches of 7
        rows = slice(start, start + 7)
        for m in metrics:
            m.update(outputs[rows], data.subset(rows))
    result = {}
    for m in metrics:
        result.update(m.compute())
    assert result == pytest.approx({
        "accuracy": 20 / 29,  # 15 + 5 correct of 29
        "accuracy_group_0": 0.75,
        "accuracy_group_1": 5 / 9,
        "worst_group_accuracy": 5 / 9,
        "equalized_odds_gap": 0.45,
        "demographic_parity_gap": 13 / 60,
    }, abs=1e-12)


def test_group_metric_on_data_without_the_group_names_it():
    metric = build_metrics(["equalized_odds_gap"], "classification", group="race")[0]
    data = ArrayDataset(torch.zeros(2, 1), torch.tensor([0, 1]), {"sex": torch.tensor([0, 1])})
    with pytest.raises(KeyError, match="needs group 'race'.*groups: sex"):
        metric.update(logits_for([0, 1]), data)


def test_group_metrics_need_a_group_key_and_a_classification_task():
    with pytest.raises(ValueError, match="needs a group key"):
        build_metrics(["group_accuracy"], "classification")
    with pytest.raises(ValueError, match="needs a classification task"):
        build_metrics(["equalized_odds_gap"], "regression", group="sex")
