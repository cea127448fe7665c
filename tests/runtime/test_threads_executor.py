"""The threads executor: clients side by side on worker threads, each client's numbers
those of the serial executor on one torch thread, bit for bit."""
from __future__ import annotations

import pytest
import torch

from fedveil.runtime import MemoryRecorder, Simulation
from fedveil.runtime.threaded import ThreadsExecutor

from tiny_runs import tiny_config, without_wall_clock

pytestmark = pytest.mark.usefixtures("skip_plots")

PRIVACY = {"none": {}, "example": {"level": "example", "epsilon": 4.0, "clip": 0.5}}


def _run(executor, **sections):
    """The rows, the final server state and the client states of a tiny run on ``executor``."""
    sim = Simulation.from_config(tiny_config(executor="serial", threads=1, **sections))
    sim.executor = executor or sim.executor
    recorder = MemoryRecorder()
    sim.record(recorder)
    state = recorder.load_checkpoint()
    return without_wall_clock(recorder.rows), state["server"], state["clients"]


def _assert_equal(a, b, where=""):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _assert_equal(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_equal(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    else:
        assert a == b or (a != a and b != b), where  # NaN equals NaN here


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold", "ditto"])
@pytest.mark.parametrize("level", PRIVACY)
def test_the_same_numbers_as_serial_on_one_thread(algorithm, level):
    sections = dict(
        algorithm={"name": algorithm}, model={"name": "lenet"}, data={"num_clients": 6},
        federation={"rounds": 2, "clients_per_round": 5}, client={"batch_size": 16, "momentum": 0.5},
        privacy=PRIVACY[level], checkpoint={"every": 1},
    )
    serial = _run(None, **sections)
    threaded = _run(ThreadsExecutor(workers=3), **sections)
    _assert_equal(serial, threaded)


def test_a_client_error_reaches_the_caller():
    executor = ThreadsExecutor(workers=2)
    sim = Simulation.from_config(tiny_config(federation={"rounds": 1}))

    class Broken(Exception):
        pass

    def client_update(server_state, client_state, task):
        raise Broken(f"client {task.client_id}")

    sim.algorithm.client_update = client_update
    sim.executor = executor
    with pytest.raises(Broken, match="client"):
        sim.train_round(sim.fresh_state(), 0)


def test_at_least_one_worker():
    with pytest.raises(ValueError, match="at least 1 worker"):
        ThreadsExecutor(workers=0)
