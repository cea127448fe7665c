"""Privacy in the round loop, checked against numbers worked out independently of the plan.

Example level: every client's epsilon is recomputed here with :func:`fedveil.privacy.epsilon`
from its training-set size (``partition.json``), ``B_k = min(B, n_k)``, ``q_k = B_k / n_k``,
the steps per round of the batch sampler and the participations counted from the client
schedule. Client level: the population's epsilon is that of ``rounds`` steps of the
Gaussian mechanism sub-sampled at ``q = m / N``. Calibration is slow for small noise, so the
budgets here are small (large noise) and runs are short.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fedveil.cli.main import main
from fedveil.config import ClientConfig, ConfigError
from fedveil.data.arrays import ArrayDataset
from fedveil.models import build_model
from fedveil.privacy import Sampling, epsilon
from fedveil.privacy.dp_sgd import ExampleDP
from fedveil.runtime import Simulation, run
from fedveil.training.local import LocalTrainer, task_loss
from fedveil.runtime.sampling import client_schedule
from fedveil.runtime.dataset import build_dataset
from tiny_runs import KillAfterRound, Killed, assert_same_state, load_checkpoint, merge, read_json, rows_of, tiny_config, without_wall_clock

pytestmark = pytest.mark.usefixtures("skip_plots")

DELTA = 1e-5


def example_config(**sections):
    return tiny_config(**merge({"privacy": {"level": "example", "delta": DELTA}}, sections))


def client_config(**sections):
    base = {
        "privacy": {"level": "client", "delta": DELTA},
        "data": {"num_clients": 20},
        "federation": {"rounds": 4, "clients_per_round": 5},
    }
    return tiny_config(**merge(base, sections))


def participations(config, through_round: int | None = None) -> np.ndarray:
    """How often each client trains, counted from the schedule the seed fixes."""
    fed = config.federation
    schedule = client_schedule(config.data.num_clients, fed.clients_per_round, fed.rounds, fed.sampling, config.seed)
    counts = np.zeros(config.data.num_clients, dtype=int)
    for cohort in schedule[:through_round]:
        counts[cohort] += 1
    return counts


def client_accounting(config, n: int) -> tuple[float, int, Sampling]:
    """``q_k``, DP-SGD steps per round and the sampling of a client with ``n`` rows."""
    b = min(config.client.batch_size, n)
    if config.privacy.batch_sampling == "poisson":
        return b / n, config.client.epochs * math.ceil(n / b), Sampling("poisson")
    return b / n, config.client.epochs * (n // b), Sampling("shuffle", n)


def expected_epsilons(config, sizes, noise, through_round: int | None = None) -> list[float]:
    """Each client's epsilon after ``through_round`` rounds (all rounds by default)."""
    counts = participations(config, through_round)
    out = []
    for k, n in enumerate(sizes):
        q, per_round, sampling = client_accounting(config, n)
        steps = int(counts[k]) * per_round
        out.append(epsilon(noise[k], q, steps, config.privacy.delta, sampling) if steps else 0.0)
    return out


def check_example_run(config, out: Path, summary: dict, budgets: list[float] | None) -> np.ndarray:
    """Summary and metrics of an example-level run against the independent numbers."""
    sizes = build_dataset(config.data, config.seed).train_sizes().tolist()  # a DP run withholds them
    counts = participations(config)
    noise = summary["noise_multiplier_per_client"]
    want = expected_epsilons(config, sizes, noise)
    got = summary["epsilon_per_client"]
    assert len(got) == config.data.num_clients
    for k in range(config.data.num_clients):
        if counts[k] == 0:
            assert got[k] == 0.0
            continue
        assert got[k] == pytest.approx(want[k], rel=1e-9, abs=1e-12), f"client {k}"
        if budgets is not None:
            assert 0.99 * budgets[k] <= got[k] <= budgets[k], f"client {k}: {got[k]} vs budget {budgets[k]}"
    assert summary["epsilon"] == pytest.approx(max(got))
    assert summary["privacy_level"] == "example" and summary["delta"] == config.privacy.delta

    rows = rows_of(out)
    assert [r["round"] for r in rows] == list(range(1, config.federation.rounds + 1))
    eps_rows = [r["epsilon"] for r in rows]
    assert all(b >= a for a, b in zip(eps_rows, eps_rows[1:])), eps_rows
    per_client = np.array([r["epsilon_per_client"] for r in rows])
    assert per_client.shape == (len(rows), config.data.num_clients)
    assert (np.diff(per_client, axis=0) >= 0).all()
    for row in rows:
        assert row["epsilon"] == pytest.approx(max(row["epsilon_per_client"]))
    assert rows[-1]["epsilon_per_client"] == pytest.approx(got)
    assert rows[-1]["epsilon"] == pytest.approx(summary["epsilon"])
    return counts


