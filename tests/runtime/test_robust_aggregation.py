"""Robust aggregation (fedveil.runtime.robust) against hand-computed values, and its config."""
from __future__ import annotations

import math

import pytest
import torch

from fedveil.errors import ConfigError
from fedveil.runtime import Simulation, run
from fedveil.runtime.robust import bound_norm, coordinate_median, robust_messages, trimmed_mean

from tiny_runs import tiny_config

pytestmark = pytest.mark.usefixtures("skip_plots")


def deltas(*rows):
    return [{"w": torch.tensor(r, dtype=torch.float64)} for r in rows]


def test_median_and_trimmed_mean_by_hand():
    five = deltas([1.0, -4.0], [2.0, 0.0], [100.0, 1.0], [3.0, 2.0], [-50.0, 3.0])
    assert coordinate_median(five)["w"].tolist() == [2.0, 1.0]
    assert coordinate_median(five[:4])["w"].tolist() == [2.5, 0.5]  # even count: mean of the two middle values
    # m = 5, trim 0.2: drop one value at each end, per coordinate
    assert trimmed_mean(five, 0.2)["w"].tolist() == pytest.approx([(1 + 2 + 3) / 3, (0 + 1 + 2) / 3])
    assert trimmed_mean(five, 0.0)["w"].tolist() == pytest.approx([56 / 5, 2 / 5])  # no trim: the mean


def test_norm_bound_scales_to_exactly_the_bound_and_leaves_small_updates():
    big = {"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([4.0])}  # global norm 5
    bounded = bound_norm(big, 2.0)
    assert math.sqrt(sum(float(v.pow(2).sum()) for v in bounded.values())) == pytest.approx(2.0)
    assert bounded["a"].tolist() == pytest.approx([1.2, 0.0]) and bounded["b"].tolist() == pytest.approx([1.6])
    assert bound_norm(big, 10.0) is big


def test_a_robust_delta_is_everyones_so_claimed_weights_buy_nothing():
    messages = [(c, {"delta": d, "num_examples": n}) for c, (d, n) in enumerate(zip(deltas([1.0], [2.0], [900.0]), [1, 1, 10**6]))]
    out = robust_messages(messages, "median")
    assert [m["delta"]["w"].tolist() for _, m in out] == [[2.0]] * 3
    assert [m["num_examples"] for _, m in out] == [1, 1, 10**6]


def test_a_simulation_aggregates_robustly_and_client_level_dp_refuses_it(tmp_path):
    summary = run(tiny_config(federation={"rounds": 2, "aggregation": "median"}), tmp_path / "median", progress=False)
    assert 0.0 <= summary["global_test_accuracy"] <= 1.0
    with pytest.raises(Exception, match="robust aggregation would change the mechanism"):
        tiny_config(federation={"aggregation": "median"}, privacy={"level": "client", "noise_multiplier": 1.0})
    with pytest.raises(ConfigError, match="carry no update delta"):  # before any work (tests/runtime/test_robust_registry.py)
        Simulation.from_config(tiny_config(algorithm={"name": "local"}, federation={"rounds": 1, "aggregation": "median"}))
