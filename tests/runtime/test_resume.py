"""Resume equals uninterrupted: a run killed after a checkpoint and resumed writes the
same metrics, client metrics, summary and final state as one that never stopped."""
from __future__ import annotations

import pytest

from fedveil.algorithms import ALGORITHMS
from fedveil.runtime import Callback, Simulation, run
from fedveil.runtime.sampling import client_schedule
from tiny_runs import (
    KillAfterRound,
    Killed,
    algorithm_sections,
    assert_same_state,
    load_checkpoint,
    merge,
    read_json,
    rows_of,
    tiny_config,
    without_wall_clock,
)

pytestmark = pytest.mark.usefixtures("skip_plots")

ROUNDS, EVERY, KILL_AT = 6, 2, 3




class Recorder(Callback):
    def __init__(self) -> None:
        self.starts, self.rounds, self.ends = [], [], 0

    def on_run_start(self, total_rounds, start_round):
        self.starts.append((total_rounds, start_round))

    def on_round_end(self, row):
        self.rounds.append(row["round"])

    def on_run_end(self, summary):
        self.ends += 1


CASES = {
    "fedavg-fixed": dict(algorithm={"name": "fedavg"}),
    "scaffold-fixed": dict(algorithm={"name": "scaffold"}, client={"momentum": 0.5}),
    "scaffold-poisson": dict(algorithm={"name": "scaffold"}, federation={"sampling": "poisson"}),
    "fedavg_ft-poisson": dict(algorithm={"name": "fedavg_ft"}, federation={"sampling": "poisson"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_resume_equals_uninterrupted(tmp_path, case):
    config = tiny_config(**merge(CASES[case], {"federation": {"rounds": ROUNDS}, "checkpoint": {"every": EVERY}}))
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    summary_full = run(config, full, progress=False)

    with pytest.raises(Killed):
        Simulation.from_config(config, [KillAfterRound(KILL_AT)]).run(resumed)
    # the kill left rounds 1..3 logged but only the round-2 checkpoint, and no summary
    assert [r["round"] for r in rows_of(resumed)] == [1, 2, 3]
    assert load_checkpoint(resumed)["round"] == 2
    assert not (resumed / "summary.json").exists()
    # a torn last line, as if killed in the middle of writing round 4's row
    with open(resumed / "metrics.jsonl", "a") as handle:
        handle.write('{"round": 4, "cohort_si')

    recorder = Recorder()
    summary_resumed = Simulation.from_config(config, [recorder]).run(resumed, resume=True)
    assert recorder.starts == [(ROUNDS, 2)]
    assert recorder.rounds == [3, 4, 5, 6]
    assert recorder.ends == 1

    rows_full, rows_resumed = rows_of(full), rows_of(resumed)
    assert [r["round"] for r in rows_resumed] == list(range(1, ROUNDS + 1))
    assert without_wall_clock(rows_resumed) == without_wall_clock(rows_full)
    assert without_wall_clock(summary_resumed) == without_wall_clock(summary_full)
    assert without_wall_clock(read_json(resumed / "summary.json")) == without_wall_clock(read_json(full / "summary.json"))
    assert read_json(resumed / "client_metrics.json") == read_json(full / "client_metrics.json")
    assert read_json(resumed / "config.json") == read_json(full / "config.json")

    final_full, final_resumed = load_checkpoint(full), load_checkpoint(resumed)
    assert final_full["round"] == final_resumed["round"] == ROUNDS
    assert_same_state(final_resumed, final_full)
    if config.algorithm.name == "scaffold":  # stateful clients: their control variates survive the resume
        assert final_full["clients"], "scaffold should have saved client control variates"
        assert "control" in final_full["server"]


@pytest.mark.parametrize("algorithm", ALGORITHMS.names())
def test_every_algorithm_resumes_exactly(tmp_path, algorithm):
    """Server optimiser moments (FedAvgM/Adam/Yogi), client models (local), control
    variates (SCAFFOLD): whatever state an algorithm keeps survives the checkpoint."""
    config = tiny_config(**algorithm_sections(algorithm, {"federation": {"rounds": 4, "sampling": "poisson"}}))
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    run(config, full, progress=False)
    with pytest.raises(Killed):
        Simulation.from_config(config, [KillAfterRound(KILL_AT)]).run(resumed)
    Simulation.from_config(config).run(resumed, resume=True)
    assert without_wall_clock(rows_of(resumed)) == without_wall_clock(rows_of(full))
    assert_same_state(load_checkpoint(resumed), load_checkpoint(full))


def test_poisson_case_really_varies_the_cohort():
    """The poisson cases above only mean something if cohorts differ from round to round."""
    config = tiny_config(federation={"sampling": "poisson"})
    schedule = client_schedule(5, 3, ROUNDS, "poisson", config.seed)
    sizes = {len(s) for s in schedule}
    assert len(sizes) > 1


def test_resume_without_checkpoint_restarts_from_round_one(tmp_path):
    """Killed before the first checkpoint (every=0 means only at the end): resume starts over
    and still matches an uninterrupted run."""
    config = tiny_config(federation={"rounds": 3}, checkpoint={"every": 0})
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    run(config, full, progress=False)
    with pytest.raises(Killed):
        Simulation.from_config(config, [KillAfterRound(2)]).run(resumed)
    assert not (resumed / "checkpoint.pt").exists()
    assert [r["round"] for r in rows_of(resumed)] == [1, 2]
    recorder = Recorder()
    Simulation.from_config(config, [recorder]).run(resumed, resume=True)
    assert recorder.starts == [(3, 0)]
    assert without_wall_clock(rows_of(resumed)) == without_wall_clock(rows_of(full))
    assert_same_state(load_checkpoint(resumed), load_checkpoint(full))


def test_resume_of_a_finished_run_trains_nothing_and_keeps_results(tmp_path):
    config = tiny_config(federation={"rounds": 2})
    out = tmp_path / "run"
    first = run(config, out, progress=False)
    rows_before = rows_of(out)
    checkpoint_before = load_checkpoint(out)
    clients_before = read_json(out / "client_metrics.json")

    recorder = Recorder()
    again = Simulation.from_config(config, [recorder]).run(out, resume=True)
    assert recorder.starts == [(2, 2)] and recorder.rounds == [] and recorder.ends == 1
    assert rows_of(out) == rows_before  # elapsed_s included: nothing was rewritten
    assert again == first  # wall time is the checkpointed one
    assert read_json(out / "client_metrics.json") == clients_before
    assert_same_state(load_checkpoint(out), checkpoint_before)
    assert checkpoint_before["elapsed_s"] == load_checkpoint(out)["elapsed_s"]


def test_resume_into_missing_directory_starts_a_new_run(tmp_path):
    config = tiny_config(federation={"rounds": 2})
    summary = run(config, tmp_path / "new", resume=True, progress=False)
    assert summary["rounds_completed"] == 2
    assert [r["round"] for r in rows_of(tmp_path / "new")] == [1, 2]
