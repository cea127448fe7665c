"""Comparing finished runs (``fedveil compare``): runs grouped by the config keys that
differ between them (the seed aside), each group's final and best metrics as mean and
sample standard deviation over its seeds.

"Best" is the best evaluated round of that metric on the test data, an optimistic number
(chosen on the data it scores); a run with a validation split also has ``summary.best``,
the round chosen on validation data.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .run_dir import CONFIG_FILE, SUMMARY_FILE, RunDirError, dotted_keys, read_json, read_metrics
from .sweep import RUNS_DIR, SWEEP_FILE
from .signals import eval_signals
from .sweep_plan import short_keys

SEED_KEY = "seed"


@dataclass
class RunRecord:
    """A run directory's config (flattened to dotted keys), metric rows and summary."""

    path: Path
    config: dict[str, Any]
    rows: list[dict[str, Any]]
    summary: dict[str, Any] | None

    @property
    def finished(self) -> bool:
        """Whether the run wrote its summary."""
        return self.summary is not None

    @property
    def score(self) -> str:
        """The run's score, ``"accuracy"`` or ``"mse"``: the summary's, else guessed from the metric rows."""
        if self.summary is not None:
            return self.summary["score"]
        return "mse" if any(k.endswith("_mse") for r in self.rows for k in r) else "accuracy"


@dataclass
class Group:
    """Runs that share every compared key's value."""

    values: dict[str, Any]
    runs: list[RunRecord] = field(default_factory=list)

    def label(self) -> str:
        """``key=value`` pairs of the group's values (short key names), or ``"all runs"``."""
        if not self.values:
            return "all runs"
        shorts = short_keys(list(self.values))
        return ", ".join(f"{s}={_show(v)}" for s, v in zip(shorts, self.values.values()))


@dataclass
class Comparison:
    """The compared runs, the keys that differ and the groups they make."""

    runs: list[RunRecord]
    keys: list[str]
    groups: list[Group]
    unfinished: list[RunRecord]

    @property
    def score(self) -> str:
        """The score the compared runs share (that of the first)."""
        return self.runs[0].score

    def metrics(self) -> list[str]:
        """The headline metrics present in the runs: pooled-test global score, mean and
        worst-10% personal score, the method's evaluation signals (fairness gaps, per-group
        accuracy: up to :data:`SIGNAL_COLUMNS`), epsilon."""
        s = self.score
        wanted = [f"global_test_{s}", f"global_client_{s}_worst10", f"personal_{s}_mean", f"personal_{s}_worst10"]
        present = [m for m in wanted if any(m in r.summary for r in self.runs)]
        signals = dict.fromkeys(k for r in self.runs for k in eval_signals(r.summary, s))
        present += list(signals)[:SIGNAL_COLUMNS]
        return present + (["epsilon"] if any("epsilon" in r.summary for r in self.runs) else [])


SIGNAL_COLUMNS = 4  # evaluation signals a comparison table shows at most


def find_runs(paths: list[str | Path]) -> list[Path]:
    """Run directories named by ``paths``: a run directory itself, a sweep folder (its
    runs in plan order) or any folder whose subfolders are runs."""
    found: list[Path] = []
    for p in map(Path, paths):
        if (p / CONFIG_FILE).is_file():
            found.append(p)
        elif (p / SWEEP_FILE).is_file():
            found += sorted(d for d in (p / RUNS_DIR).glob("*") if (d / CONFIG_FILE).is_file())
        elif p.is_dir() and any((d / CONFIG_FILE).is_file() for d in p.iterdir()):
            found += sorted(d for d in p.iterdir() if (d / CONFIG_FILE).is_file())
        else:
            raise RunDirError(f"'{p}' is neither a run directory, a sweep folder nor a folder of runs")
    if not found:
        raise RunDirError("no runs to compare")
    return found


def load_run(path: Path) -> RunRecord:
    """The :class:`RunRecord` of run directory ``path`` (summary None if it has none yet)."""
    summary = path / SUMMARY_FILE
    return RunRecord(
        path, dotted_keys(read_json(path / CONFIG_FILE)), read_metrics(path / "metrics.jsonl"),
        read_json(summary) if summary.is_file() else None,
    )


def compare_runs(paths: list[str | Path]) -> Comparison:
    """Load the runs under ``paths``; group the finished ones by every key that differs."""
    records = [load_run(p) for p in find_runs(paths)]
    finished = [r for r in records if r.finished]
    unfinished = [r for r in records if not r.finished]
    if not finished:
        raise RunDirError(f"none of the {len(records)} runs has finished (no {SUMMARY_FILE})")
    scores = {r.score for r in finished}
    if len(scores) > 1:
        raise RunDirError("these runs score different tasks (accuracy and mse); compare each task on its own")
    keys = differing_keys([r.config for r in finished])
    groups: dict[tuple, Group] = {}
    for run in finished:
        values = {k: run.config.get(k) for k in keys}
        groups.setdefault(_freeze(values), Group(values)).runs.append(run)
    return Comparison(finished, keys, list(groups.values()), unfinished)


