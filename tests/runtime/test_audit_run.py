"""The runtime-level canary audit (``fedveil audit``): sound for honest runs, catches noise
forced off, serial and vectorized trials agree, and the accounted epsilon is what one trial ran."""
from __future__ import annotations

import math

import pytest
import torch
from tqdm import tqdm

from fedveil.config import ConfigError
from fedveil.privacy import epsilon
from fedveil.privacy.dp_sgd import private_gradient
from fedveil.privacy.randomness import NoiseSource
from fedveil.runtime.audit_run import SiloCanaryGame, audit_run, canary_input
from fedveil.runtime.simulation import Simulation
from tiny_runs import tiny_config

MLP = {"name": "mlp", "options": {"hidden": [16]}}
EXAMPLE = dict(model=MLP, federation={"rounds": 2, "clients_per_round": 5}, privacy={"level": "example", "epsilon": 1.0})
CLIENT = dict(
    model=MLP, data={"name": "digits", "num_clients": 20}, client={"epochs": 1, "batch_size": 16},
    federation={"rounds": 5, "clients_per_round": 5, "sampling": "poisson"}, privacy={"level": "client", "epsilon": 1.0},
)
QUIET = {"progress": False}


def no_bar():
    return tqdm(disable=True)


# ----------------------------------------------------------------------- example level


@pytest.mark.parametrize("executor", ["serial", "vectorized"])
def test_example_level_honest_run_is_consistent_and_noise_off_is_caught(executor):
    config = tiny_config(**EXAMPLE)
    trials = 60 if executor == "serial" else 100
    honest = audit_run(config, trials=trials, executor=executor, **QUIET)
    broken = audit_run(config, trials=trials, executor=executor, noise=False, **QUIET)
    for audit in (honest, broken):
        assert audit.result.accounted_epsilon == pytest.approx(1.0, rel=1e-3)  # both rounds: the whole budget
        assert audit.result.trials == trials and audit.rounds == 2
    assert honest.result.epsilon_lower_bound <= honest.result.accounted_epsilon and not honest.violated
    assert broken.result.epsilon_lower_bound > broken.result.accounted_epsilon and broken.violated
    assert broken.result.fpr == 0.0  # without noise a model without the canary never moves along it
    assert "VIOLATION" in broken.table() and "consistent" in honest.table()


@pytest.mark.parametrize("sampling", ["poisson", "shuffle"])
def test_serial_and_vectorized_trials_give_the_same_scores(sampling):
    config = tiny_config(
        model=MLP, client={"batch_size": 32, "momentum": 0.5}, federation={"rounds": 2, "clients_per_round": 5},
        privacy={"level": "example", "noise_multiplier": 1.0, "batch_sampling": sampling},
    )
    sim = Simulation.from_config(config)
    serial = SiloCanaryGame(sim, 1, None, "serial").scores(6, 3, no_bar())
    vectorized = SiloCanaryGame(sim, 1, None, "vectorized").scores(6, 3, no_bar())
    assert len(set(serial)) == 6  # fresh randomness per trial
    assert vectorized == pytest.approx(serial, rel=1e-4, abs=1e-6)


def test_accounted_epsilon_is_that_of_the_steps_one_trial_ran():
    config = tiny_config(**EXAMPLE)
    sim = Simulation.from_config(config)
    game = SiloCanaryGame(sim, 2, 1, "serial")
    game.scores(2, 0, no_bar())
    plan = sim.privacy.plan.clients[2]
    assert [dp.trainings for dp in game.ran] == [[plan.steps_per_training]]  # --rounds 1: one training
    expected = epsilon(plan.noise_multiplier, plan.batch_size / plan.num_train, plan.steps_per_training, 1e-5)
    assert game.accounted_epsilon() == pytest.approx(expected, rel=1e-9)
    assert expected < plan.planned_epsilon  # one of the silo's two rounds


