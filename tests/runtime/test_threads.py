"""The run picks torch's CPU threads from its model (issue 36, item 4); ``threads`` overrides."""
from __future__ import annotations

import gc

import pytest
import torch

from fedveil.runtime import Simulation
from fedveil.runtime.simulation import SMALL_STEP_MACS, example_work, run_threads

from tiny_runs import tiny_config

pytestmark = pytest.mark.usefixtures("skip_plots")


def test_the_rule_one_thread_below_32_million_macs_a_step_else_torchs_default():
    assert run_threads(None, SMALL_STEP_MACS - 1, default=8) == 1
    assert run_threads(None, SMALL_STEP_MACS, default=8) == 8
    assert run_threads(3, 10, default=8) == 3 and run_threads(3, 10**12, default=8) == 3


def test_an_examples_work_counts_each_weight_use_and_at_least_each_parameter():
    rows = torch.zeros(2, 1, 8, 8)
    conv = torch.nn.Conv2d(1, 4, 3, padding=1)  # 8 x 8 positions x 4 channels x 9 taps; 40 parameters
    assert example_work(conv, rows) == 8 * 8 * 4 * 9
    linear = torch.nn.Linear(10, 10)  # 100 MACs, 110 parameters (the bias counted once)
    assert example_work(linear, torch.zeros(2, 10)) == 110
    assert example_work(linear, torch.zeros(2, 3)) == 110  # a forward these rows cannot drive: the parameters


@pytest.mark.parametrize("executor, threads", [("vectorized", 2), ("serial", 1)])
def test_a_stacked_cohort_of_a_small_model_gets_torchs_threads(executor, threads):
    # MLP 64-2000-10: 150,010 parameters and 148,000 MACs an example, x a batch of 32 = 4.8 M
    # a step alone (1 thread); 20 stacked copies compute 96 M at once
    config = tiny_config(
        executor=executor, data={"name": "digits", "num_clients": 20}, model={"name": "mlp", "options": {"hidden": [2000]}},
        federation={"rounds": 1, "clients_per_round": 20},
    )
    torch.set_num_threads(2)
    sim = Simulation.from_config(config)
    assert sim.stacked_copies == (20 if executor == "vectorized" else 1)
    assert sim.step_macs == 150_010 * 32 * sim.stacked_copies
    assert sim.record()["torch_threads"] == threads


def test_a_small_convnet_trained_serially_gets_torchs_threads():
    """ResNet-8 of the bench has 20 k parameters but computes 3.2 M MACs an example (104 M a
    step of 32): one thread made its serial round 1.5x slower (2.71 against 1.78 s, 10 clients)."""
    config = tiny_config(
        executor="serial", model={"name": "resnet", "options": {"depth": 1, "width": 0.5, "groups": 4}},
        data={"name": "synthetic_images", "options": {"channels": 3, "height": 32, "width": 32, "rows": 64}},
        federation={"rounds": 1, "clients_per_round": 2},
    )
    torch.set_num_threads(2)
    sim = Simulation.from_config(config)
    assert sum(p.numel() for p in sim.model.parameters()) < SMALL_STEP_MACS // 32
    assert sim.step_macs >= SMALL_STEP_MACS
    assert sim.record()["torch_threads"] == 2


class AtRunStart:
    """A callback that calls ``look()`` when a run starts training."""

    def __init__(self, look) -> None:
        self.look = look

    def on_run_start(self, total, start):
        self.look()

    def on_round_end(self, row):
        pass

    def on_run_end(self, summary):
        pass


def test_a_run_trains_with_its_threads_and_restores_the_callers():
    seen = []
    watch = AtRunStart(lambda: seen.append(torch.get_num_threads()))
    torch.set_num_threads(2)
    summary = Simulation.from_config(tiny_config(threads=2, federation={"rounds": 1}), [watch]).record()
    assert seen == [2] and summary["torch_threads"] == 2
    summary = Simulation.from_config(tiny_config(federation={"rounds": 1})).record()  # linear model: 1 thread
    assert summary["torch_threads"] == 1 and torch.get_num_threads() == 2  # the caller's count is back


def test_objects_built_before_training_are_frozen_out_of_garbage_collection_and_thawed_after():
    seen = []
    watch = AtRunStart(lambda: seen.append(gc.get_freeze_count()))
    sim = Simulation.from_config(tiny_config(federation={"rounds": 1}), [watch])
    assert gc.get_freeze_count() == 0
    sim.record()
    assert seen[0] > 1000 and gc.get_freeze_count() == 0  # the simulation's objects, then none
    gc.freeze()  # a caller that froze its own objects keeps them frozen
    try:
        sim.record()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
