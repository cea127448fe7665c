"""Silo-specific DP for the personalisation algorithms (spec 002 §1.3–1.4): Ditto's extra
local training and IFCA's private selections are planned and accounted per silo."""
from __future__ import annotations

import pytest

from fedveil.privacy import calibrate_noise, epsilon, report_noisy_max_release
from fedveil.runtime import Simulation
from tiny_runs import tiny_config

pytestmark = pytest.mark.usefixtures("skip_plots")

FULL = {"federation": {"rounds": 4, "clients_per_round": 5}, "checkpoint": {"every": 0}}
DP = {"level": "example", "epsilon": 3.0, "delta": 1e-5, "batch_sampling": "poisson"}


def _plan(algorithm: dict) -> Simulation:
    return Simulation.from_config(tiny_config(**FULL, algorithm=algorithm, privacy=DP))


def test_ditto_plans_and_spends_two_trainings_per_round(tmp_path):
    mrmtl, ditto = _plan({"name": "mr_mtl", "lam": 0.1}), _plan({"name": "ditto", "lam": 0.1})
    for cid in range(5):
        one, two = mrmtl.privacy.plan.clients[cid], ditto.privacy.plan.clients[cid]
        assert two.total_steps == 2 * one.total_steps
        # independent: the noise that spends epsilon = 3 in twice the steps
        want = calibrate_noise(3.0, 1e-5, one.sample_rate, 2 * one.total_steps)
        assert two.noise_multiplier == pytest.approx(want, rel=1e-3)
        assert two.noise_multiplier > one.noise_multiplier
    summary = ditto.run(tmp_path / "ditto")
    for cid, spent in enumerate(summary["epsilon_per_client"]):
        plan = ditto.privacy.plan.clients[cid]
        assert spent == pytest.approx(epsilon(plan.noise_multiplier, plan.sample_rate, plan.total_steps, 1e-5), rel=1e-9)
        assert spent <= 3.0 * (1 + 1e-9)


def test_ifca_selections_are_calibrated_into_the_budget_and_recorded(tmp_path):
    sim = _plan({"name": "ifca", "clusters": 2, "select_fraction": 0.5})
    baseline = _plan({"name": "mr_mtl", "lam": 0.0})
    selection = report_noisy_max_release(0.03 * 3.0, 2)  # 2 of the 4 rounds select
    for cid in range(5):
        plan, base = sim.privacy.plan.clients[cid], baseline.privacy.plan.clients[cid]
        assert plan.noise_multiplier > base.noise_multiplier  # room left for the selections
        want = calibrate_noise(3.0, 1e-5, plan.sample_rate, plan.total_steps, extra_events=[selection])
        assert plan.noise_multiplier == pytest.approx(want, rel=1e-3)
    summary = sim.run(tmp_path / "ifca")
    ledger = sim.privacy.ledger
    for cid in range(5):
        labels = [r.label for r in ledger.releases(cid)]
        assert labels.count("report_noisy_max") == 2
        assert summary["epsilon_per_client"][cid] == pytest.approx(3.0, rel=2e-3)
        assert summary["epsilon_per_client"][cid] <= 3.0 * (1 + 1e-9)


def test_ifca_under_a_fixed_noise_multiplier_needs_an_epsilon():
    from fedveil.config import ConfigError

    with pytest.raises(ConfigError, match="needs privacy.epsilon"):
        Simulation.from_config(tiny_config(
            **FULL, algorithm={"name": "ifca"}, privacy={"level": "example", "noise_multiplier": 1.0}
        ))
