"""Regression tests for the accounting holes of issue 12, each against values computed here
with ``dp_accounting`` directly from what the mechanisms did (not from fedveil's plan):

1. several trainings per round under shuffled batches: one release per training;
3. adaptive clipping: the update and the shifted clip count cost exactly the Gaussian the
   ledger records, for Poisson and fixed-size cohorts;
5. the ledger checks itself after every round and stops a run that over-spends or
   under-records (items 1 and 3 as they were would have tripped it);
and the tests a mutation review found missing (shuffled steps not a multiple of an epoch,
``reg_in_clip`` changing MR-MTL and Ditto, two clients drawing different batches and noise).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant

import fedveil.privacy.client_dp as client_dp
from fedveil.cli.main import main
from fedveil.config import ConfigError
from fedveil.privacy.composition import DEFAULT_ORDERS
from fedveil.privacy.relations import Sampling
from fedveil.privacy.ledger_check import PrivacyCheckError
from fedveil.runtime import Simulation
from fedveil.runtime.run_privacy import RunPrivacy
from fedveil.runtime.sampling import client_schedule
from tiny_runs import tiny_config

pytestmark = pytest.mark.usefixtures("skip_plots")

DELTA = 1e-5
QUICKSTART = str(Path(__file__).resolve().parents[2] / "examples" / "quickstart.toml")


def rdp_epsilon(event: dp_event.DpEvent, count: int, relation=NeighboringRelation.ADD_OR_REMOVE_ONE) -> float:
    """dp_accounting's RDP epsilon of ``count`` compositions of ``event`` (same orders as fedveil)."""
    accountant = rdp_privacy_accountant.RdpAccountant(list(DEFAULT_ORDERS), relation)
    accountant.compose(event, count)
    return accountant.get_epsilon(DELTA)


def participations(config) -> list[int]:
    fed = config.federation
    counts = [0] * config.data.num_clients
    for cohort in client_schedule(config.data.num_clients, fed.clients_per_round, fed.rounds, fed.sampling, config.seed):
        for cid in cohort:
            counts[int(cid)] += 1
    return counts


# ------------------------------------------------------------- item 1: trainings under shuffling

