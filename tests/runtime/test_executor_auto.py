"""``executor = "auto"`` (issue 38, item 2): stacked or serial by the model, by the rule the
CPU benchmark records support (docs/executors.md#auto), recorded in the summary."""
from __future__ import annotations

import pytest

from fedveil.config import validate
from fedveil.models import build_model
from fedveil.runtime import MemoryRecorder, Simulation
from fedveil.runtime.executor import auto_executor, make_executor

from tiny_runs import tiny_config

pytestmark = pytest.mark.usefixtures("skip_plots")


@pytest.mark.parametrize("name, shape, plain, private", [
    ("linear", (10,), "vectorized", "vectorized"),
    ("mlp", (1, 28, 28), "vectorized", "vectorized"),  # no convolution: stacking wins, with DP by 6x
    ("lenet", (1, 28, 28), "serial", "vectorized"),  # convolutions without normalisation: stacked under DP only
    ("resnet", (3, 32, 32), "serial", "serial"),  # convolutions and GroupNorm: serial
    ("char_lstm", (80,), "serial", "serial"),  # the engine cannot stack it
])
def test_the_rule_picks_by_the_models_layers(name, shape, plain, private):
    model = build_model(name, shape, 10)
    assert (auto_executor(model, private=False), auto_executor(model, private=True)) == (plain, private)
    # on a GPU whatever the engine can stack is stacked (the rule reads the device only)
    on_gpu = "serial" if name == "char_lstm" else "vectorized"
    assert auto_executor(model, private=False, device="cuda") == auto_executor(model, True, "cuda:0") == on_gpu


def test_auto_is_the_default_and_a_run_records_what_it_picked_and_equals_that_executors_run():
    assert validate({}).executor == "auto"
    auto = Simulation.from_config(tiny_config()).record(MemoryRecorder())  # the default, on a linear model
    stacked = Simulation.from_config(tiny_config(executor="vectorized")).record(MemoryRecorder())
    assert auto["executor"] == stacked["executor"] == "vectorized"
    assert auto["global_test_accuracy"] == stacked["global_test_accuracy"]
    serial = Simulation.from_config(tiny_config(executor="serial")).record(MemoryRecorder())
    assert serial["executor"] == "serial"
    cnn = tiny_config(model={"name": "digit_cnn", "options": {"width": 0.25}}, federation={"rounds": 1})
    assert Simulation.from_config(cnn).executor.name == "serial"  # convolutions and BatchNorm: serial


def test_auto_is_resolved_before_an_executor_is_made():
    with pytest.raises(ValueError, match="resolved for the model first"):
        make_executor("auto")
