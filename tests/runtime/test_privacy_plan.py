"""The run's privacy plan is pure calibration: frozen, the same from the same config, and
one plan can start any number of independent runs' ledgers."""
from __future__ import annotations

import dataclasses

import pytest

from fedveil.privacy import Sampling, calibrate_noise, gaussian_steps_release
from fedveil.privacy.randomness import NoiseSource
from fedveil.runtime import Simulation
from fedveil.runtime.privacy_plan import POPULATION
from fedveil.runtime.run_privacy import RunPrivacy
from tiny_runs import tiny_config

FULL = {"federation": {"rounds": 3, "clients_per_round": 4}, "checkpoint": {"every": 0}}
EXAMPLE = {"level": "example", "epsilon": 2.0, "delta": 1e-5, "batch_sampling": "poisson"}
CLIENT = {"level": "client", "epsilon": 2.0, "delta": 1e-5, "clip": 0.5}


def test_the_plan_is_frozen_and_recalibrates_identically():
    a = Simulation.from_config(tiny_config(**FULL, privacy=EXAMPLE)).privacy.plan
    b = Simulation.from_config(tiny_config(**FULL, privacy=EXAMPLE)).privacy.plan
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.num_clients = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.clients[0].noise_multiplier = 0.0
    assert a.clients == b.clients
    for cid, plan in a.clients.items():  # independent: the noise that spends the budget in the planned steps
        assert plan.noise_multiplier == pytest.approx(calibrate_noise(2.0, 1e-5, plan.sample_rate, plan.total_steps),
                                                      rel=1e-3)


def test_client_level_plan_states_its_release_per_round_without_a_ledger():
    sim = Simulation.from_config(tiny_config(**FULL, privacy=CLIENT))
    plan = sim.privacy.plan
    population = plan.population
    assert population is not None and plan.clients == {} and plan.distributed is None
    assert population.sample_rate == 4 / plan.num_clients and population.cohort == 4
    assert population.sampling == "fixed"  # the default cohorts: m clients drawn without replacement
    fixed = Sampling("fixed", plan.num_clients)
    assert plan.sampling(plan.num_clients) == fixed
    want = calibrate_noise(2.0, 1e-5, population.sample_rate, 3, fixed)
    assert population.noise_multiplier == pytest.approx(want, rel=1e-3)
    for r in range(3):
        assert plan.planned_round(r, [0, 1]) == {
            POPULATION: [gaussian_steps_release(population.noise_multiplier, population.sample_rate, 1, fixed)]
        }


def test_one_plan_starts_independent_ledgers():
    plan = Simulation.from_config(tiny_config(**FULL, privacy=EXAMPLE)).privacy.plan
    first, second = RunPrivacy.start(plan, NoiseSource()), RunPrivacy.start(plan, NoiseSource())
    dp = first.task_dp(0, 0)
    first.record_client(0, plan.clients[0].num_train, dp, [plan.clients[0].steps_per_training])
    assert first.spent()[0] > 0 and second.spent() == {}
    assert first.plan is second.plan
