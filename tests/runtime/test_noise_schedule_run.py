"""Noise schedules inside federated runs, and the PLD accountant in a run.

Independent numbers: the round shapes come from the chapter-2 formulas, the epsilons
from composing the rounds' ``dp_accounting`` events directly, and the noise actually
added is measured from the model's movement when the clients' updates are ~0.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant

from fedveil.config import ConfigError
from fedveil.privacy import DEFAULT_ORDERS, epsilon
from fedveil.privacy.schedules import exp_decay, gd_dynamic_sigmas
from fedveil.runtime import Simulation, run
from tiny_runs import merge, read_json, rows_of, tiny_config

pytestmark = pytest.mark.usefixtures("skip_plots")

DELTA = 1e-5


def direct_rdp_epsilon(zs, q, steps_per_round, delta=DELTA) -> float:
    """Compose one PoissonSampledDpEvent per round with dp_accounting's accountant directly."""
    acc = rdp_privacy_accountant.RdpAccountant(orders=list(DEFAULT_ORDERS))
    for z in zs:
        acc.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(float(z))), steps_per_round)
    return float(acc.get_epsilon(delta))


def client_schedule_config(schedule: dict, **extra):
    base = {
        "privacy": {"level": "client", "delta": DELTA, "epsilon": 2.0, "noise_schedule": schedule},
        "data": {"num_clients": 20},
        "federation": {"rounds": 4, "clients_per_round": 5, "sampling": "poisson"},
    }
    return tiny_config(**merge(base, extra))


def test_client_level_dynamic_schedule_spends_the_budget_with_the_chapter_2_shape(tmp_path):
    config = client_schedule_config({"name": "dynamic", "gamma": 0.5})
    out = tmp_path / "run"
    summary = run(config, out, progress=False)
    shape = gd_dynamic_sigmas(1.0, 4, 0.5)  # 4 rounds <= 8 levels: no quantisation
    np.testing.assert_allclose(summary["noise_shape"], shape / shape.min(), rtol=1e-12)
    assert summary["noise_schedule"] == "dynamic"
    zs = summary["noise_multiplier"] * np.asarray(summary["noise_shape"])
    rows = rows_of(out)
    np.testing.assert_allclose([r["noise_multiplier"] for r in rows], zs, rtol=1e-12)
    assert zs[0] > zs[-1]  # decaying noise
    for r, row in enumerate(rows):
        assert row["epsilon"] == pytest.approx(direct_rdp_epsilon(zs[: r + 1], 5 / 20, 1), rel=1e-9)
    assert 0.99 * 2.0 <= summary["epsilon"] <= 2.0
    assert summary["planned_epsilon"] == pytest.approx(summary["epsilon"], rel=1e-9)


def test_client_level_noise_added_follows_the_schedule():
    """Clients barely move (lr 1e-9), so the model's change in round r is the server's noise,
    N(0, (z_r C / m)^2) per coordinate; its measured std follows the schedule."""
    config = client_schedule_config(
        {"name": "exp_decay", "k": 0.7}, client={"lr": 1e-9}, privacy={"clip": 0.5},
        federation={"sampling": "fixed", "rounds": 4},
    )
    sim = Simulation.from_config(config)
    state = sim.fresh_state()
    z_scale = sim.privacy.plan.population_noise
    stds = []
    for r in range(config.federation.rounds):
        before = {k: v.clone() for k, v in state["server"]["params"].items()}
        sim.train_round(state, r)
        moved = torch.cat([(state["server"]["params"][k] - before[k]).flatten() for k in before])
        stds.append(float(moved.std()))
    expected = z_scale * np.asarray(sim.privacy.plan.shape) * 0.5 / 5
    decay = exp_decay(np.arange(4), 1.0, 0.7)
    np.testing.assert_allclose(expected / expected[-1], decay / decay[-1], rtol=1e-12)
    # 650 coordinates: the std estimate is within ~3% (1 sd); allow 12%
    np.testing.assert_allclose(stds, expected, rtol=0.12)


def test_example_level_schedule_per_client(tmp_path):
    """Full participation, shuffled batches: client k in round r uses z_k * shape[r]; its epsilon
    is one Gaussian per epoch per round, composed over the rounds (zero-out relation)."""
    config = tiny_config(
        privacy={"level": "example", "delta": DELTA, "epsilon": 1.0, "batch_sampling": "shuffle",
                 "noise_schedule": {"name": "exp_decay", "k": 0.3}},
        data={"num_clients": 3}, federation={"rounds": 3, "clients_per_round": 3},
    )
    out = tmp_path / "run"
    summary = run(config, out, progress=False)
    decay = exp_decay(np.arange(3), 1.0, 0.3)
    np.testing.assert_allclose(summary["noise_shape"], decay / decay.min(), rtol=1e-12)
    for k in range(3):
        zs = summary["noise_multiplier_per_client"][k] * np.asarray(summary["noise_shape"])
        epochs = config.client.epochs  # each round: `epochs` fresh permutations, one Gaussian each
        z_eff = float(np.sum(epochs / zs**2) ** -0.5)
        want = epsilon(z_eff, 1.0, 1, DELTA, "full")  # Gaussians compose to one Gaussian
        assert summary["epsilon_per_client"][k] == pytest.approx(want, rel=1e-9), k
        assert 0.99 <= summary["epsilon_per_client"][k] <= 1.0


def test_schedule_with_fixed_noise_is_refused():
    with pytest.raises(ConfigError, match="drop noise_multiplier"):
        client_schedule_config({"name": "exp_decay"}, privacy={"epsilon": None, "noise_multiplier": 1.0})


def test_unplannable_schedule_is_refused():
    with pytest.raises(ConfigError, match="cannot be planned"):
        client_schedule_config({"name": "validation", "k": 0.5})


def test_pld_accountant_in_a_run(tmp_path):
    z = 1.5
    config = client_schedule_config(
        {"name": "constant"}, privacy={"accountant": "pld", "epsilon": None, "noise_multiplier": z}
    )
    out = tmp_path / "run"
    summary = run(config, out, progress=False)
    rounds, q = config.federation.rounds, 5 / 20
    assert summary["epsilon"] == pytest.approx(epsilon(z, q, rounds, DELTA, accountant="pld"), rel=1e-9)
    # PLD is tighter than RDP for the same mechanism
    assert summary["epsilon"] < epsilon(z, q, rounds, DELTA, accountant="rdp")
    for row in rows_of(out):
        assert row["epsilon"] == pytest.approx(epsilon(z, q, row["round"], DELTA, accountant="pld"), rel=1e-9)


def test_pld_refuses_fixed_size_cohorts():
    config = client_schedule_config(
        {"name": "constant"}, privacy={"accountant": "pld", "epsilon": None, "noise_multiplier": 1.5},
        federation={"sampling": "fixed"},
    )
    with pytest.raises(ConfigError, match="privacy: the population"):
        Simulation.from_config(config)