def test_canary_lives_where_no_training_row_does():
    config = tiny_config(**EXAMPLE)
    sim = Simulation.from_config(config)
    game = SiloCanaryGame(sim, 0, None, "serial")
    x = sim.data.clients[0].train.x
    canary = game.data_in.x[-1]
    assert torch.all(x[:, canary != 0] == 0) and canary.abs().max() == x.abs().max()
    assert len(game.data_in) == len(game.data) + 1
    # the score direction leaves out every first-layer weight of a pixel some row uses
    unused = (canary != 0).flatten()
    assert torch.all(game.direction["fc1.weight"][:, ~unused] == 0)
    assert game.direction["fc1.weight"][:, unused].abs().sum() > 0
    assert math.isclose(sum(float(v.square().sum()) for v in game.direction.values()), 1.0, rel_tol=1e-5)


def test_canary_input_for_tokens_and_dense_features():
    tokens = torch.tensor([[0, 1, 1], [2, 0, 1]])
    x, what = canary_input(tokens, num_classes=4)
    assert x.tolist() == [3, 3, 3] and "token 3 (0 uses)" in what
    dense = torch.tensor([[1.0, -3.0], [2.0, 0.5]])
    x, what = canary_input(dense, num_classes=2)
    assert x.tolist() == [3.0, 0.0] and "least used" in what  # no unused coordinate: the least used one


def test_a_zero_noise_stream_gives_the_noiseless_gradient_and_a_seeded_one_does_not():
    model = torch.nn.Linear(3, 2)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])

    def grad(z: float, source: NoiseSource):
        stream = source.stream("dp-sgd", torch.Generator().manual_seed(0))
        return private_gradient(model, params, x, y, torch.nn.functional.cross_entropy, clip=1.0, noise_multiplier=z,
                                denominator=4, generator=stream).grad

    exact = grad(0.0, NoiseSource("seeded"))
    zero = grad(5.0, NoiseSource("zero"))
    assert all(torch.equal(zero[k], exact[k]) for k in exact)
    assert not torch.equal(grad(5.0, NoiseSource("seeded"))["weight"], exact["weight"])


def test_user_errors_are_config_errors():
    with pytest.raises(ConfigError, match="nothing to audit"):
        audit_run(tiny_config(), trials=2, **QUIET)
    with pytest.raises(ConfigError, match="--client"):
        audit_run(tiny_config(**EXAMPLE), client=7, trials=2, **QUIET)
    with pytest.raises(ConfigError, match="only 2 rounds"):
        audit_run(tiny_config(**EXAMPLE), rounds=3, trials=2, **QUIET)
    with pytest.raises(ConfigError, match="even"):
        audit_run(tiny_config(**EXAMPLE), trials=7, **QUIET)


# ------------------------------------------------------------------------ client level


@pytest.mark.parametrize("sampling", ["poisson", "fixed"])
def test_client_level_honest_run_is_consistent_and_noise_off_is_caught(sampling):
    config = tiny_config(**{**CLIENT, "federation": {**CLIENT["federation"], "sampling": sampling}})
    honest = audit_run(config, trials=200, **QUIET)
    broken = audit_run(config, trials=200, noise=False, **QUIET)
    planned = Simulation.from_config(config).privacy.plan.planned_epsilon
    for audit in (honest, broken):
        assert audit.result.accounted_epsilon == pytest.approx(planned, rel=1e-9) and audit.steps == 5
        assert "fc1.weight" in audit.canary  # a first-layer weight of a pixel no client uses
    assert honest.result.epsilon_lower_bound <= honest.result.accounted_epsilon and not honest.violated
    assert broken.result.epsilon_lower_bound > broken.result.accounted_epsilon and broken.violated


def test_client_level_fewer_rounds_and_adaptive_clipping():
    privacy = {"level": "client", "noise_multiplier": 1.5, "adaptive_clip": True, "clip_count_noise": 2.0}
    config = tiny_config(**{**CLIENT, "privacy": privacy})
    audit = audit_run(config, trials=40, rounds=2, **QUIET)
    assert audit.rounds == 2 and audit.executor == "none"
    assert audit.result.accounted_epsilon == pytest.approx(epsilon(1.5, 5 / 20, 2, 1e-5), rel=1e-9)
    assert not audit.violated
