"""PNG plots of a :class:`~fedveil.runtime.compare.Comparison`: the groups' learning curves
overlaid (mean over seeds, a band of one standard deviation), and the final score against
the epsilon spent (DP runs)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.ticker import FuncFormatter, NullFormatter

from .compare import Comparison, Group, final, mean_std, short_keys
from .plots import new_figure, round_axis, save, score_label

CURVES_FILE = "compare_curves.png"
EPSILON_FILE = "compare_epsilon.png"
EPSILON_KEY = "privacy.epsilon"


def headline(comparison: Comparison) -> str:
    """The metric the plots show: the global model's pooled test score, or the personal
    models' mean where no run has a global model."""
    s = comparison.score
    metric = f"global_test_{s}"
    return metric if any(metric in r.summary for r in comparison.runs) else f"personal_{s}_mean"


def group_curve(group: Group, metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rounds evaluated in every run of the group, and the mean and std of ``metric`` there."""
    per_run = [{r["round"]: r[metric] for r in run.rows if isinstance(r.get(metric), (int, float))} for run in group.runs]
    rounds = sorted(set.intersection(*(set(c) for c in per_run)))
    values = np.array([[c[k] for k in rounds] for c in per_run], dtype=float).reshape(len(per_run), len(rounds))
    std = values.std(axis=0, ddof=1) if len(per_run) > 1 else np.zeros(len(rounds))
    return np.array(rounds), values.mean(axis=0), std


def plot_curves(comparison: Comparison, path: Path) -> Path:
    """Score and training loss per round, one line per group."""
    metric = headline(comparison)
    fig = new_figure(11, 4.2)
    for ax, key, ylabel in (
        (fig.add_subplot(1, 2, 1), metric, f"{metric}: {score_label(comparison.score)}"),
        (fig.add_subplot(1, 2, 2), "train_loss", "mean local training loss"),
    ):
        for group in comparison.groups:
            rounds, mean, std = group_curve(group, key)
            if not len(rounds):
                continue
            line = ax.plot(rounds, mean, label=f"{group.label()} (n={len(group.runs)})", lw=1.5,
                           marker="o" if len(rounds) <= 30 else None, ms=3)[0]
            if len(group.runs) > 1:
                ax.fill_between(rounds, mean - std, mean + std, color=line.get_color(), alpha=0.18, lw=0)
        ax.set_ylabel(ylabel)
        round_axis(ax)
        ax.grid(alpha=0.3)
    fig.axes[0].legend(fontsize=8, loc="best")
    fig.suptitle("runs compared: mean over seeds, band = ±1 std", fontsize=10)
    return save(fig, path)


def plot_epsilon(comparison: Comparison, path: Path) -> Path | None:
    """Final score against the epsilon spent (mean ± std over seeds), one line per group of
    the other differing keys; runs without DP as dashed horizontal lines. None when no run
    spent privacy."""
    metric = headline(comparison)
    others = [k for k in comparison.keys if k != EPSILON_KEY and not k.startswith("privacy.level")]
    series: dict[tuple, dict[str, list]] = {}
    for group in comparison.groups:
        key = tuple(str(group.values.get(k)) for k in others)
        series.setdefault(key, {"dp": [], "plain": []})
        dp = [r for r in group.runs if final(r, "epsilon") is not None]
        plain = [r for r in group.runs if final(r, "epsilon") is None]
        if dp:
            x = mean_std([final(r, "epsilon") for r in dp])
            y = mean_std([final(r, metric) for r in dp])
            series[key]["dp"].append((x, y))
        if plain:
            series[key]["plain"].append(mean_std([final(r, metric) for r in plain]))
    if not any(s["dp"] for s in series.values()):
        return None
    fig = new_figure(7, 4.5)
    ax = fig.add_subplot(1, 1, 1)
    shorts = short_keys(others)
    for key, s in series.items():
        name = ", ".join(f"{n}={v}" for n, v in zip(shorts, key)) or metric
        points = sorted(s["dp"], key=lambda p: p[0][0])
        line = None
        if points:
            xs = [p[0][0] for p in points]
            ys = [p[1][0] for p in points]
            es = [p[1][1] for p in points]
            line = ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=name)[0]
        for mean, std, n in s["plain"]:
            color = line.get_color() if line is not None else None
            ax.axhline(mean, ls="--", lw=1, color=color, label=f"{name}, no DP (n={n})")
    xs_all = [p[0][0] for s in series.values() for p in s["dp"]]
    if min(xs_all) > 0 and max(xs_all) / min(xs_all) >= 8:
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
    ticks = sorted({round(x, 2) for x in xs_all})
    if len(ticks) <= 12:  # the epsilons run, as plain numbers
        ax.set_xticks(ticks)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.set_xlabel("epsilon spent (final, mean over seeds)")
    ax.set_ylabel(f"final {metric}: {score_label(comparison.score)}")
    ax.set_title("final score vs privacy: mean ± std over seeds", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, path)


def write_plots(comparison: Comparison, out: Path) -> list[Path]:
    """Write the comparison's PNGs into folder ``out``; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [plot_curves(comparison, out / CURVES_FILE)]
    eps = plot_epsilon(comparison, out / EPSILON_FILE)
    return written + ([eps] if eps is not None else [])


__all__ = ["CURVES_FILE", "EPSILON_FILE", "group_curve", "headline", "plot_curves", "plot_epsilon", "write_plots"]
