"""``executor = "auto"`` (issue 38, item 2): stacked, side by side or serial by the model, by the rule the
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
    ("lenet", (1, 28, 28), "threads", "threads"),  # convolutions: side by side, with DP too
    ("resnet", (3, 32, 32), "threads", "threads"),
    ("char_lstm", (80,), "threads", "threads"),  # the engine cannot stack it
])
def test_the_rule_picks_by_the_models_layers(name, shape, plain, private):
    model = build_model(name, shape, 10)
    assert (auto_executor(model, False, workers=2), auto_executor(model, True, workers=2)) == (plain, private)
    # on one CPU thread nothing trains side by side
    one = [auto_executor(model, p, workers=1) for p in (False, True)]
    assert one == [e.replace("threads", "serial") for e in (plain, private)]
    # on a GPU whatever the engine can stack is stacked (the rule reads the device only)
    on_gpu = "serial" if name == "char_lstm" else "vectorized"
    assert auto_executor(model, False, "cuda", workers=2) == auto_executor(model, True, "cuda:0", workers=2) == on_gpu


def test_auto_is_the_default_and_a_run_records_what_it_picked_and_equals_that_executors_run():
    assert validate({}).executor == "auto"
    auto = Simulation.from_config(tiny_config()).record(MemoryRecorder())  # the default, on a linear model
    stacked = Simulation.from_config(tiny_config(executor="vectorized")).record(MemoryRecorder())
    assert auto["executor"] == stacked["executor"] == "vectorized"
    assert auto["global_test_accuracy"] == stacked["global_test_accuracy"]
    serial = Simulation.from_config(tiny_config(executor="serial")).record(MemoryRecorder())
    assert serial["executor"] == "serial"
    cnn = {"model": {"name": "digit_cnn", "options": {"width": 0.25}}, "federation": {"rounds": 1}}
    two, one = (Simulation.from_config(tiny_config(threads=n, **cnn)).executor for n in (2, 1))
    assert (two.name, two.workers, one.name) == ("threads", 2, "serial")  # convolutions and BatchNorm


def test_auto_is_resolved_before_an_executor_is_made():
    with pytest.raises(ValueError, match="resolved for the model first"):
        make_executor("auto")
