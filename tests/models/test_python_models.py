"""Your own PyTorch module as the model (issue 39, item 1): named ``python:module:Class`` in a
config or handed to ``run(model=...)``; the serial and vectorized executors give it the same
numbers; its per-example gradients under DP-SGD are plain autograd's; a BatchNorm module is
refused under DP with the conversion offered, and the conversion makes it pass."""
from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

from fedveil.config import validate
from fedveil.models import batchnorm_to_groupnorm, build_model, model_options
from fedveil.privacy.dp_sgd import per_example_grads
from fedveil.runtime import run
from fedveil.runtime.simulation import Simulation

from tests.runtime.tiny_runs import run_in_float64, tiny_config

NAME = "python:tests.models.test_python_models:TinyNet"


class TinyNet(nn.Module):
    """A user's module: its own layers, an option of its own, a buffer it never updates."""

    def __init__(self, input_shape, num_classes, hidden: int = 12):
        super().__init__()
        self.register_buffer("scale", torch.tensor(0.5))
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), hidden), nn.Tanh())
        self.head = nn.Linear(hidden, num_classes)

    def forward(self, x):
        return self.head(self.body(x) * self.scale * 2)


class WithBatchNorm(nn.Module):
    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 24), nn.BatchNorm1d(24), nn.ReLU(),
                                 nn.Linear(24, num_classes))

    def forward(self, x):
        return self.net(x)


def converted(input_shape, num_classes):
    return batchnorm_to_groupnorm(WithBatchNorm(input_shape, num_classes))


def test_a_named_module_builds_with_its_options_and_refuses_unknown_ones():
    assert model_options(NAME) == {"hidden": 12}
    model = build_model(NAME, (4, 4), 3, hidden=5)
    assert type(model).__name__ == "TinyNet" and model.head.in_features == 5
    with pytest.raises(ValueError, match="has no option 'depth'"):
        build_model(NAME, (4, 4), 3, depth=2)
    with pytest.raises(ValueError, match="cannot be imported"):
        build_model("python:tests.models.test_python_models:Missing", (4,), 2)


def test_the_serial_and_vectorized_executors_give_a_custom_module_the_same_numbers():
    rows = {}
    for executor in ("serial", "vectorized"):
        config = tiny_config(model={"name": NAME, "options": {"hidden": 6}}, executor=executor,
                             federation={"rounds": 2, "clients_per_round": 3})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rows[executor], _ = run_in_float64(config)
    for a, b in zip(rows["serial"], rows["vectorized"]):
        for key in ("train_loss", "global_test_accuracy"):
            if key in a:
                assert a[key] == pytest.approx(b[key], rel=1e-9), key


def test_per_example_gradients_of_a_custom_module_are_plain_autograds():
    torch.manual_seed(0)
    model = TinyNet((3, 3), 4)
    x, y = torch.randn(5, 3, 3), torch.tensor([0, 3, 1, 2, 0])
    params = dict(model.named_parameters())
    grads, _ = per_example_grads(model, params, x, y, nn.functional.cross_entropy)
    for i in range(5):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i:i + 1]), y[i:i + 1]).backward()
        for name, p in model.named_parameters():
            assert torch.allclose(grads[name][i], p.grad, atol=1e-6), name
        norm = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters()))
        assert math.sqrt(sum(float(grads[k][i].pow(2).sum()) for k in grads)) == pytest.approx(norm, rel=1e-5)


def test_run_takes_a_module_class_and_trains_it_under_dp(tmp_path):
    config = tiny_config(federation={"rounds": 2, "clients_per_round": 3},
                         privacy={"level": "example", "epsilon": 5.0, "delta": 1e-5, "clip": 1.0})
    summary = run(config, tmp_path / "run", model=TinyNet, progress=False, plots=False)
    name = f"python:{TinyNet.__module__}:TinyNet"  # the module pytest imported this file as
    assert summary["model"] == name and 0 < summary["epsilon"] <= 5.0 * (1 + 1e-6)
    assert name in (tmp_path / "run" / "config.json").read_text()


def test_batchnorm_is_refused_under_dp_with_the_fix_named_and_the_fix_works(tmp_path):
    dp = {"level": "example", "epsilon": 5.0, "delta": 1e-5, "clip": 1.0}
    config = tiny_config(federation={"rounds": 1, "clients_per_round": 3}, privacy=dp)
    with pytest.raises(Exception, match=r"BatchNorm1d.*batchnorm_to_groupnorm\(model\) converts it"):
        run(config, tmp_path / "bn", model=WithBatchNorm, progress=False, plots=False)
    summary = run(config, tmp_path / "gn", model=converted, progress=False, plots=False)
    assert summary["epsilon"] > 0
    model = converted((4,), 2)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    norm = model.net[2]
    assert isinstance(norm, nn.GroupNorm) and norm.num_channels == 24 and norm.num_groups == 1  # 24 features: one group of 16+


def test_a_config_names_a_module_by_import_path():
    config = validate({**tiny_config().model_dump(), "model": {"name": NAME, "options": {"hidden": 7}}})
    sim = Simulation.from_config(config)
    assert type(sim.model).__name__ == "TinyNet" and sim.model.head.in_features == 7


class ReadsWeightOutsideItsLayer(nn.Module):
    """Uses a layer's weight directly, which the stacked engine cannot trace per client."""

    def __init__(self, input_shape, num_classes):
        super().__init__()
        self.lin = nn.Linear(math.prod(input_shape), num_classes)

    def forward(self, x):
        return x.flatten(1) @ self.lin.weight.T


def test_a_module_the_stacked_engine_cannot_run_is_reported_before_any_work_and_still_trains(tmp_path):
    config = tiny_config(executor="vectorized", federation={"rounds": 1, "clients_per_round": 3})
    name = f"python:{ReadsWeightOutsideItsLayer.__module__}:ReadsWeightOutsideItsLayer"
    config = validate({**config.model_dump(), "model": {"name": name}})
    with pytest.warns(UserWarning, match="vectorized executor: training clients one by one") as caught:
        sim = Simulation.from_config(config)
    assert len(caught) == 1  # once, at the start
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning when the rounds run
        summary = sim.record()
    assert summary["rounds"] == 1
