"""PNG plots of a run: learning curves (with the configured extra metrics) and the per-client
score distribution."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

LEARNING_CURVES_FILE = "learning_curves.png"
CLIENT_HISTOGRAM_FILE = "client_scores.png"
MAX_EXTRA_CURVES = 12


def extra_metric_curves(rows: list[dict[str, Any]], score: str) -> list[tuple[str, str]]:
    """(key, label) of the metrics beyond loss and score (``eval.metrics``) in ``rows``: the
    global model on the pooled test set, and the personal models' mean over clients."""
    global_keys: dict[str, None] = {}
    personal_keys: dict[str, None] = {}
    for row in rows:
        for key in row:
            if key.startswith("global_test_") and key not in (f"global_test_{score}", "global_test_loss"):
                global_keys[key] = None
            elif (
                key.startswith("personal_") and key.endswith("_mean") and not key.endswith("_weighted_mean")
                and key != f"personal_{score}_mean"
            ):
                personal_keys[key] = None
    curves = [(k, f"{k.removeprefix('global_test_')} (global, pooled test)") for k in global_keys]
    curves += [(k, f"{k.removeprefix('personal_').removesuffix('_mean')} (personal, mean)") for k in personal_keys]
    return curves[:MAX_EXTRA_CURVES]


def plot_learning_curves(rows: list[dict[str, Any]], score: str, path: Path, title: str = "") -> Path:
    """Score (left) and loss (middle) per round, for every model that was evaluated, and the
    configured extra metrics (right: fairness gaps, AUPRC, per-group accuracy) if any."""
    extra = extra_metric_curves(rows, score)
    fig = Figure(figsize=(15 if extra else 10, 4))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3 if extra else 2)
    ax_score, ax_loss = axes[0], axes[1]
    curves = [
        (f"global_test_{score}", "global model, pooled test"),
        (f"personal_{score}_mean", "personal models, mean over clients"),
        (f"global_val_{score}", "global model, validation"),
    ]
    for key, label in curves:
        pts = [(r["round"], r[key]) for r in rows if key in r]
        if pts:
            ax_score.plot(*zip(*pts), marker=".", label=label)
    for key, label in (("train_loss", "local training loss"), ("global_test_loss", "pooled test loss")):
        pts = [(r["round"], r[key]) for r in rows if key in r]
        if pts:
            ax_loss.plot(*zip(*pts), marker=".", label=label)
    ax_score.set(xlabel="round", ylabel=score, title=f"{score} per round")
    ax_loss.set(xlabel="round", ylabel="loss", title="loss per round")
    if extra:
        ax_extra = axes[2]
        for key, label in extra:
            pts = [(r["round"], r[key]) for r in rows if key in r]
            ax_extra.plot(*zip(*pts), marker=".", label=label, linestyle="--" if key.startswith("personal_") else "-")
        ax_extra.set(xlabel="round", ylabel="value", title="other metrics per round")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return Path(path)


def plot_client_histogram(clients: list[dict[str, Any]], score: str, path: Path, title: str = "") -> Path:
    """Histogram over clients of the final global-model and personal-model scores."""
    fig = Figure(figsize=(6, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for kind in ("global", "personal"):
        values = [c[f"{kind}_{score}"] for c in clients if f"{kind}_{score}" in c]
        if values:
            ax.hist(values, bins=min(20, max(5, len(values) // 2)), alpha=0.6, label=f"{kind} model")
    ax.set(xlabel=f"{score} on the client's own test split", ylabel="clients", title=title or f"per-client {score}")
    if ax.patches:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return Path(path)
