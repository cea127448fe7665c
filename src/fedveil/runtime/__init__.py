"""Runtime: the round loop, client sampling, executors, run directories, progress."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from torch import nn

from ..config import RunConfig, validate
from ..models.python_models import python_model_name
from .callbacks import Callback, ProgressBar
from .recorder import DirectoryRecorder, MemoryRecorder, RunRecorder
from .simulation import Simulation


def run(
    config: RunConfig, out: str | Path, *, resume: bool = False, progress: bool = True, callbacks: Sequence[Callback] = (),
    device: str | None = None, plots: bool = True, model: Callable[..., nn.Module] | None = None,
) -> dict[str, Any]:
    """Run a federated simulation into run directory ``out``; returns ``summary.json``'s content.
    ``device`` ("auto", "cpu", "cuda", "cuda:N") replaces ``config.device`` when given;
    ``plots=False`` skips the end-of-run PNGs (grids of many runs); ``model`` (an
    ``nn.Module`` class or a function returning one) replaces ``config.model.name``
    (:mod:`fedveil.models.python_models`; ``config.model.options`` go to it)."""
    if device is not None:
        config = validate({**config.model_dump(), "device": device})
    if model is not None:
        raw = config.model_dump()
        config = validate({**raw, "model": {**raw["model"], "name": python_model_name(model)}})
    bars = [ProgressBar(f"{config.algorithm.name}/{config.data.name}")] if progress else []
    return Simulation.from_config(config, [*bars, *callbacks]).run(out, resume=resume, plots=plots)


__all__ = ["Callback", "DirectoryRecorder", "MemoryRecorder", "ProgressBar", "RunRecorder", "Simulation", "run"]
