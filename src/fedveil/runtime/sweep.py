"""Running a sweep: every point of a :class:`~fedveil.runtime.sweep_plan.SweepPlan` as a
run in its own directory ``SWEEP_DIR/runs/<name>``, one after another or as Ray tasks.

The plan is saved first (``SWEEP_DIR/sweep.json``). A sweep is resumable as a whole: run
again with ``resume=True``, it skips the runs that finished (they have a ``summary.json``),
continues an interrupted one from its checkpoint and starts the rest.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..config import RunConfig, validate
from .callbacks import ProgressBar
from .run_dir import SUMMARY_FILE, RunDirectory, RunDirError, config_fingerprint, read_json, write_json
from .simulation import Simulation
from .sweep_plan import SweepPlan, SweepPoint

SWEEP_FILE = "sweep.json"
RUNS_DIR = "runs"


@dataclass(frozen=True)
class SweepRun:
    """One point of a sweep with its config and its run directory."""

    index: int
    point: SweepPoint
    config: RunConfig
    path: Path

    @property
    def finished(self) -> bool:
        """Whether the run's directory holds its ``summary.json``."""
        return (self.path / SUMMARY_FILE).is_file()


def open_sweep(plan: SweepPlan | None, out: str | Path, resume: bool) -> tuple[SweepPlan, list[SweepRun]]:
    """Validate every run and claim folder ``out`` for the sweep (``plan = None`` with
    ``resume``: the plan saved there). Refuses, before any run starts, a folder that holds
    something else, a new sweep in a folder that holds one (unless ``resume``) and a
    resume whose plan differs from the saved one."""
    out = Path(out)
    saved_file = out / SWEEP_FILE
    if out.exists() and not out.is_dir():
        raise RunDirError(f"sweep folder '{out}' is a file; give a folder")
    if saved_file.is_file():
        saved = SweepPlan.from_dict(read_json(saved_file))
        if not resume:
            raise RunDirError(f"'{out}' already holds a sweep: pass --resume to continue it, or choose another --out")
        if plan is not None and config_fingerprint(plan.to_dict()) != config_fingerprint(saved.to_dict()):
            raise RunDirError(
                f"cannot resume the sweep in '{out}': the config or the axes differ from its {SWEEP_FILE}; "
                "resume with --out alone, or start the new sweep in another folder"
            )
        plan = saved
    elif resume:
        raise RunDirError(f"--resume: '{out}' holds no sweep to resume (no {SWEEP_FILE})")
    elif out.exists() and any(out.iterdir()):
        raise RunDirError(f"sweep folder '{out}' is not empty; choose another --out")
    assert plan is not None
    runs = [SweepRun(i, p, c, out / RUNS_DIR / p.name) for i, (p, c) in enumerate(zip(plan.points(), plan.configs()))]
    out.mkdir(parents=True, exist_ok=True)
    write_json(saved_file, plan.to_dict())
    return plan, runs


def run_sweep(
    plan: SweepPlan | None, out: str | Path, *, resume: bool = False, progress: bool = True,
    use_ray: bool = False, echo: Callable[[str], Any] = print,
) -> list[dict[str, Any]]:
    """Run the sweep into ``out`` and return every run's summary, in plan order.
    ``use_ray``: one Ray task per run (``ray.address`` of the base config, else a local
    Ray); otherwise one after another, each with a progress line."""
    plan, runs = open_sweep(plan, out, resume)
    return run_all(runs, progress=progress, use_ray=use_ray, echo=echo)


def run_all(
    runs: list[SweepRun], *, progress: bool = True, use_ray: bool = False, echo: Callable[[str], Any] = print,
    plots: bool = True,
) -> list[dict[str, Any]]:
    """Run every one of ``runs`` into its folder and return their summaries, in order: a
    finished run is kept, an interrupted one resumes from its checkpoint (what a sweep and
    a reproduction's plan both do). ``plots=False`` skips each run's PNGs (grids of many runs)."""
    total = len(runs)
    summaries: dict[int, dict[str, Any]] = {}
    todo = []
    for run in runs:
        if run.finished:
            RunDirectory.open_for_resume(run.path, run.config.model_dump(mode="json"))  # refuses another config's run
            summaries[run.index] = read_json(run.path / SUMMARY_FILE)
            echo(f"{_tag(run, total)}: finished earlier, kept")
        else:
            todo.append(run)
    if use_ray:
        summaries.update(_run_on_ray(todo, total, echo, plots))
    else:
        for run in todo:
            bars = [ProgressBar(_tag(run, total), lines=1)] if progress else []
            summaries[run.index] = Simulation.from_config(run.config, bars).run(run.path, resume=True, plots=plots)
            if not progress:
                echo(f"{_tag(run, total)}: {result_line(summaries[run.index])}")
    return [summaries[i] for i in range(total)]


def result_line(summary: dict[str, Any]) -> str:
    """``30 rounds, 12.3 s, global_test_accuracy 0.8123, epsilon 4``: one finished run."""
    score = summary["score"]
    shown = [f"{summary['rounds_completed']} rounds", f"{summary['wall_time_s']:.1f} s"]
    for key in (f"global_test_{score}", f"personal_{score}_mean", "epsilon"):
        if isinstance(summary.get(key), (int, float)):
            shown.append(f"{key} {summary[key]:.4g}")
    return ", ".join(shown)


def _tag(run: SweepRun, total: int) -> str:
    return f"[{run.index + 1}/{total}] {run.point.label}"


def _run_on_ray(
    runs: list[SweepRun], total: int, echo: Callable[[str], Any], plots: bool = True,
) -> dict[int, dict[str, Any]]:
    if not runs:
        return {}
    for run in runs:
        if run.config.executor == "ray":
            raise RunDirError(
                f"sweep run {run.point.label}: a Ray sweep runs each run as one Ray task, so its executor must be "
                "serial or vectorized (executor = \"ray\" would nest Ray tasks)"
            )
    try:
        import ray
    except ImportError:
        raise RunDirError("a sweep over Ray needs Ray: pip install 'fedveil[ray]'") from None
    if not ray.is_initialized():
        address = runs[0].config.ray.address
        ray.init(address=address, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    remote = ray.remote(num_cpus=1)(_run_one)
    pending = {remote.remote(r.config.model_dump(), str(r.path), plots): r for r in runs}
    done: dict[int, dict[str, Any]] = {}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        run = pending.pop(ready[0])
        done[run.index] = ray.get(ready[0])
        echo(f"{_tag(run, total)}: {result_line(done[run.index])}")
    return done


def _run_one(config: dict[str, Any], path: str, plots: bool = True) -> dict[str, Any]:
    """A Ray task: one sweep run (no progress bar), resumed from its checkpoint if it has one."""
    return Simulation.from_config(validate(config)).run(path, resume=True, plots=plots)


__all__ = ["RUNS_DIR", "SWEEP_FILE", "SweepRun", "open_sweep", "result_line", "run_all", "run_sweep"]
