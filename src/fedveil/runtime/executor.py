"""Executors run one round's cohort of client updates. ``serial`` is the readable reference;
``vectorized`` stacks the cohort's local training (:mod:`fedveil.runtime.vectorized`);
``ray`` shards the cohort over Ray workers (:mod:`fedveil.runtime.ray_executor`)."""
from __future__ import annotations

import torch

from .serial import SerialExecutor

EXECUTORS = ("serial", "vectorized", "ray")


def make_executor(name: str, ray_config=None, device: torch.device | str = "cpu"):
    """The executor called ``name``; ``ray_config`` (a :class:`fedveil.config.RayConfig`) for Ray.
    ``device`` is the run's: serial and vectorized compute wherever the states and data are;
    Ray ships CPU copies and needs to know where its workers should compute."""
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
