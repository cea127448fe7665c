"""Orchestration without a run directory, and DP steps that travel in the results.

A :class:`MemoryRecorder` run writes no file and gives the run directory's numbers; it
resumes bit-for-bit from its own checkpoint. The privacy accounting reads the steps a
client took from ``ClientResult.dp_trainings``, which every executor fills, never from
the (possibly remote, possibly copied) ``ExampleDP`` the trainer counted in.
"""
from __future__ import annotations

import pytest

from fedveil.privacy.ledger_check import PrivacyCheckError
from fedveil.runtime import MemoryRecorder, Simulation, run
from fedveil.runtime.recorder import RunRecorder
from tiny_runs import assert_same_state, load_checkpoint, read_json, rows_of, tiny_config, without_wall_clock

pytestmark = pytest.mark.usefixtures("skip_plots")

DP = {"level": "example", "noise_multiplier": 1.0, "batch_sampling": "shuffle"}


class Killed(Exception):
    pass


class KillAfter(MemoryRecorder):
    """Dies (like a killed process) right after recording round ``at``."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at

    def record_row(self, row):
        super().record_row(row)
        if row["round"] == self.at:
            raise Killed


def test_a_memory_recorded_run_writes_nothing_and_equals_a_run_directory(tmp_path, monkeypatch):
    config = tiny_config(algorithm={"name": "scaffold"}, privacy=DP, federation={"rounds": 4})
    summary = run(config, tmp_path / "dir", progress=False)
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path / "empty")
    recorder = MemoryRecorder()
    in_memory = Simulation.from_config(config).record(recorder)
    assert list((tmp_path / "empty").iterdir()) == []
    assert without_wall_clock(in_memory) == without_wall_clock(summary)
    assert without_wall_clock(recorder.rows) == without_wall_clock(rows_of(tmp_path / "dir"))
    assert recorder.partition == read_json(tmp_path / "dir" / "partition.json")
    assert recorder.client_rows == read_json(tmp_path / "dir" / "client_metrics.json")
    assert_same_state(recorder.load_checkpoint(), load_checkpoint(tmp_path / "dir"))


def test_a_memory_recorder_resumes_bit_for_bit():
    config = tiny_config(algorithm={"name": "scaffold"}, privacy=DP, federation={"rounds": 6}, checkpoint={"every": 2})
    whole = MemoryRecorder()
    expected = Simulation.from_config(config).record(whole)
    killed = KillAfter(3)
    with pytest.raises(Killed):
        Simulation.from_config(config).record(killed)
    assert [r["round"] for r in killed.rows] == [1, 2, 3]
    killed.at = None
    resumed = Simulation.from_config(config).record(killed)  # from the checkpoint of round 2
    assert without_wall_clock(resumed) == without_wall_clock(expected)
    assert without_wall_clock(killed.rows) == without_wall_clock(whole.rows)
    assert_same_state(killed.load_checkpoint(), whole.load_checkpoint())


def test_a_checkpoint_of_another_config_is_refused():
    recorder = MemoryRecorder()
    Simulation.from_config(tiny_config(federation={"rounds": 2})).record(recorder)
    with pytest.raises(RuntimeError, match="checkpoint in memory belongs to another config"):
        Simulation.from_config(tiny_config(federation={"rounds": 3})).record(recorder)


def test_the_recorder_interface_is_all_a_run_needs():
    """A recorder that keeps nothing but hands out a client store runs a whole simulation."""

    class Forgetful(RunRecorder):
        def client_store(self, backend, device="cpu"):
            return MemoryRecorder().client_store(backend, device)

    summary = Simulation.from_config(tiny_config(federation={"rounds": 2})).record(Forgetful())
    assert summary["rounds_completed"] == 2 and 0 < summary["global_test_accuracy"] <= 1


@pytest.mark.parametrize("executor", ["serial", "vectorized"])
def test_executors_return_the_dp_steps_of_every_training(executor):
    config = tiny_config(executor=executor, algorithm={"name": "ditto"}, privacy=DP, client={"steps": 3})
    sim = Simulation.from_config(config)
    state = sim.fresh_state()
    jobs = [(sim.task(c, 0), sim.client_state(state, c)) for c in (0, 1)]
    results = sim.executor.run_cohort(sim.algorithm, state["server"], jobs)
    for (task, _), result in zip(jobs, results):
        assert result.dp_trainings == task.dp.trainings == [3, 3]  # Ditto trains twice, 3 steps each
    no_dp = Simulation.from_config(tiny_config(executor=executor))
    fresh = no_dp.fresh_state()
    [result] = no_dp.executor.run_cohort(no_dp.algorithm, fresh["server"], [(no_dp.task(0, 0), None)])
    assert result.dp_trainings == []


@pytest.mark.parametrize("executor", ["serial", "vectorized"])
def test_the_accounting_reads_the_steps_from_the_results(executor):
    """An executor whose tasks' ExampleDP the server never sees (as over the network)
    accounts exactly what the local one does; one that reports no steps accounts none."""
    config = tiny_config(executor=executor, privacy=DP, federation={"rounds": 2})
    expected = Simulation.from_config(config).record()

    sim = Simulation.from_config(config)
    inner = sim.executor

    class Remote:
        def run_cohort(self, algorithm, server_state, jobs):
            results = inner.run_cohort(algorithm, server_state, jobs)
            for task, _ in jobs:
                task.dp.trainings.clear()  # the server's copy never saw the steps
            return results

    sim.executor = Remote()
    summary = sim.record()
    assert summary["epsilon"] == expected["epsilon"] > 0
    assert summary["epsilon_per_client"] == expected["epsilon_per_client"]

    class Silent:
        def run_cohort(self, algorithm, server_state, jobs):
            results = inner.run_cohort(algorithm, server_state, jobs)
            for result in results:
                result.dp_trainings = []  # the steps stay in the ExampleDP objects only
            return results

    sim = Simulation.from_config(config)
    inner = sim.executor
    sim.executor = Silent()
    with pytest.raises(PrivacyCheckError, match="under-recorded"):
        sim.record()
