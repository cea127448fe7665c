"""PNG plots of a run: learning curves (with the configured extra metrics), the privacy spent
per round (DP runs only) and the per-client scores. Each ``*_figure`` function builds the
figure; each ``plot_*`` function writes it."""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from .signals import eval_signals, method_signals, signal_label

LEARNING_CURVES_FILE = "learning_curves.png"
PRIVACY_CURVE_FILE = "privacy_curve.png"
CLIENT_SCORES_FILE = "client_scores.png"
MAX_EXTRA_CURVES = 12
MARKERS_MAX_POINTS = 30  # markers on a line of at most this many points
CLIENT_LINES_MAX = 20  # per-client epsilon curves as thin lines up to this many clients, a band above
DPI = 110


def new_figure(width: float, height: float) -> Figure:
    """A ``width`` x ``height`` inch figure with an Agg canvas (no pyplot, no display)."""
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def save(fig: Figure, path: Path) -> Path:
    """Lay out ``fig`` tightly and write it to ``path`` at :data:`DPI`; return the path."""
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    return Path(path)


def score_label(score: str) -> str:
    """Axis label of a score, saying which way is better (``mse``: lower)."""
    return f"{score} (lower is better)" if score == "mse" else f"{score} (higher is better)"


def round_axis(ax: Axes) -> None:
    """x axis in rounds: integer ticks only, however few rounds."""
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10], min_n_ticks=1))
    lo, hi = ax.get_xlim()
    if hi - lo < 1:  # a single round: one tick, not fractions around it
        centre = round((lo + hi) / 2)
        ax.set_xlim(centre - 0.5, centre + 0.5)


def finish_axes(ax: Axes, legend: bool = True) -> None:
    """A light grid, and the legend if ``legend`` and the axes have lines."""
    ax.grid(alpha=0.3)
    if legend and ax.lines:
        ax.legend(fontsize=8)


def legend_below(ax: Axes, handles: Sequence[Any] = (), labels: Sequence[str] = ()) -> None:
    """The legend (and extra entries) under the axes, where it covers no data."""
    own_handles, own_labels = ax.get_legend_handles_labels()
    ax.legend([*own_handles, *handles], [*own_labels, *labels], fontsize=8, loc="upper center",
              bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)


