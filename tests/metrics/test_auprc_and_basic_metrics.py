"""AUPRC, loss, accuracy and MSE against small cases computed by hand, and the registry."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedveil.data.arrays import ArrayDataset
from fedveil.metrics import METRICS, auprc, build_metrics, metric_class
from fedveil.registry import UnknownNameError


def run_metric(name, outputs, y, task="classification", batch=2):
    data = ArrayDataset(torch.zeros(len(y), 1), torch.as_tensor(y))
    metric = build_metrics([name], task)[0]
    for start in range(0, len(y), batch):
        rows = slice(start, start + batch)
        metric.update(outputs[rows], data.subset(rows))
    return metric.compute()


def test_binary_auprc_by_hand():
    # class-1 scores, best first: 0.9 (y=1), 0.8 (y=0), 0.7 (y=1), 0.6 (y=1), 0.5 (y=0)
    # AP = sum over positives of (recall step) * precision there:
    #   1/3 * 1/1 + 1/3 * 2/3 + 1/3 * 3/4 = (12 + 8 + 9) / 36 = 29/36
    y = np.array([0, 1, 0, 1, 1])
    p1 = np.array([0.5, 0.9, 0.8, 0.6, 0.7])
    probabilities = np.stack([1 - p1, p1], axis=1)
    assert auprc(y, probabilities) == pytest.approx(29 / 36, abs=1e-12)
    # the metric object scores the softmax of the logits: logit log(p) gives back p
    result = run_metric("auprc", torch.log(torch.as_tensor(probabilities)), y)
    assert result == {"auprc": pytest.approx(29 / 36, abs=1e-12)}


def test_auprc_of_a_constant_score_is_the_prevalence():
    # every row tied: one threshold, precision = 2/5 at recall 1
    y = np.array([1, 0, 0, 1, 0])
    assert auprc(y, np.full((5, 2), 0.5)) == pytest.approx(0.4, abs=1e-12)


def test_multiclass_auprc_is_the_macro_mean_over_present_classes():
    # class 0 scores: .7 (y=0), .6 (y=0), .5, .2 -> both positives first: AP = 1
    # class 1 scores: .7 (y=1), .3 (y=0), .25 (y=1), .2 (y=0):
    #   AP = 1/2 * 1/1 + 1/2 * 2/3 = 5/6
    # class 2 has no row: left out; macro mean = (1 + 5/6) / 2 = 11/12
    y = np.array([0, 1, 0, 1])
    probabilities = np.array([[0.7, 0.2, 0.1], [0.5, 0.25, 0.25], [0.6, 0.3, 0.1], [0.2, 0.7, 0.1]])
    assert auprc(y, probabilities) == pytest.approx(11 / 12, abs=1e-12)


def test_auprc_without_positives_is_not_reported():
    assert auprc(np.array([0, 0]), np.full((2, 2), 0.5)) is None
    assert run_metric("auprc", torch.zeros(2, 2), np.array([0, 0])) == {}


def test_loss_and_accuracy_by_hand():
    # row 1: logits (0, ln 3), y = 1 -> p = 3/4, CE = ln(4/3), predicted 1 (right)
    # row 2: logits (1, 0),    y = 0 -> p = e/(e+1), CE = ln(1 + 1/e), predicted 0 (right)
    # row 3: logits (2, 0),    y = 1 -> p = 1/(1+e^2), CE = ln(1 + e^2), predicted 0 (wrong)
    outputs = torch.tensor([[0.0, math.log(3)], [1.0, 0.0], [2.0, 0.0]])
    y = torch.tensor([1, 0, 1])
    loss = (math.log(4 / 3) + math.log(1 + math.exp(-1)) + math.log(1 + math.exp(2))) / 3
    assert run_metric("loss", outputs, y) == {"loss": pytest.approx(loss, rel=1e-6)}
    assert run_metric("accuracy", outputs, y) == {"accuracy": 2 / 3}


def test_mse_by_hand():
    # errors 1, -2, 0.5 -> (1 + 4 + 0.25) / 3 = 1.75
    outputs = torch.tensor([[2.0], [0.0], [1.5]])
    y = torch.tensor([1.0, 2.0, 1.0])
    assert run_metric("mse", outputs, y, task="regression") == {"mse": pytest.approx(1.75, abs=1e-6)}
    assert run_metric("loss", outputs, y, task="regression") == {"loss": pytest.approx(1.75, abs=1e-6)}


def test_registry_names_directions_and_did_you_mean():
    assert set(METRICS.names()) == {
        "accuracy", "auprc", "demographic_parity_gap", "equalized_odds_gap", "group_accuracy", "loss", "mse",
        "worst_group_accuracy",
    }
    assert [metric_class(n).higher_is_better for n in ("accuracy", "auprc", "loss", "mse", "equalized_odds_gap")] == [
        True, True, False, False, False]
    with pytest.raises(UnknownNameError, match="did you mean 'equalized_odds_gap'.*choose one of: accuracy"):
        metric_class("equalised_odds_gap")
    with pytest.raises(ValueError, match="needs a classification task"):
        build_metrics(["accuracy"], "regression")