def shuffled_epochs_per_training(n: int, batch: int, steps: int) -> int:
    """Permutations one training draws: ``steps`` consecutive batches of an epoch of n // B."""
    return -(-steps // (n // min(batch, n)))


@pytest.mark.parametrize("algorithm, steps, batch", [("ditto", 2, 32), ("fedavg", 5, 64), ("ditto", 5, 64)])
def test_shuffled_trainings_are_each_one_release(tmp_path, algorithm, steps, batch):
    """Every ``train`` call draws fresh permutations, so each training costs its own un-amplified
    Gaussians (one per epoch it touches, a partial epoch in full); ``steps`` = 5 is not a multiple
    of an epoch (n // 64 = 3 or 4 here). The run spends at most its budget."""
    config = tiny_config(
        algorithm={"name": algorithm}, client={"steps": steps, "batch_size": batch},
        federation={"rounds": 3, "clients_per_round": 3},
        privacy={"level": "example", "epsilon": 4.0, "delta": DELTA, "batch_sampling": "shuffle"},
    )
    sim = Simulation.from_config(config)
    trainings = 2 if algorithm == "ditto" else 1
    summary = sim.run(tmp_path / "run")
    ragged = False
    for cid, rounds in enumerate(participations(config)):
        n = sim.data.clients[cid].num_train
        ragged |= steps % (n // min(batch, n)) != 0
        z = summary["noise_multiplier_per_client"][cid]
        gaussians = rounds * trainings * shuffled_epochs_per_training(n, batch, steps)
        want = rdp_epsilon(dp_event.GaussianDpEvent(z), gaussians, NeighboringRelation.REPLACE_SPECIAL) if gaussians else 0.0
        assert summary["epsilon_per_client"][cid] == pytest.approx(want, rel=1e-9)
        assert want <= 4.0 * (1 + 1e-9)
    assert ragged or steps == 2


def test_issue_repro_ditto_shuffle_reports_the_four_gaussians(tmp_path, capsys):
    out = tmp_path / "ditto"
    code = main(["run", QUICKSTART, "algorithm.name=ditto", "federation.rounds=2", "client.steps=2",
                 "privacy.batch_sampling=shuffle", "privacy.epsilon=8", "--out", str(out), "--quiet"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    for z, spent in zip(summary["noise_multiplier_per_client"], summary["epsilon_per_client"]):
        # 2 rounds x 2 trainings x 1 epoch each (2 steps < n // 32): four Gaussians
        four = rdp_epsilon(dp_event.GaussianDpEvent(z), 4, NeighboringRelation.REPLACE_SPECIAL)
        assert spent == pytest.approx(four, rel=1e-9)
        assert spent == pytest.approx(8.0, rel=1e-3)  # was 5.33: the two trainings recorded as one


# ------------------------------------------------------------- item 3: adaptive clipping

def combined_z(summary: dict, sampling: str) -> float:
    """The one Gaussian (std / C of the update, the accountant's convention) the update noise
    and the count noise amount to, from the figures the run wrote: two Gaussians with
    sensitivity/std ratios r_1 and r_2 are one with ratio sqrt(r_1^2 + r_2^2)."""
    update_sens = {"poisson": 1.0, "fixed": 2.0}[sampling]  # C (add/remove) or 2C (replace one)
    r_update = update_sens / summary["update_noise_multiplier"]
    r_count = summary["clip_count_sensitivity"] / summary["clip_count_noise"]
    return update_sens / math.hypot(r_update, r_count)


def test_issue_repro_adaptive_clip_with_poisson_cohorts(tmp_path):
    out = tmp_path / "adaptive"
    code = main(["run", QUICKSTART, "data.num_clients=20", "federation.clients_per_round=5",
                 "federation.sampling=poisson", "federation.rounds=4", "privacy.level=client", "privacy.epsilon=8",
                 "privacy.adaptive_clip=true", "privacy.clip_count_noise=1.0", "--out", str(out), "--quiet"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["clip_count_noise"] == 1.0 and summary["clip_count_sensitivity"] == 0.5
    z = combined_z(summary, "poisson")
    true_cost = rdp_epsilon(dp_event.PoissonSampledDpEvent(5 / 20, dp_event.GaussianDpEvent(z)), 4)
    assert summary["epsilon"] == pytest.approx(true_cost, rel=1e-6)
    assert true_cost <= 8.0 * (1 + 1e-6)
    # the unshifted count (sensitivity 1) with the same noise cost about 10.8, not the 8 reported then
    old = 1.0 / math.hypot(1.0 / summary["update_noise_multiplier"], 1.0 / summary["clip_count_noise"])
    assert rdp_epsilon(dp_event.PoissonSampledDpEvent(5 / 20, dp_event.GaussianDpEvent(old)), 4) > 10.0


def test_adaptive_clip_with_fixed_cohorts_costs_the_accounted_gaussian(tmp_path):
    """Replace-one: the clipped sum moves by 2C and the (shifted) count by 1."""
    config = tiny_config(
        data={"num_clients": 20}, federation={"rounds": 4, "clients_per_round": 5, "sampling": "fixed"},
        privacy={"level": "client", "epsilon": 8.0, "delta": DELTA, "adaptive_clip": True, "clip_count_noise": 1.0},
    )
    summary = Simulation.from_config(config).run(tmp_path / "fixed")
    assert summary["clip_count_sensitivity"] == 1.0
    z_replace = combined_z(summary, "fixed") / 2.0  # std / (2C): the replace-one noise multiplier
    event = dp_event.SampledWithoutReplacementDpEvent(20, 5, dp_event.GaussianDpEvent(z_replace))
    true_cost = rdp_epsilon(event, 4, NeighboringRelation.REPLACE_ONE)
    assert summary["epsilon"] == pytest.approx(true_cost, rel=1e-6)
    assert true_cost <= 8.0 * (1 + 1e-6)


# ------------------------------------------------------------- item 5: the ledger checks itself

EXAMPLE = {"level": "example", "epsilon": 3.0, "delta": DELTA}


def test_a_mechanism_with_less_noise_than_planned_stops_the_run(tmp_path, monkeypatch):
    planned = RunPrivacy.task_dp

    def under_noised(self, cid, round_idx):
        dp = planned(self, cid, round_idx)
        dp.noise_multiplier *= 0.9  # a bug that adds less noise than the plan calibrated
        return dp

    monkeypatch.setattr(RunPrivacy, "task_dp", under_noised)
    sim = Simulation.from_config(tiny_config(privacy=EXAMPLE))
    with pytest.raises(PrivacyCheckError, match=r"client \d+: ledger epsilon=[\d.]+, plan epsilon=[\d.]+ .*over-spent"):
        sim.run(tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoint.pt").exists()  # stopped in round 1, nothing kept


def test_two_trainings_recorded_as_one_release_stop_the_run(tmp_path, monkeypatch):
    """Item 1 as it was: Ditto's two shuffled trainings merged into one release."""

    def merged(self, cid, n, dp, trainings):
        self.ledger.record_gaussian_steps(cid, dp.noise_multiplier, dp.batch_size / n, sum(trainings),
                                          Sampling(dp.sampling, n))

    monkeypatch.setattr(RunPrivacy, "record_client", merged)
    sim = Simulation.from_config(tiny_config(
        algorithm={"name": "ditto"}, client={"steps": 2}, privacy={**EXAMPLE, "batch_sampling": "shuffle"},
    ))
    with pytest.raises(PrivacyCheckError, match="under-recorded"):
        sim.run(tmp_path / "run")


def test_an_unshifted_clip_count_stops_the_run(tmp_path, monkeypatch):
    """Item 3 as it was: a count of sensitivity 1 under add/remove costs more than planned."""
    monkeypatch.setitem(client_dp.COUNT_SENSITIVITY, "poisson", 1.0)
    sim = Simulation.from_config(tiny_config(
        data={"num_clients": 20}, federation={"rounds": 4, "clients_per_round": 5, "sampling": "poisson"},
        privacy={"level": "client", "epsilon": 8.0, "delta": DELTA, "adaptive_clip": True, "clip_count_noise": 1.0},
    ))
    with pytest.raises(PrivacyCheckError, match="client population.*over-spent"):
        sim.run(tmp_path / "run")


def test_the_ledger_check_costs_nothing_noticeable_and_passes_honest_runs(tmp_path):
    """Honest runs of every privacy path pass the check (IFCA's selections included)."""
    cases = [
        dict(algorithm={"name": "ifca", "clusters": 2, "select_fraction": 0.5}, privacy=EXAMPLE),
        dict(algorithm={"name": "ditto"}, privacy={**EXAMPLE, "batch_sampling": "shuffle"}),
        dict(federation={"sampling": "poisson"}, privacy=EXAMPLE),
        dict(data={"num_clients": 20}, federation={"clients_per_round": 5, "sampling": "fixed"},
             privacy={"level": "client", "epsilon": 4.0, "delta": DELTA}),
    ]
    for i, case in enumerate(cases):
        summary = Simulation.from_config(tiny_config(**case)).run(tmp_path / str(i))
        assert summary["epsilon"] > 0


# ------------------------------------------------------------- mutation-review tests

@pytest.mark.parametrize("algorithm", ["mr_mtl", "ditto"])
def test_reg_in_clip_changes_the_private_result_only(algorithm):
    """Inside the clip the regulariser shares each example's clip; outside it is post-processing.
    Under DP the two differ; without DP they are the same computation."""

    def trained(reg_in_clip: bool, privacy: dict) -> list[dict]:
        """Every silo's own model after two rounds."""
        sim = Simulation.from_config(tiny_config(
            algorithm={"name": algorithm, "lam": 1.0, "reg_in_clip": reg_in_clip},
            federation={"rounds": 2, "clients_per_round": 5}, privacy=privacy,
        ))
        state = sim.fresh_state()
        for r in range(2):
            sim.train_round(state, r)
        key = "personal" if algorithm == "ditto" else "params"
        return [state["clients"].get(c)[key] for c in range(5)]

    def same(a: list[dict], b: list[dict]) -> bool:
        return all(torch.equal(x[k], y[k]) for x, y in zip(a, b) for k in x)

    dp = {"level": "example", "noise_multiplier": 0.5, "clip": 0.1, "delta": DELTA}
    assert not same(trained(True, dp), trained(False, dp))
    assert same(trained(True, {"level": "none"}), trained(False, {"level": "none"}))


@pytest.mark.parametrize("executor", ["serial", "vectorized"])
@pytest.mark.parametrize("privacy", [EXAMPLE, {"level": "none"}])
def test_two_clients_of_a_round_draw_different_batches_and_noise(executor, privacy):
    """Two clients holding the *same* rows and starting from the same model must still end the
    round with different models: their batches and noise come from their own streams."""
    config = tiny_config(executor=executor, data={"num_clients": 2}, federation={"rounds": 1, "clients_per_round": 2},
                         client={"batch_size": 16, "steps": 3}, privacy=privacy)
    sim = Simulation.from_config(config)
    sim.data.clients[1] = sim.data.clients[0]
    sizes = dict(enumerate(sim.data.train_sizes().tolist()))
    sim.privacy = RunPrivacy.from_config(config.privacy, 2, sizes, sim.trainer, sim.model, sim.algorithm, sim.schedule,
                                         "fixed", 2)
    state = sim.fresh_state()
    jobs = [(sim.task(c, 0), None) for c in (0, 1)]
    first, second = (r.message["delta"] for r in sim.executor.run_cohort(sim.algorithm, state["server"], jobs))
    assert all(not torch.allclose(first[k], second[k]) for k in first)


def test_cli_stops_a_run_that_fails_the_ledger_check_with_one_line(tmp_path, monkeypatch, capsys):
    planned = RunPrivacy.task_dp

    def under_noised(self, cid, round_idx):
        dp = planned(self, cid, round_idx)
        dp.noise_multiplier *= 0.5
        return dp

    monkeypatch.setattr(RunPrivacy, "task_dp", under_noised)
    code = main(["run", "--dataset", "digits", "model.name=linear", "federation.rounds=2", "privacy.level=example",
                 "privacy.epsilon=2", "--out", str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3 and len(err) == 1
    assert err[0].startswith("fedveil: privacy check failed for client ") and "over-spent" in err[0]


def test_audit_flags_client_and_executor_at_client_level():
    from fedveil.runtime.audit_run import audit_run

    config = tiny_config(data={"num_clients": 20}, federation={"clients_per_round": 5},
                         privacy={"level": "client", "epsilon": 1.0, "delta": DELTA})
    with pytest.raises(ConfigError, match="--client and --executor apply to example level"):
        audit_run(config, trials=2, client=1, progress=False)


@pytest.mark.parametrize("sampling", ["poisson", "shuffle"])
@pytest.mark.parametrize("algorithm", [{"name": "ditto"}, {"name": "ifca", "clusters": 2, "select_fraction": 0.5}])
def test_the_rounds_planned_releases_compose_to_the_calibrated_epsilon(sampling, algorithm):
    """What the check expects round by round is what the noise was calibrated for."""
    config = tiny_config(algorithm=algorithm, client={"steps": 5, "batch_size": 64},
                         privacy={**EXAMPLE, "batch_sampling": sampling})
    sim = Simulation.from_config(config)
    per_subject: dict = {}
    for r, cohort in enumerate(sim.schedule):
        for subject, releases in sim.privacy.plan.planned_round(r, [int(c) for c in cohort]).items():
            per_subject.setdefault(subject, []).extend(releases)
    for cid, plan in sim.privacy.plan.clients.items():
        composed = sim.privacy.ledger.epsilon_of(per_subject.get(cid, []), DELTA)
        assert composed == pytest.approx(plan.planned_epsilon, rel=1e-9)


def test_adaptive_clip_count_noise_is_checked_against_the_largest_scheduled_noise():
    """A decaying noise schedule raises z above its shape-1 value in early rounds; the count
    noise must exceed z/2 in every round, or the round's update noise is undefined mid-run."""
    base = dict(data={"num_clients": 20}, federation={"rounds": 6, "clients_per_round": 5, "sampling": "poisson"})
    privacy = {"level": "client", "epsilon": 3.0, "delta": DELTA, "adaptive_clip": True,
               "noise_schedule": {"name": "dynamic", "gamma": 0.8}}
    sim = Simulation.from_config(tiny_config(**base, privacy={**privacy, "clip_count_noise": 100.0}))
    z, peak = sim.privacy.plan.population_noise, float(sim.privacy.plan.shape.max())
    assert peak > 1.2
    between = 0.5 * (z / 2 + z * peak / 2)  # enough for the shape-1 rounds, not for the first
    with pytest.raises(ConfigError, match="clip_count_noise"):
        Simulation.from_config(tiny_config(**base, privacy={**privacy, "clip_count_noise": between}))