def per_round(rows: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """``(round, value)`` of every row that has ``key``."""
    return [(r["round"], r[key]) for r in rows if key in r]


def extra_metric_curves(rows: list[dict[str, Any]], score: str) -> list[tuple[str, str]]:
    """(key, label) of the metrics beyond loss and score (``eval.metrics``) in ``rows``: the
    global model on the pooled test set, and the personal models' mean over clients."""
    global_keys = dict.fromkeys(key for row in rows for key in eval_signals(row, score))
    personal_keys = dict.fromkeys(
        key for row in rows for key in row
        if key.startswith("personal_") and key.endswith("_mean") and not key.endswith("_weighted_mean")
        and key != f"personal_{score}_mean"
    )
    curves = [(k, f"{k.removeprefix('global_test_')} (global, pooled test)") for k in global_keys]
    curves += [(k, f"{k.removeprefix('personal_').removesuffix('_mean')} (personal, mean)") for k in personal_keys]
    return curves[:MAX_EXTRA_CURVES]


MARKED_POINTS = 30  # a curve marks about this many of its points, however long the run
SMOOTH_ABOVE = 200  # curves of more points are drawn faint, with their running mean on top


def draw_curves(ax: Axes, rows: list[dict[str, Any]], curves: list[tuple[str, str]]) -> None:
    """One line per (key, label): markers on about :data:`MARKED_POINTS` points; a curve of
    more than :data:`SMOOTH_ABOVE` points (a 4,000-round run's training loss) drawn faint
    with its running mean over 1/50 of its length on top, so its trend stays readable."""
    for key, label in curves:
        pts = per_round(rows, key)
        if not pts:
            continue
        x, y = (np.asarray(v, dtype=float) for v in zip(*pts))
        style = "--" if key.startswith("personal_") else "-"
        every = max(1, len(x) // MARKED_POINTS)
        if len(x) <= SMOOTH_ABOVE:
            ax.plot(x, y, marker=".", markevery=every, label=label, linestyle=style)
            continue
        (faint,) = ax.plot(x, y, linestyle=style, linewidth=0.6, alpha=0.3)
        window = max(2, len(x) // 50)
        smooth = np.convolve(y, np.ones(window) / window, mode="valid")
        ax.plot(x[window - 1:], smooth, color=faint.get_color(), linestyle=style, marker=".", markevery=every,
                label=f"{label} (running mean of {window})")


SHARE_SCALE = 1.5  # signals whose values all lie within +-this are shares, ratios, weights or accuracies


def draw_signals(ax: Axes, rows: list[dict[str, Any]], signals: list[tuple[str, str]]) -> None:
    """The method's signals: shares and ratios on the left axis, counts (parameters, MACs,
    bits) on a log-scaled right axis in dashes, so that neither flattens the other."""
    def largest(key: str) -> float:
        return max((abs(float(r[key])) for r in rows if key in r), default=0.0)

    shares = [(k, label) for k, label in signals if largest(k) <= SHARE_SCALE]
    counts = [(k, f"{label} (right, log)") for k, label in signals if largest(k) > SHARE_SCALE]
    draw_curves(ax, rows, shares)
    ax.set(ylabel="share / ratio / weight" if shares else "", title="method signals per round (client mean)")
    if counts:
        right = ax.twinx()
        for i, (key, label) in enumerate(counts):
            pts = [(x, y) for x, y in per_round(rows, key) if y > 0]
            if pts:
                right.plot(*zip(*pts), color=f"C{(i + len(shares)) % 10}", linestyle="--", marker=".",
                           markevery=max(1, len(pts) // MARKED_POINTS), label=label)
        right.set_yscale("log")
        right.set_ylabel("count (log scale)")


def learning_curves_figure(
    rows: list[dict[str, Any]], score: str, title: str = "", labels: dict[str, str] | None = None,
) -> Figure:
    """Score and loss per round, for every model that was evaluated, the configured extra
    metrics (fairness gaps, AUPRC, per-group accuracy) if any, and the method's own signals
    (:mod:`.signals`; named by ``labels``, the algorithm's ``signal_labels``) if any."""
    extra = extra_metric_curves(rows, score)
    signals = [(k, signal_label(k, labels or {})) for k in method_signals(rows)][:MAX_EXTRA_CURVES]
    panels = 2 + bool(extra) + bool(signals)
    if panels == 4:  # two rows: score and loss above, the metrics' and the method's panels below
        fig = new_figure(16, 8.4)
        axes = list(fig.subplots(2, 2).flat)
    else:
        fig = new_figure(18 if panels == 3 else 10, 4.2)
        axes = list(fig.subplots(1, panels))
    draw_curves(axes[0], rows, [
        (f"global_test_{score}", "global model, pooled test"),
        (f"personal_{score}_mean", "personal models, mean over clients"),
        (f"global_val_{score}", "global model, validation"),
    ])
    draw_curves(axes[1], rows, [("train_loss", "local training loss"), ("global_test_loss", "pooled test loss")])
    axes[0].set(ylabel=score_label(score), title=f"{score} per round")
    axes[1].set(ylabel="loss", title="loss per round")
    side = []  # panels whose many curves get their legend beside them
    if extra:
        draw_curves(axes[2], rows, extra)
        axes[2].set(ylabel="value", title="other metrics per round")
        side.append(axes[2])
    if signals:
        draw_signals(axes[-1], rows, signals)
        side.append(axes[-1])
    for ax in axes:
        round_axis(ax)
        finish_axes(ax)
    for ax in side:  # with a twin axis's lines too (the method's counts)
        handles, names = [], []
        siblings = ax.get_shared_x_axes().get_siblings(ax)
        for sibling in siblings:
            more = sibling.get_legend_handles_labels()
            handles, names = handles + more[0], names + more[1]
        ax.legend(handles, names, fontsize=7, loc="upper left", bbox_to_anchor=(1.12 if len(siblings) > 1 else 1.02, 1),
                  frameon=False)
    if title:
        fig.suptitle(title)
    return fig


def plot_learning_curves(
    rows: list[dict[str, Any]], score: str, path: Path, title: str = "", labels: dict[str, str] | None = None,
) -> Path:
    """Write :func:`learning_curves_figure` to ``path``."""
    return save(learning_curves_figure(rows, score, title, labels), path)


def privacy_target(config: dict[str, Any], summary: dict[str, Any] | None) -> float | None:
    """The epsilon a DP run aims at: ``privacy.epsilon``, else the plan in ``summary.json``
    (``planned_epsilon``, or the largest ``planned_epsilon_per_client``); None if unknown."""
    if config.get("privacy", {}).get("epsilon") is not None:
        return float(config["privacy"]["epsilon"])
    summary = summary or {}
    if summary.get("planned_epsilon") is not None:
        return float(summary["planned_epsilon"])
    if summary.get("planned_epsilon_per_client"):
        return float(max(summary["planned_epsilon_per_client"]))
    return None


def draw_client_epsilons(ax: Axes, rows: list[dict[str, Any]]) -> None:
    """Each client's epsilon per round: thin lines for a few clients, a min..max band for many."""
    pts = per_round(rows, "epsilon_per_client")
    if not pts:
        return
    rounds, spent = np.array([r for r, _ in pts]), np.array([e for _, e in pts], dtype=float)
    marker = "." if len(rounds) == 1 else None  # a one-point line shows only its marker
    if spent.shape[1] <= CLIENT_LINES_MAX:
        ax.plot(rounds, spent, color="0.55", lw=0.8, alpha=0.8, marker=marker)
        ax.lines[-1].set_label("each client")
    else:
        ax.fill_between(rounds, spent.min(axis=1), spent.max(axis=1), color="C0", alpha=0.2, lw=0,
                        label=f"range over {spent.shape[1]} clients")
        ax.plot(rounds, np.median(spent, axis=1), color="C0", lw=1, marker=marker, label="median client")


def privacy_figure(
    rows: list[dict[str, Any]], target: float | None = None, title: str = "", level: str = "example"
) -> Figure | None:
    """Epsilon spent after each round (the largest over clients at example ``level``, the
    population's at client level), with the per-client curves when rows carry them and the
    target as a dashed line; None for rows without ``epsilon``."""
    spent = per_round(rows, "epsilon")
    if not spent:
        return None
    fig = new_figure(7, 4.2)
    ax = fig.add_subplot()
    draw_client_epsilons(ax, rows)
    label = "epsilon, largest over clients" if level == "example" else "epsilon of the population"
    ax.plot(*zip(*spent), marker=".", color="C3", lw=2, label=label)
    if target is not None:
        ax.axhline(target, color="k", ls="--", lw=1, label=f"planned epsilon {target:.3g}")
    ax.set(ylabel="epsilon spent so far", title="privacy spent per round")
    ax.set_ylim(bottom=0)
    round_axis(ax)
    finish_axes(ax, legend=False)
    legend_below(ax)
    if title:
        fig.suptitle(title)
    return fig


def plot_privacy_curve(
    rows: list[dict[str, Any]], path: Path, target: float | None = None, title: str = "", level: str = "example"
) -> Path | None:
    """Write :func:`privacy_figure` to ``path``; nothing (None) for a run without DP."""
    fig = privacy_figure(rows, target, title, level)
    return None if fig is None else save(fig, path)


def draw_sorted_scores(ax: Axes, values: np.ndarray, higher_is_better: bool, label: str, color: str) -> None:
    """One model's client scores sorted worst first (x: % of clients), its mean (dashed) and the
    mean of its worst 10% (a thick segment over those clients)."""
    n = len(values)
    ordered = np.sort(values) if higher_is_better else np.sort(values)[::-1]
    x = 100 * (np.arange(n) + 0.5) / n
    k = max(1, math.ceil(0.1 * n))
    mean, worst = float(values.mean()), float(ordered[:k].mean())
    ax.plot(x, ordered, color=color, marker="o" if n <= MARKERS_MAX_POINTS else None, ms=4,
            label=f"{label}: mean {mean:.3g}, worst 10% {worst:.3g}")
    if n > 1:
        ax.axhline(mean, color=color, ls="--", lw=1)
        ax.hlines(worst, 0, 100 * k / n, color=color, lw=3, alpha=0.8)


def client_scores_figure(clients: list[dict[str, Any]], score: str, title: str = "") -> Figure:
    """Every client's final score, global and personal models on the same axes: clients sorted
    from worst to best, with the mean over clients and the mean of the worst 10%."""
    fig = new_figure(7.5, 4.8)
    ax = fig.add_subplot()
    higher = score != "mse"
    n = 0
    for kind, color in (("global", "C0"), ("personal", "C1")):
        values = np.array([c[f"{kind}_{score}"] for c in clients if c.get(f"{kind}_{score}") is not None], float)
        if len(values):
            draw_sorted_scores(ax, values, higher, f"{kind} model", color)
            n = max(n, len(values))
    if n > 1:
        ax.axvspan(0, 100 * math.ceil(0.1 * n) / n, color="0.5", alpha=0.12, lw=0)
    ax.set_xlim(0, 100)
    ax.set(xlabel=f"clients sorted from worst to best (% of {n} client{'s' * (n != 1)})", ylabel=score_label(score),
           title=f"final {score} of each client, on its own test split")
    finish_axes(ax, legend=False)
    if n > 1:
        keys = [Line2D([], [], color="0.3", ls="--", lw=1), Line2D([], [], color="0.3", lw=3), Patch(color="0.88")]
        legend_below(ax, keys, ["mean over clients", "mean of the worst 10%", "worst 10% of clients"])
    elif n:
        legend_below(ax)
    if title:
        fig.suptitle(title)
    return fig


def plot_client_scores(clients: list[dict[str, Any]], score: str, path: Path, title: str = "") -> Path | None:
    """Write :func:`client_scores_figure` to ``path``; nothing (None) when no client has a
    score (no client test split, ``data.test_fraction = 0``)."""
    if not any(c.get(f"{kind}_{score}") is not None for c in clients for kind in ("global", "personal")):
        return None
    return save(client_scores_figure(clients, score, title), path)