# ----------------------------------------------------------------- example level, calibrated

EXAMPLE_CASES = {
    # Poisson batches, Poisson cohorts (q = 3/5): clients take part a varying number of times
    "poisson-batches": dict(privacy={"batch_sampling": "poisson"}, federation={"sampling": "poisson", "rounds": 3}),
    # shuffled epochs (n // B steps each), two local epochs
    "shuffle-batches": dict(
        privacy={"batch_sampling": "shuffle"}, client={"epochs": 2}, federation={"sampling": "poisson", "rounds": 4}
    ),
    # fixed-size cohorts of 2 out of 4: some clients sit out rounds
    "poisson-fixed-cohorts": dict(
        privacy={"batch_sampling": "poisson"}, data={"num_clients": 4},
        federation={"sampling": "fixed", "clients_per_round": 2, "rounds": 3},
    ),
    "shuffle-fixed-cohorts": dict(
        privacy={"batch_sampling": "shuffle"}, client={"batch_size": 50},
        federation={"sampling": "fixed", "clients_per_round": 2, "rounds": 5},
    ),
}


@pytest.mark.parametrize("case", list(EXAMPLE_CASES))
def test_example_level_calibrated_spends_each_clients_budget(tmp_path, case):
    budget = 0.5
    config = example_config(**merge(EXAMPLE_CASES[case], {"privacy": {"epsilon": budget}}))
    out = tmp_path / "run"
    summary = run(config, out, progress=False)
    counts = check_example_run(config, out, summary, [budget] * config.data.num_clients)
    assert counts.sum() > 0
    # the cases only test what they claim if participation really differs between clients
    assert len(set(counts.tolist())) > 1, counts
    # calibrated noise: the plan is what was spent
    assert summary["planned_epsilon_per_client"] == pytest.approx(summary["epsilon_per_client"], rel=1e-9, abs=1e-12)


def test_example_level_epsilon_of_every_round(tmp_path):
    """Row by row: after round r each client has spent the epsilon of its participations so far."""
    config = example_config(**merge(EXAMPLE_CASES["shuffle-fixed-cohorts"], {"privacy": {"epsilon": 1.0}}))
    out = tmp_path / "run"
    summary = run(config, out, progress=False)
    sizes = build_dataset(config.data, config.seed).train_sizes().tolist()  # a DP run withholds them
    noise = summary["noise_multiplier_per_client"]
    for row in rows_of(out):
        want = expected_epsilons(config, sizes, noise, through_round=row["round"])
        assert row["epsilon_per_client"] == pytest.approx(want, rel=1e-9, abs=1e-12), row["round"]


def test_client_that_never_trains_spends_nothing(tmp_path):
    config = example_config(
        privacy={"epsilon": 1.0, "batch_sampling": "shuffle"}, federation={"rounds": 2, "clients_per_round": 2}
    )
    counts = participations(config)
    assert (counts == 0).any(), "pick a schedule in which some client never trains"
    out = tmp_path / "run"
    summary = run(config, out, progress=False)
    check_example_run(config, out, summary, [1.0] * config.data.num_clients)
    for k in np.flatnonzero(counts == 0):
        assert summary["epsilon_per_client"][k] == 0.0
        assert summary["planned_epsilon_per_client"][k] == 0.0


def test_per_client_budgets(tmp_path):
    budgets = [0.5, 1.0, 2.0, 4.0, 8.0]
    config = example_config(
        privacy={"client_epsilons": budgets, "batch_sampling": "shuffle"},
        federation={"sampling": "fixed", "clients_per_round": 4, "rounds": 3},
    )
    assert (participations(config) > 0).all()
    out = tmp_path / "run"
    summary = run(config, out, progress=False)
    check_example_run(config, out, summary, budgets)
    # each client ends at its own budget, so more budget means less noise
    noise = summary["noise_multiplier_per_client"]
    assert all(a > b for a, b in zip(noise, noise[1:])), noise


# --------------------------------------------------------------- fixed noise multiplier


def test_fixed_noise_over_budget_is_refused_before_anything_is_written(tmp_path):
    config = example_config(privacy={"noise_multiplier": 0.5, "epsilon": 1.0})
    with pytest.raises(ConfigError, match=r"spends epsilon=.* > budget 1"):
        Simulation.from_config(config)
    out = tmp_path / "run"
    with pytest.raises(ConfigError):
        run(config, out, progress=False)
    assert not out.exists()


def test_fixed_noise_over_budget_client_level_is_refused(tmp_path):
    config = client_config(privacy={"noise_multiplier": 0.5, "epsilon": 1.0})
    with pytest.raises(ConfigError, match=r"the population.*spends epsilon"):
        Simulation.from_config(config)


