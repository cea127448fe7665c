"""Executors run one round's cohort of client updates. ``serial`` is the readable reference;
``vectorized`` stacks the cohort's local training (:mod:`fedveil.runtime.vectorized`);
``ray`` shards the cohort over Ray workers (:mod:`fedveil.runtime.ray_executor`); ``auto``
picks serial or vectorized for the model by a rule measured on the benchmark suite
(:func:`auto_executor`)."""
from __future__ import annotations

import torch
from torch import nn

from ..engine import StackedModel, UnsupportedModelError
from ..training.private_stacked import check_private_stacking
from .serial import SerialExecutor

EXECUTORS = ("serial", "vectorized", "ray", "auto")
NORM_LAYERS = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm, nn.modules.instancenorm._InstanceNorm)


def auto_executor(model: nn.Module, private: bool) -> str:
    """``vectorized`` or ``serial`` for ``model`` (``private``: example-level DP-SGD), by the rule
    the CPU benchmark records support (docs/executors.md#auto): stacking wins for nets without
    convolutions (MLP x100: 0.51 s a round against 1.18 serial; with DP 2.0 against 12.0) and,
    under DP-SGD, for convolutional nets without normalisation layers (LeNet x10: 10.7 against
    15.9); it loses for convolutional nets otherwise (LeNet x10 without DP: 4.0 against 3.4;
    ResNet-8 with GroupNorm: 2.3 against 2.2, with DP 10.4 against 4.2). A model the engine
    cannot stack is trained serially."""
    try:
        StackedModel(model)
        if private:
            check_private_stacking(model)
    except UnsupportedModelError:
        return "serial"
    convolutional = any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())
    normalised = any(isinstance(m, NORM_LAYERS) for m in model.modules())
    if not convolutional or (private and not normalised):
        return "vectorized"
    return "serial"


def make_executor(name: str, ray_config=None, device: torch.device | str = "cpu"):
    """The executor called ``name``; ``ray_config`` (a :class:`fedveil.config.RayConfig`) for Ray.
    ``device`` is the run's: serial and vectorized compute wherever the states and data are;
    Ray ships CPU copies and needs to know where its workers should compute."""
    if name == "auto":
        raise ValueError("executor 'auto' is resolved for the model first: make_executor(auto_executor(model, private))")
    if name == "serial":
        return SerialExecutor()
    if name == "vectorized":
        from .vectorized import VectorizedExecutor

        return VectorizedExecutor()
    if name == "ray":
        from .ray_executor import RayExecutor

        if ray_config is None:
            return RayExecutor(device=device)
        return RayExecutor(ray_config.address, ray_config.workers, ray_config.inner, device=device)
    raise ValueError(f"unknown executor '{name}'; available: {', '.join(EXECUTORS)}")
