"""Client threads of the vectorized executor compute on one intra-op thread; the thread
that runs the stacked kernels, and threads started later, keep torch's count."""
from __future__ import annotations

import threading

import pytest
import torch

from fedveil.runtime import Simulation
from fedveil.runtime.intra_op import use_one_intra_op_thread

from tiny_runs import tiny_config

needs_openmp = pytest.mark.skipif(not torch.backends.openmp.is_available(), reason="torch built without OpenMP")


def _in_thread(work):
    out = []
    thread = threading.Thread(target=lambda: out.append(work()))
    thread.start()
    thread.join()
    return out[0]


@needs_openmp
def test_one_thread_for_the_caller_only():
    torch.set_num_threads(2)

    def limited():
        return use_one_intra_op_thread(), torch.get_num_threads()

    assert _in_thread(limited) == (True, 1)
    assert torch.get_num_threads() == 2  # the caller's thread
    assert _in_thread(torch.get_num_threads) == 2  # a thread started afterwards


@needs_openmp
def test_client_updates_run_on_one_thread_and_the_round_on_all():
    torch.set_num_threads(2)
    sim = Simulation.from_config(tiny_config(executor="vectorized", federation={"rounds": 1}))
    seen, update = [], sim.algorithm.client_update

    def watched(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return update(*args, **kwargs)

    sim.algorithm.client_update = watched
    sim.train_round(sim.fresh_state(), 0)
    assert seen == [1, 1, 1] and torch.get_num_threads() == 2
