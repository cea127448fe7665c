"""Runtime: the round loop, client sampling, executors, run directories, progress."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ..config import RunConfig
from .callbacks import Callback, ProgressBar
from .simulation import Simulation


def run(
    config: RunConfig, out: str | Path, *, resume: bool = False, progress: bool = True, callbacks: Sequence[Callback] = ()
) -> dict[str, Any]:
    """Run a federated simulation into run directory ``out``; returns ``summary.json``'s content."""
    bars = [ProgressBar(f"{config.algorithm.name}/{config.data.name}")] if progress else []
    return Simulation.from_config(config, [*bars, *callbacks]).run(out, resume=resume)


__all__ = ["Callback", "ProgressBar", "Simulation", "run"]
