"""Runtime: the round loop, client sampling, executors, run directories, progress."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ..config import RunConfig, validate
from .callbacks import Callback, ProgressBar
from .recorder import DirectoryRecorder, MemoryRecorder, RunRecorder
from .simulation import Simulation


def run(
    config: RunConfig, out: str | Path, *, resume: bool = False, progress: bool = True, callbacks: Sequence[Callback] = (),
    device: str | None = None, plots: bool = True,
) -> dict[str, Any]:
    """Run a federated simulation into run directory ``out``; returns ``summary.json``'s content.
    ``device`` ("auto", "cpu", "cuda", "cuda:N") replaces ``config.device`` when given;
    ``plots=False`` skips the end-of-run PNGs (grids of many runs)."""
    if device is not None:
        config = validate({**config.model_dump(), "device": device})
    bars = [ProgressBar(f"{config.algorithm.name}/{config.data.name}")] if progress else []
    return Simulation.from_config(config, [*bars, *callbacks]).run(out, resume=resume, plots=plots)


__all__ = ["Callback", "DirectoryRecorder", "MemoryRecorder", "ProgressBar", "RunRecorder", "Simulation", "run"]
