"""Executors run one round's cohort of client updates. ``serial`` is the readable reference;
``threads`` trains clients side by side on worker threads (:mod:`fedveil.runtime.threaded`);
``vectorized`` stacks the cohort's local training (:mod:`fedveil.runtime.vectorized`);
``ray`` shards the cohort over Ray workers (:mod:`fedveil.runtime.ray_executor`); ``auto``
picks serial, threads or vectorized for the model by a rule measured on the benchmark suite
(:func:`auto_executor`)."""
from __future__ import annotations

import torch
from torch import nn

from ..engine import StackedModel, UnsupportedModelError
from ..training.private_stacked import check_private_stacking
from .serial import SerialExecutor

EXECUTORS = ("serial", "threads", "vectorized", "ray", "auto")


def auto_executor(model: nn.Module, private: bool, device: torch.device | str = "cpu", workers: int = 1) -> str:
    """``vectorized``, ``threads`` or ``serial`` for ``model`` (``private``: example-level
    DP-SGD) on ``device`` with ``workers`` CPU threads, by the rule the benchmark records
    support (docs/executors.md#auto). On a GPU every model the engine can stack is stacked:
    the H100 run of 2026-11-27 found stacking faster than serial in every case it measured
    (MLP, LeNet, ResNet-8, with and without DP; LeNet x10 0.077 s a round against 0.219,
    ResNet-8 x10 0.27 against 0.65). On the CPU (2 cores, suite_2026-11-28c) stacking wins
    for nets without convolutions (MLP x100: 0.37 s a round against 0.93 serial; with DP
    0.94 against 2.54) and loses for convolutional nets, with DP-SGD too since one client's
    private steps take the stacked rules (LeNet x100 with DP 39.8 s against 24.2 on two
    threads, x10 3.62 against 2.62; ResNet-8 x100 with DP 33.5 against 21.4; without DP,
    LeNet x100 26.6 against 17.6, ResNet-8 x100 23.5 against 12.7). Those, and models the
    engine cannot stack, train on ``workers`` threads side by side when there are two or
    more, else serially."""
    on_gpu = torch.device(device).type == "cuda"
    side_by_side = "threads" if workers >= 2 and not on_gpu else "serial"
    try:
        StackedModel(model)
        if private:
            check_private_stacking(model)
    except UnsupportedModelError:
        return side_by_side
    if on_gpu or not any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules()):
        return "vectorized"
    return side_by_side


def make_executor(name: str, ray_config=None, device: torch.device | str = "cpu", workers: int = 1):
    """The executor called ``name``; ``ray_config`` (a :class:`fedveil.config.RayConfig`) for Ray.
    ``device`` is the run's: serial, threads and vectorized compute wherever the states and
    data are; Ray ships CPU copies and needs to know where its workers should compute.
    ``workers``: the threads executor's threads."""
    if name == "auto":
        raise ValueError(
            "executor 'auto' is resolved for the model first: make_executor(auto_executor(model, private, device))"
        )
    if name == "serial":
        return SerialExecutor()
    if name == "threads":
        from .threaded import ThreadsExecutor

        return ThreadsExecutor(workers)
    if name == "vectorized":
        from .vectorized import VectorizedExecutor

        return VectorizedExecutor()
    if name == "ray":
        from .ray_executor import RayExecutor

        if ray_config is None:
            return RayExecutor(device=device)
        return RayExecutor(ray_config.address, ray_config.workers, ray_config.inner, device=device)
    raise ValueError(f"unknown executor '{name}'; available: {', '.join(EXECUTORS)}")