def differing_keys(configs: list[dict[str, Any]]) -> list[str]:
    """Dotted config keys whose value is not the same in every config, the seed excepted,
    in the order they first appear."""
    keys: dict[str, None] = {}
    for config in configs:
        keys.update(dict.fromkeys(config))
    return [k for k in keys if k != SEED_KEY and len({_freeze(c.get(k)) for c in configs}) > 1]


def final(run: RunRecord, metric: str) -> float | None:
    """``metric``'s final value from the run's summary; None without a summary, the metric or a number."""
    value = run.summary.get(metric) if run.summary else None
    return float(value) if isinstance(value, (int, float)) else None


def best(run: RunRecord, metric: str) -> float | None:
    """The best value of ``metric`` over the evaluated rounds (epsilon: none)."""
    values = [float(r[metric]) for r in run.rows if isinstance(r.get(metric), (int, float))]
    if not values or metric == "epsilon":
        return None
    lower_better = metric.endswith(("_mse", "loss")) or "_mse_" in metric
    return min(values) if lower_better else max(values)


def mean_std(values: list[float | None]) -> tuple[float, float, int]:
    """Mean, sample standard deviation (ddof 1; 0 for one value) and count of the values given."""
    xs = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if xs.size == 0:
        return math.nan, math.nan, 0
    return float(xs.mean()), float(xs.std(ddof=1)) if xs.size > 1 else 0.0, int(xs.size)


def column_name(metric: str, score: str) -> str:
    """A short column title: ``global_test_accuracy`` -> ``accuracy``, ``personal_accuracy_mean``
    -> ``personal accuracy``, ``..._worst10`` -> ``worst-10% ...``."""
    if metric.startswith("global_test_") and metric != f"global_test_{score}":
        return metric.removeprefix("global_test_")
    names = {f"global_test_{score}": score, f"global_client_{score}_worst10": f"worst-10% {score}",
             f"personal_{score}_mean": f"personal {score}", f"personal_{score}_worst10": f"personal worst-10% {score}"}
    return names.get(metric, metric)


def table_rows(comparison: Comparison) -> list[dict[str, Any]]:
    """One row per group: its key values, seeds, and (mean, std, n) of each metric's final
    value, and of the best round's for the mean scores (not the worst-10% ones, nor epsilon)."""
    rows = []
    score = comparison.score
    for group in comparison.groups:
        row: dict[str, Any] = {"group": group.label(), **group.values,
                               "seeds": sorted(r.config.get(SEED_KEY) for r in group.runs)}
        for metric in comparison.metrics():
            name = column_name(metric, score)
            row[f"final {name}"] = mean_std([final(r, metric) for r in group.runs])
            if metric in (f"global_test_{score}", f"personal_{score}_mean"):
                row[f"best {name}"] = mean_std([best(r, metric) for r in group.runs])
        rows.append(row)
    return rows


def format_table(comparison: Comparison, markdown: bool = False) -> str:
    """The comparison as an aligned text table (or a Markdown table)."""
    rows = table_rows(comparison)
    metric_cols = [c for c in rows[0] if c.startswith(("final ", "best "))]
    shorts = short_keys(comparison.keys)
    header = [*shorts, "n", *metric_cols]
    body = []
    for row in rows:
        cells = [_show(row[k]) for k in comparison.keys] + [str(len(row["seeds"]))]
        cells += [_mean_std(row[c]) for c in metric_cols]
        body.append(cells)
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(cells) + " |" for cells in body]
    else:
        widths = [max(len(h), *(len(c[i]) for c in body)) for i, h in enumerate(header)]
        lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
        lines += ["  ".join(c.ljust(w) for c, w in zip(cells, widths)) for cells in body]
    notes = [(f"mean ± sample std over the n seeds of each group; 'best' is the best evaluated round on test data "
              f"(optimistic); {len(comparison.runs)} finished runs")]
    if not comparison.keys:
        notes.append("the runs differ only in their seed")
    if comparison.unfinished:
        notes.append(f"{len(comparison.unfinished)} unfinished runs left out: "
                     + ", ".join(r.path.name for r in comparison.unfinished))
    return "\n".join(lines + [""] + [("- " if markdown else "") + n for n in notes])


def to_json(comparison: Comparison) -> dict[str, Any]:
    """The comparison as a JSON-ready dict: keys, score, per-group rows with (mean, std, n) per metric, runs."""
    rows = []
    for row in table_rows(comparison):
        out = {k: v for k, v in row.items() if not isinstance(v, tuple)}
        out["metrics"] = {k: {"mean": _nan_none(v[0]), "std": _nan_none(v[1]), "n": v[2]}
                          for k, v in row.items() if isinstance(v, tuple)}
        rows.append(out)
    return {"keys": comparison.keys, "score": comparison.score, "groups": rows,
            "runs": [str(r.path) for r in comparison.runs], "unfinished": [str(r.path) for r in comparison.unfinished]}


def _mean_std(stat: tuple[float, float, int]) -> str:
    mean, std, n = stat
    if n == 0:
        return "-"
    return f"{mean:.4f}" if n == 1 else f"{mean:.4f} ± {std:.4f}"


def _show(value: Any) -> str:
    return "none" if value is None else str(value)


def _nan_none(x: float) -> float | None:
    return None if math.isnan(x) else x


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value
