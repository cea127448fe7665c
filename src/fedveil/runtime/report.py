"""Plots of a finished (or running) run, rebuilt from its files alone (``fedveil report``)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..data.label_plot import plot_label_distribution
from .plots import (
    CLIENT_SCORES_FILE,
    LEARNING_CURVES_FILE,
    PRIVACY_CURVE_FILE,
    plot_client_scores,
    plot_learning_curves,
    plot_privacy_curve,
    privacy_target,
)
from .signals import algorithm_labels
from .run_dir import CLIENT_METRICS_FILE, SUMMARY_FILE, RunDirectory, read_json, read_run

PARTITION_FILE = "partition.json"
LABEL_DISTRIBUTION_FILE = "label_distribution.png"


def privacy_curve(run: RunDirectory, rows: list[dict[str, Any]], config: dict[str, Any], title: str) -> list[Path]:
    """Draw the run's ``privacy_curve.png``; nothing for a run without DP."""
    summary = read_json(run.file(SUMMARY_FILE)) if run.file(SUMMARY_FILE).exists() else None
    level, delta = config["privacy"]["level"], config["privacy"]["delta"]
    target, title = privacy_target(config, summary), f"{title} ({level}-level DP, delta {delta:g})"
    png = plot_privacy_curve(rows, run.file(PRIVACY_CURVE_FILE), target, title, level)
    return [] if png is None else [png]


def run_score(rows: list[dict[str, Any]]) -> str:
    """The task's score in a run's rows: ``mse`` when the models' scores are MSEs (a method's
    own ``reconstruction_mse`` signal does not count), else ``accuracy``."""
    scored = ("global_test_", "global_client_", "personal_", "global_val_", "personal_val_")
    return "mse" if any(k.startswith(tuple(p + "mse" for p in scored)) for r in rows for k in r) else "accuracy"


def write_report(path: str | Path) -> list[Path]:
    """Write the PNG plots of run directory ``path``; returns the files written."""
    run, rows, config = read_run(path)
    title = f"{config['algorithm']['name']} on {config['data']['name']}"
    score = run_score(rows)
    labels = algorithm_labels(config["algorithm"]["name"])
    written = [plot_learning_curves(rows, score, run.file(LEARNING_CURVES_FILE), title, labels)]
    written += privacy_curve(run, rows, config, title)
    if run.file(CLIENT_METRICS_FILE).exists():
        clients = read_json(run.file(CLIENT_METRICS_FILE))
        png = plot_client_scores(clients, score, run.file(CLIENT_SCORES_FILE), title)
        written += [] if png is None else [png]
    if run.file(PARTITION_FILE).exists():
        partition = read_json(run.file(PARTITION_FILE))
        if partition.get("label_counts"):
            out = run.file(LABEL_DISTRIBUTION_FILE)
            plot_label_distribution(
                np.asarray(partition["label_counts"]), out, f"{config['data']['name']}: training labels per client"
            )
            written.append(out)
    return written