def test_cli_refuses_over_budget_plan(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    code = main([
        "run", "model.name=linear", "data.num_clients=4", "federation.rounds=2", "federation.clients_per_round=2",
        'privacy.level="example"', "privacy.noise_multiplier=0.5", "privacy.epsilon=1.0",
        "--out", str(out), "--quiet",
    ])
    captured = capsys.readouterr()
    assert code == 2
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("fedveil: error: privacy: ")
    assert "budget" in lines[0]
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_fixed_noise_without_budget_reports_its_epsilon(tmp_path):
    z = 1.2
    config = example_config(privacy={"noise_multiplier": z}, federation={"sampling": "poisson", "rounds": 3})
    out = tmp_path / "run"
    summary = run(config, out, progress=False)
    assert summary["noise_multiplier_per_client"] == [z] * config.data.num_clients
    check_example_run(config, out, summary, None)
    assert summary["epsilon"] > 0
    assert summary["planned_epsilon_per_client"] == pytest.approx(summary["epsilon_per_client"], rel=1e-9, abs=1e-12)


# ------------------------------------------------------------------ local DP-SGD trainer


@pytest.mark.parametrize("sampling", ["poisson", "shuffle"])
def test_dp_trainer_without_clipping_or_noise_is_full_batch_sgd(sampling):
    """Clip never binding, negligible noise, one batch of all n rows (Poisson q = 1 takes every
    row): DP-SGD is exactly full-batch SGD, momentum and weight decay included."""
    gen = torch.Generator().manual_seed(3)
    n = 60
    data = ArrayDataset(torch.randn(n, 8, generator=gen), torch.randint(0, 3, (n,), generator=gen))
    torch.manual_seed(0)
    model = build_model("mlp", (8,), 3, hidden=[16])
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    cfg = ClientConfig(epochs=3, batch_size=n, lr=0.2, momentum=0.5, weight_decay=1e-3)
    trainer = LocalTrainer(model, task_loss("classification"), cfg, total_rounds=1)

    plain, plain_stats = trainer.train(params, data, torch.Generator().manual_seed(1), 0)
    # C z = 1e9 * 1e-15 = 1e-6: the noise on the summed gradient is far below float32 rounding of w
    dp = ExampleDP(clip=1e9, noise_multiplier=1e-15, sampling=sampling, batch_size=n)
    private, private_stats = trainer.train(params, data, torch.Generator().manual_seed(2), 0, dp=dp)

    assert dp.steps_taken == 3 == trainer.num_steps(n, dp) == private_stats.steps == plain_stats.steps
    assert private_stats.examples == 3 * n
    assert private_stats.loss == pytest.approx(plain_stats.loss, rel=1e-5)
    for k in params:
        assert not torch.equal(plain[k], params[k])
        torch.testing.assert_close(private[k], plain[k], rtol=0, atol=1e-6)


def test_dp_trainer_counts_steps_across_calls():
    gen = torch.Generator().manual_seed(0)
    n = 40
    data = ArrayDataset(torch.randn(n, 4, generator=gen), torch.randint(0, 2, (n,), generator=gen))
    model = build_model("linear", (4,), 2)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    trainer = LocalTrainer(model, task_loss("classification"), ClientConfig(epochs=2, batch_size=16), total_rounds=2)
    poisson = ExampleDP(clip=1.0, noise_multiplier=1.0, sampling="poisson", batch_size=16)
    shuffle = ExampleDP(clip=1.0, noise_multiplier=1.0, sampling="shuffle", batch_size=16)
    for r in range(2):
        trainer.train(params, data, torch.Generator().manual_seed(r), r, dp=poisson)
        trainer.train(params, data, torch.Generator().manual_seed(r), r, dp=shuffle)
    assert poisson.steps_taken == 2 * 2 * math.ceil(40 / 16)  # 12
    assert shuffle.steps_taken == 2 * 2 * (40 // 16)  # 8


# ------------------------------------------------------------------------------- resume

ROUNDS, EVERY, KILL_AT = 6, 2, 3




RESUME_CASES = {
    "example-poisson": (example_config, dict(privacy={"epsilon": 0.5}, federation={"sampling": "poisson"})),
    "client-adaptive": (
        client_config,
        dict(
            privacy={"noise_multiplier": 1.0, "adaptive_clip": True, "clip": 0.5, "clip_count_noise": 1.0},
            data={"num_clients": 10}, federation={"sampling": "poisson", "clients_per_round": 4},
        ),
    ),
    "client-distributed": (
        client_config,
        dict(
            privacy={"epsilon": 4.0, "clip": 0.5}, secure_aggregation={"enabled": True},
            data={"num_clients": 10}, federation={"clients_per_round": 4},
        ),
    ),
}


@pytest.mark.parametrize("case", list(RESUME_CASES))
def test_resume_under_dp_equals_uninterrupted(tmp_path, case):
    build, sections = RESUME_CASES[case]
    config = build(**merge(sections, {"federation": {"rounds": ROUNDS}, "checkpoint": {"every": EVERY}}))
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    summary_full = run(config, full, progress=False)

    with pytest.raises(Killed):
        Simulation.from_config(config, [KillAfterRound(KILL_AT)]).run(resumed)
    assert [r["round"] for r in rows_of(resumed)] == [1, 2, 3]
    assert load_checkpoint(resumed)["round"] == 2
    summary_resumed = Simulation.from_config(config).run(resumed, resume=True)

    rows_full, rows_resumed = rows_of(full), rows_of(resumed)
    assert all("epsilon" in r for r in rows_full)
    assert without_wall_clock(rows_resumed) == without_wall_clock(rows_full)
    assert without_wall_clock(summary_resumed) == without_wall_clock(summary_full)
    assert summary_resumed["epsilon"] == summary_full["epsilon"] > 0
    final_full, final_resumed = load_checkpoint(full), load_checkpoint(resumed)
    assert_same_state(final_resumed, final_full)
    assert "privacy" in final_full
    if config.privacy.adaptive_clip:
        # the adaptive clip moved, and the resumed run picked it up from the checkpoint
        clips = [r["clip"] for r in rows_full]
        assert len(set(clips)) == ROUNDS
        assert summary_full["final_clip"] == summary_resumed["final_clip"] != config.privacy.clip


# ------------------------------------------------------------------------- client level


def test_client_level_poisson_calibrated(tmp_path):
    budget = 0.5
    config = client_config(privacy={"epsilon": budget}, federation={"sampling": "poisson"})
    out = tmp_path / "run"
    summary = run(config, out, progress=False)
    z, q, rounds = summary["noise_multiplier"], 5 / 20, config.federation.rounds
    assert summary["privacy_level"] == "client"
    assert summary["epsilon"] == pytest.approx(epsilon(z, q, rounds, DELTA, "poisson"), rel=1e-9)
    assert 0.99 * budget <= summary["epsilon"] <= budget
    assert summary["planned_epsilon"] == pytest.approx(summary["epsilon"], rel=1e-9)
    assert summary["final_clip"] == config.privacy.clip  # not adaptive
    assert "epsilon_per_client" not in summary
    rows = rows_of(out)
    # every round is accounted, whoever (if anyone) was sampled
    for row in rows:
        assert row["epsilon"] == pytest.approx(epsilon(z, q, row["round"], DELTA, "poisson"), rel=1e-9)
        assert "epsilon_per_client" not in row
        assert row["clip"] == config.privacy.clip


def test_client_level_fixed_cohorts(tmp_path):
    z = 2.0
    config = client_config(privacy={"noise_multiplier": z}, federation={"sampling": "fixed"})
    summary = run(config, tmp_path / "run", progress=False)
    assert summary["noise_multiplier"] == z
    want = epsilon(z, 5 / 20, config.federation.rounds, DELTA, Sampling("fixed", 20))
    assert summary["epsilon"] == pytest.approx(want, rel=1e-9)
    assert want != pytest.approx(epsilon(z, 5 / 20, config.federation.rounds, DELTA, "poisson"), rel=1e-3)


@pytest.mark.parametrize("algorithm, name", [("scaffold", "Scaffold"), ("fednova", "FedNova")])
def test_client_level_refuses_algorithms_that_send_more_than_an_update(algorithm, name):
    config = client_config(privacy={"noise_multiplier": 1.0}, algorithm={"name": algorithm})
    with pytest.raises(ConfigError, match=rf"privacy.level: client-level DP .*{name} sends more"):
        Simulation.from_config(config)


def test_example_level_refuses_fedavg_ft():
    config = example_config(privacy={"noise_multiplier": 1.0}, algorithm={"name": "fedavg_ft"})
    with pytest.raises(ConfigError, match="FedAvgFT does not support example-level DP"):
        Simulation.from_config(config)


@pytest.mark.parametrize("count_noise", [0.5, 1.0])
def test_adaptive_clip_refuses_count_noise_at_most_half_z(count_noise):
    config = client_config(privacy={"noise_multiplier": 2.0, "adaptive_clip": True, "clip_count_noise": count_noise})
    with pytest.raises(ConfigError, match=r"privacy: privacy.clip_count_noise=.* must exceed z/2 = 1"):
        Simulation.from_config(config)


def test_adaptive_clip_accepts_count_noise_above_half_z():
    config = client_config(privacy={"noise_multiplier": 2.0, "adaptive_clip": True, "clip_count_noise": 1.05})
    sim = Simulation.from_config(config)
    assert sim.privacy.server.adaptive and sim.privacy.server.count_noise_std == 1.05
