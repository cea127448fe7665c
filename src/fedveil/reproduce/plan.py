"""The declared shapes of a reproduction: a plan of run configs, run through the sweep
machinery, and a report built from their summaries (:class:`Reproduction`); or, where the
work is not such a plan, a study's settings, its run and its report (:class:`StudyReproduction`).

A :class:`Reproduction` is three parts a reader can find in every reproduction module:
``plan(ctx)`` lists the training runs (a name, which is the run's folder under
``ctx.runs_dir``, and a run config each); the runs go through the sweep runner, so a
finished run is kept, an interrupted one resumes from its checkpoint, and a folder that
holds another config's run is refused; ``report(ctx, summaries)`` turns the summaries (by
run name) into rows beside the paper's numbers, with verdicts and figures.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from ..config import validate
from ..runtime.sweep import SweepRun, run_all
from ..runtime.sweep_plan import SweepPoint
from .report import ReproductionReport


@dataclass
class ReproductionContext:
    """Where a reproduction writes (``out_dir``), whether it is a quick smoke test, and the
    parent folder of the data sets."""

    out_dir: Path
    quick: bool
    data_root: Path  # parent folder of the data sets (e.g. ../shared/data)

    def data_dir(self, *candidates: str) -> Path:
        """The first existing ``data_root/<candidate>`` (else the first candidate's path,
        where the loader will download or explain what is missing)."""
        for name in candidates:
            if (self.data_root / name).exists():
                return self.data_root / name
        return self.data_root / candidates[0]

    @property
    def runs_dir(self) -> Path:
        """The folder holding one sub-folder per training run."""
        return self.out_dir / "runs"


@dataclass(frozen=True)
class PlannedRun:
    """One training run of a reproduction: its folder name under ``runs/`` and its raw config."""

    name: str
    config: dict[str, Any]


Summaries = Mapping[str, dict[str, Any]]  # run name -> its summary.json


@dataclass(frozen=True)
class Reproduction:
    """A reproduction declared as a plan of runs and a report over their summaries; calling
    it with a context runs the plan (:func:`run_plan`) and returns the report."""

    plan: Callable[[ReproductionContext], list[PlannedRun]]
    report: Callable[[ReproductionContext, Summaries], ReproductionReport]
    run_plots: bool = True  # False: no per-run PNGs (grids of many runs)

    def __call__(self, ctx: ReproductionContext) -> ReproductionReport:
        summaries = run_plan(self.plan(ctx), ctx.runs_dir, progress=not ctx.quick, plots=self.run_plots)
        return self.report(ctx, summaries)


@dataclass(frozen=True)
class StudyReproduction:
    """A reproduction whose work is not one list of run configs known up front (ECOS jobs,
    closed forms and Monte-Carlo, centralised DP-GD, a grid whose second stage depends on
    the first): ``settings(ctx)`` picks the study (quick or full), ``run(ctx, settings)``
    does the work (resumable through its own files; run configs go through :func:`run_plan`),
    ``report(ctx, settings, results)`` writes the rows, verdicts and figures."""

    settings: Callable[[ReproductionContext], Any]
    run: Callable[[ReproductionContext, Any], Any]
    report: Callable[[ReproductionContext, Any, Any], ReproductionReport]

    def __call__(self, ctx: ReproductionContext) -> ReproductionReport:
        settings = self.settings(ctx)
        return self.report(ctx, settings, self.run(ctx, settings))


def run_plan(
    runs: list[PlannedRun], runs_dir: Path, *, progress: bool = True, plots: bool = True,
) -> dict[str, dict[str, Any]]:
    """Run every planned run into ``runs_dir/<name>`` through the sweep runner and return the
    summaries by name. Every config is validated before the first run starts; names must be unique."""
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"a reproduction plan names a run twice: {sorted({n for n in names if names.count(n) > 1})}")
    sweep_runs = [
        SweepRun(i, SweepPoint(r.name, r.name, ()), validate(r.config), runs_dir / r.name) for i, r in enumerate(runs)
    ]
    summaries = run_all(sweep_runs, progress=progress, plots=plots, echo=lambda line: None)
    return dict(zip(names, summaries))
