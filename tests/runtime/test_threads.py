"""The run picks torch's CPU threads from its model (issue 36, item 4); ``threads`` overrides."""
from __future__ import annotations

import pytest
import torch

from fedveil.runtime import Simulation
from fedveil.runtime.simulation import SMALL_MODEL_PARAMS, run_threads

from tiny_runs import tiny_config

pytestmark = pytest.mark.usefixtures("skip_plots")


def test_the_rule_one_thread_below_a_million_parameters_else_torchs_default():
    small, large = torch.nn.Linear(10, 10), torch.nn.Linear(1000, 1001)
    assert sum(p.numel() for p in large.parameters()) >= SMALL_MODEL_PARAMS > sum(p.numel() for p in small.parameters())
    assert run_threads(None, small, default=8) == 1
    assert run_threads(None, large, default=8) == 8
    assert run_threads(3, small, default=8) == 3
    # a stacked cohort's kernels compute every copy at once: 110 parameters x 10,000 copies
    assert run_threads(None, small, default=8, copies=9_090) == 1
    assert run_threads(None, small, default=8, copies=9_091) == 8


@pytest.mark.parametrize("executor, threads", [("vectorized", 2), ("serial", 1)])
def test_a_stacked_cohort_of_a_small_model_gets_torchs_threads(executor, threads):
    # MLP 64-2000-10: 150,010 parameters, 1 thread alone; 20 stacked copies are 3.0 M at once
    config = tiny_config(
        executor=executor, data={"name": "digits", "num_clients": 20}, model={"name": "mlp", "options": {"hidden": [2000]}},
        federation={"rounds": 1, "clients_per_round": 20},
    )
    torch.set_num_threads(2)
    sim = Simulation.from_config(config)
    assert sim.stacked_copies == (20 if executor == "vectorized" else 1)
    assert sim.record()["torch_threads"] == threads


def test_a_run_trains_with_its_threads_and_restores_the_callers():
    seen = []

    class Watch:
        def on_run_start(self, total, start):
            seen.append(torch.get_num_threads())

        def on_round_end(self, row):
            pass

        def on_run_end(self, summary):
            pass

    torch.set_num_threads(2)
    summary = Simulation.from_config(tiny_config(threads=2, federation={"rounds": 1}), [Watch()]).record()
    assert seen == [2] and summary["torch_threads"] == 2
    summary = Simulation.from_config(tiny_config(federation={"rounds": 1})).record()  # linear model: 1 thread
    assert summary["torch_threads"] == 1 and torch.get_num_threads() == 2  # the caller's count is back
