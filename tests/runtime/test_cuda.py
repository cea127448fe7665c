"""On a CUDA machine: every algorithm, the serial, threads and vectorized executors, both DP levels and a resume across
devices run on the GPU and agree with the CPU. Marked ``cuda`` (``pytest -m cuda``, run by
``benchmarks/gpu_check.py``); skipped where CUDA is absent, so the default run passes
without a GPU.

The CPU run of the same config is the independent reference: epsilon is computed from
the plan alone and must be identical; training differs only by float32 kernel order, so
accuracy is compared with a tolerance and losses must stay finite.
"""
from __future__ import annotations

import math

import pytest
import torch

from fedveil.algorithms import ALGORITHMS
from fedveil.runtime import MemoryRecorder, Simulation, run

from tiny_runs import KillAfterRound, Killed, algorithm_sections, load_checkpoint, merge, tiny_config

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.usefixtures("skip_plots"),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

EXAMPLE_DP = {"level": "example", "epsilon": 8.0, "delta": 1e-5, "clip": 1.0}
CLIENT_DP = {"level": "client", "epsilon": 8.0, "delta": 1e-5, "clip": 1.0}


def on_device(tree, device: torch.device) -> list[str]:
    """Paths of the tensors in ``tree`` that are not on ``device``."""
    if isinstance(tree, torch.Tensor):
        return [] if tree.device == device else [str(tree.device)]
    if isinstance(tree, dict):
        return [f"{k}: {p}" for k, v in tree.items() for p in on_device(v, device)]
    if isinstance(tree, (list, tuple)):
        return [f"[{i}]: {p}" for i, v in enumerate(tree) for p in on_device(v, device)]
    return []


def cpu_and_cuda(config_sections: dict) -> tuple[dict, dict, Simulation, MemoryRecorder]:
    cpu = Simulation.from_config(tiny_config(device="cpu", **config_sections)).record()
    sim = Simulation.from_config(tiny_config(device="cuda", **config_sections))
    recorder = MemoryRecorder()
    return cpu, sim.record(recorder), sim, recorder


@pytest.mark.parametrize("executor", ["serial", "threads", "vectorized"])
@pytest.mark.parametrize("algorithm", ALGORITHMS.names())
def test_every_algorithm_trains_on_the_gpu_like_on_the_cpu(algorithm, executor):
    sections = algorithm_sections(algorithm, {"executor": executor, "federation": {"rounds": 2}})
    cpu, gpu, sim, recorder = cpu_and_cuda(sections)
    assert gpu["device"].startswith("cuda")
    assert gpu.get("epsilon") == cpu.get("epsilon")
    for key in ("global_test_accuracy", "personal_test_accuracy"):
        if key in cpu and cpu[key] is not None:
            assert gpu[key] == pytest.approx(cpu[key], abs=0.08), key
    assert on_device(recorder.load_checkpoint(sim.device)["server"], sim.device) == []


@pytest.mark.parametrize("executor", ["serial", "threads", "vectorized"])
@pytest.mark.parametrize("privacy", [EXAMPLE_DP, CLIENT_DP], ids=["example", "client"])
def test_dp_on_the_gpu_spends_what_the_cpu_spends(executor, privacy):
    sections = {"executor": executor, "federation": {"rounds": 3}, "privacy": privacy}
    cpu, gpu, _, _ = cpu_and_cuda(sections)
    assert gpu["epsilon"] == cpu["epsilon"] and 0 < gpu["epsilon"] <= 8.0 + 1e-9
    assert gpu["global_test_accuracy"] == pytest.approx(cpu["global_test_accuracy"], abs=0.08)


@pytest.mark.parametrize("executor", ["serial", "vectorized"])
def test_a_cnn_with_dp_sgd_trains_on_the_gpu(executor):
    """The stacked grouped convolutions and per-example gradients on CUDA kernels."""
    sections = merge(
        {"executor": executor, "federation": {"rounds": 2}, "privacy": EXAMPLE_DP},
        {"model": {"name": "lenet"}, "data": {"name": "synthetic_images", "options": {"height": 28, "width": 28, "rows": 200}}},
    )
    cpu, gpu, _, recorder = cpu_and_cuda(sections)
    assert gpu["epsilon"] == cpu["epsilon"]
    losses = [row["train_loss"] for row in recorder.rows if "train_loss" in row]
    assert all(math.isfinite(x) for x in losses)


def test_auto_stacks_on_the_gpu():
    """``executor = "auto"`` (the default) picks the vectorized executor on CUDA, with and without DP-SGD."""
    for privacy in ({"level": "none"}, EXAMPLE_DP):
        sim = Simulation.from_config(tiny_config(device="cuda", executor="auto", federation={"rounds": 1}, privacy=privacy))
        assert sim.record()["executor"] == "vectorized"


def test_a_gpu_run_resumes_on_the_cpu(tmp_path):
    """Checkpoints are CPU tensors: a run killed on the GPU after its round-2 checkpoint
    finishes on the CPU with the plan's epsilon and the CPU run's accuracy."""
    sections = {"federation": {"rounds": 4}, "checkpoint": {"every": 2}, "privacy": EXAMPLE_DP}
    out = tmp_path / "run"
    with pytest.raises(Killed):
        Simulation.from_config(tiny_config(device="cuda", **sections), [KillAfterRound(3)]).run(out)
    assert load_checkpoint(out)["round"] == 2
    assert on_device(load_checkpoint(out)["server"], torch.device("cpu")) == []
    reference = run(tiny_config(device="cpu", **sections), tmp_path / "ref", progress=False)
    resumed = run(tiny_config(device="cpu", **sections), out, resume=True, progress=False)
    assert resumed["epsilon"] == reference["epsilon"]
    assert resumed["global_test_accuracy"] == pytest.approx(reference["global_test_accuracy"], abs=0.08)


def test_secure_aggregation_runs_on_the_gpu_and_matches_the_cpu():
    """The secure sum's host-side quantisation hands its combined update back on the run's device."""
    sections = {"algorithm": {"name": "fedavg"}, "federation": {"rounds": 2, "clients_per_round": 4},
                "secure_aggregation": {"enabled": True, "weight_scale": 100.0}}
    cpu, gpu, sim, recorder = cpu_and_cuda(sections)
    assert on_device(recorder.load_checkpoint(sim.device)["server"], sim.device) == []
    assert math.isfinite(gpu["global_test_accuracy"])
    assert gpu["global_test_accuracy"] == pytest.approx(cpu["global_test_accuracy"], abs=0.05)
