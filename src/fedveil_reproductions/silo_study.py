"""Utility vs epsilon and lambda of personalised methods under silo-specific DP: the grid
runner, report rows and plot shared by the MR-MTL reproductions (Liu et al. 2022, spec 002
§6.1: Fig. 1.3, 1.5, 1.6, G.2, G.3).

A study runs every method at every epsilon and seed on the same data and training
settings (a :class:`SiloTask` writes each run's config). A run's score is the test metric
of the model each silo would use (its personal model for personalised methods, the global
model for FedAvg), averaged over silos weighted by their test sizes, after the last round.
Finished runs are re-scored from their run directory, not retrained, so an interrupted
study resumes where it stopped.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from fedveil.reproduce import PlannedRun, ResultRow, Summaries, run_plan

NON_PRIVATE = math.inf
Results = dict[str, dict[str, list[float]]]  # method label -> epsilon label -> one score per seed


@dataclass
class SiloStudy:
    """What a study varies. ``baselines`` are names from :func:`baseline_algorithms`; MR-MTL
    runs at every lambda in ``lambdas``. Every cell runs ``seeds``; the cells at
    ``focus_epsilons`` (where a claim is checked) also run ``focus_seeds``."""

    epsilons: list[float]
    lambdas: list[float]
    seeds: list[int] = field(default_factory=lambda: [0])
    focus_epsilons: list[float] = field(default_factory=list)
    focus_seeds: list[int] = field(default_factory=list)
    rounds: int = 200
    lr: float = 0.01
    baselines: list[str] = field(default_factory=lambda: ["local", "fedavg", "finetune", "ditto"])
    ditto_lambda: float = 1.0
    clusters: int = 4  # IFCA
    select_fraction: float = 0.05  # IFCA: fraction of rounds with a private cluster selection (Fig. 1.6: 5%)
    ifca_lambda: float = 1.0  # IFCA-warm-started MR-MTL
    extra_methods: dict[str, dict[str, Any]] = field(default_factory=dict)  # label -> [algorithm] (ablations)
    eval_every: int = 0  # rounds between test evaluations (0: after the last round only)
    client_options: dict[str, Any] = field(default_factory=dict)  # more [client] settings, e.g. an lr schedule

    def seeds_at(self, epsilon: float) -> list[int]:
        return self.seeds + (self.focus_seeds if epsilon in self.focus_epsilons else [])


@dataclass(frozen=True)
class SiloTask:
    """One data set's runs: ``config(algorithm, epsilon, seed, study)`` is a run config."""

    name: str
    metric: str  # "mse" or "accuracy": the stem of the summary keys scored
    config: Callable[[dict, float, int, SiloStudy], dict]

    @property
    def lower_is_better(self) -> bool:
        return self.metric == "mse"

    @property
    def label(self) -> str:
        return "test MSE" if self.metric == "mse" else f"test {self.metric}"

    def score(self, summary: dict) -> float:
        """Test-size-weighted mean over silos of the metric of the model each silo uses."""
        personal = f"personal_{self.metric}_weighted_mean"
        return summary[personal] if personal in summary else summary[f"global_client_{self.metric}_weighted_mean"]

    def best(self, scores: dict[Any, float]) -> Any:
        """The key of the best score."""
        return (min if self.lower_is_better else max)(scores, key=scores.__getitem__)

    def better(self, a: float, b: float) -> bool:
        return a < b if self.lower_is_better else a > b


def baseline_algorithms(study: SiloStudy) -> dict[str, tuple[str, dict[str, Any]]]:
    """Baseline name -> (label, ``[algorithm]`` section)."""
    return {
        "local": ("local", {"name": "local"}),
        "fedavg": ("fedavg", {"name": "fedavg"}),
        "finetune": ("finetune", {"name": "fedavg_then_local", "switch_fraction": 0.5}),
        "ditto": (f"ditto(lam={study.ditto_lambda:g})", {"name": "ditto", "lam": study.ditto_lambda}),
        "ifca": (
            f"ifca({study.select_fraction:.0%})",
            {"name": "ifca", "clusters": study.clusters, "select_fraction": study.select_fraction},
        ),
        "ifca_mrmtl": (
            f"ifca({study.select_fraction:.0%})+mr_mtl(lam={study.ifca_lambda:g})",
            {"name": "ifca", "clusters": study.clusters, "select_fraction": study.select_fraction,
             "fedavg_fraction": study.select_fraction, "lam": study.ifca_lambda},
        ),
    }


def is_warm_start(algorithm: dict[str, Any]) -> bool:
    """Whether an ``[algorithm]`` section is the IFCA warm start (``ifca_mrmtl``): IFCA that
    hands over to MR-MTL towards each silo's cluster after its ``fedavg_fraction`` of rounds."""
    return algorithm["name"] == "ifca" and "fedavg_fraction" in algorithm


def mr_mtl_label(lam: float) -> str:
    return f"mr_mtl(lam={lam:g})"


def methods(study: SiloStudy) -> dict[str, dict[str, Any]]:
    """Method label -> ``[algorithm]`` section, baselines first."""
    known = baseline_algorithms(study)
    unknown = [b for b in study.baselines if b not in known]
    if unknown:
        raise ValueError(f"unknown baselines {unknown}; choose from {sorted(known)}")
    out = dict(known[b] for b in study.baselines)
    out.update({mr_mtl_label(lam): {"name": "mr_mtl", "lam": lam} for lam in study.lambdas})
    out.update(study.extra_methods)
    return out


def eps_label(epsilon: float) -> str:
    return "inf" if epsilon == NON_PRIVATE else f"{epsilon:g}"


def study_record(study: SiloStudy) -> dict[str, Any]:
    """The study's settings as JSON data for a report's ``extra`` (epsilons as labels: inf is not JSON)."""
    return study.__dict__ | {"epsilons": [eps_label(e) for e in study.epsilons]}


def example_privacy(epsilon: float, delta: float, clip: float) -> dict[str, Any]:
    """The ``[privacy]`` section: none at epsilon = inf, else example-level DP with Poisson batches."""
    if epsilon == NON_PRIVATE:
        return {"level": "none"}
    return {"level": "example", "epsilon": epsilon, "delta": delta, "clip": clip, "batch_sampling": "poisson"}


def run_dir_name(label: str, epsilon: float, seed: int) -> str:
    return f"{label}_eps{eps_label(epsilon)}_seed{seed}"


def grid_plan(study: SiloStudy, task: SiloTask, only: dict[str, list[str]] | None = None) -> list[PlannedRun]:
    """Every method x epsilon x seed (or only the epsilon labels ``only[method]``), one run
    each, named ``<method>_eps<e>_seed<s>``."""
    return [
        PlannedRun(run_dir_name(label, epsilon, seed), task.config(algorithm, epsilon, seed, study))
        for label, algorithm in methods(study).items() for epsilon in study.epsilons for seed in study.seeds_at(epsilon)
        if only is None or eps_label(epsilon) in only.get(label, [])
    ]


def grid_scores(summaries: Summaries, study: SiloStudy, task: SiloTask,
                only: dict[str, list[str]] | None = None) -> Results:
    """The scores of :func:`grid_plan`'s runs: method label -> epsilon label -> one per seed."""
    results: Results = {}
    for label in methods(study):
        for epsilon in study.epsilons:
            if only is not None and eps_label(epsilon) not in only.get(label, []):
                continue
            for seed in study.seeds_at(epsilon):
                summary = summaries[run_dir_name(label, epsilon, seed)]
                results.setdefault(label, {}).setdefault(eps_label(epsilon), []).append(task.score(summary))
    return results


def run_grid(runs_dir: Path, study: SiloStudy, task: SiloTask, only: dict[str, list[str]] | None = None) -> Results:
    """Run :func:`grid_plan` into ``runs_dir`` (through the sweep runner: finished runs are
    kept, an interrupted one resumes) and score it."""
    summaries = run_plan(grid_plan(study, task, only), runs_dir, plots=False)
    return grid_scores(summaries, study, task, only)


LearningRates = dict[str, dict[str, float]]  # method label -> epsilon label -> chosen lr


def lr_edge_notes(lrs: LearningRates, grid: list[float]) -> list[str]:
    """A note for each edge of the lr grid that some (method, epsilon) chose: a rate beyond
    it might score higher, so that cell's score is a lower bound on the tuned one."""
    notes = []
    for edge, side, beyond in ((min(grid), "lower", "smaller"), (max(grid), "upper", "larger")):
        cells = [f"{label} at eps={e}" for label, by_eps in lrs.items() for e, lr in by_eps.items() if lr == edge]
        if cells and len(grid) > 1:
            notes.append(f"the tuned lr is the grid's {side} edge ({edge:g}) for {len(cells)} cells ({', '.join(cells)}): "
                         f"a {beyond} rate might score higher there")
    return notes


def lr_rows(lrs: LearningRates, study: SiloStudy, setting: str = "", paper: str = "") -> list[ResultRow]:
    """One row per epsilon: the learning rate :func:`run_tuned_grid` chose for each method."""
    where = f"{setting}, " if setting else ""
    return [ResultRow(
        f"{where}eps={e}", "learning rate tuned per method (tuning seed, not reported)",
        "; ".join(f"{label} {by_eps[e]:g}" for label, by_eps in lrs.items()), paper,
    ) for e in map(eps_label, study.epsilons)]


def run_tuned_grid(runs_dir: Path, study: SiloStudy, task: SiloTask, lrs: list[float],
                   tune_seeds: list[int]) -> tuple[Results, LearningRates, dict[float, Results]]:
    """Every method's learning rate tuned per epsilon, as the paper tunes eta over a grid
    (spec 002 §5), but on ``tune_seeds`` whose runs are not reported: the returned scores
    are over ``study.seeds`` at the chosen rate, so the choice does not flatter them; then
    the chosen rates, and the tuning seeds' scores at every rate. Runs at rate ``lr`` live
    in ``runs_dir/lr<lr>/``."""
    tuning = {lr: run_grid(runs_dir / f"lr{lr:g}", replace(study, lr=lr, seeds=tune_seeds, focus_seeds=[]), task)
              for lr in lrs}
    chosen: LearningRates = {
        label: {e: task.best({lr: mean_score(tuning[lr], label, e) for lr in lrs}) for e in map(eps_label, study.epsilons)}
        for label in methods(study)
    }
    results: Results = {}
    for lr in lrs:
        picked = {label: [e for e in by_eps if by_eps[e] == lr] for label, by_eps in chosen.items()}
        if not any(picked.values()):
            continue
        part = run_grid(runs_dir / f"lr{lr:g}", replace(study, lr=lr), task, only=picked)
        for label, by_eps in part.items():
            results.setdefault(label, {}).update(by_eps)
    ordered = {label: dict(sorted(results[label].items(), key=lambda kv: _eps_order(study, kv[0]))) for label in methods(study)}
    return ordered, chosen, tuning


def _eps_order(study: SiloStudy, label: str) -> int:
    return [eps_label(e) for e in study.epsilons].index(label)


def mean_score(results: Results, method: str, eps: str) -> float:
    """Mean over seeds of ``method``'s score at epsilon label ``eps``."""
    return statistics.fmean(results[method][eps])


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def cell(values: list[float]) -> str:
    mean, std = mean_std(values)
    return f"{mean:.5f} ± {std:.5f} (n={len(values)})"


def best_lambda(results: Results, study: SiloStudy, task: SiloTask, eps: str) -> float:
    return task.best({lam: mean_score(results, mr_mtl_label(lam), eps) for lam in study.lambdas})


def score_rows(results: Results, study: SiloStudy, task: SiloTask, paper: dict[tuple[str, str], float],
               setting: str = "") -> list[ResultRow]:
    """One row per epsilon and method; ``paper[(eps label, method label)]`` where the paper has a number."""
    prefix = f"{setting}, " if setting else ""
    return [
        ResultRow(f"{prefix}eps={e}", f"{method}: {task.label}", cell(by_eps[e]), paper.get((e, method), "curve only"))
        for e in map(eps_label, study.epsilons) for method, by_eps in results.items()
    ]


def paired_gap(a: list[float], b: list[float]) -> tuple[float, float]:
    """Mean and standard error of a - b over seeds (runs of one seed share data split and
    initialisation, so the difference is paired); s.e. 0 for a single seed."""
    diffs = [x - y for x, y in zip(a, b)]
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0
    return statistics.fmean(diffs), se


def gap_text(name: str, gap: tuple[float, float]) -> str:
    """``vs local -0.00120 ± 0.00030 s.e. (beyond 2 s.e.)``: a paired gap and whether it is resolved."""
    mean, se = gap
    resolved = "beyond 2 s.e." if se > 0 and abs(mean) > 2 * se else "within 2 s.e." if se > 0 else "one seed"
    return f"vs {name} {mean:+.5f} ± {se:.5f} s.e. ({resolved})"


def beats_both_rows(results: Results, study: SiloStudy, task: SiloTask, expected: str, setting: str = "") -> list[ResultRow]:
    """Per epsilon: does MR-MTL at its best lambda beat both Local and FedAvg (§7 claim 3)?
    The measured text gives each paired gap (MR-MTL minus the baseline) with its standard
    error; a win on the means that is within 2 s.e. of a baseline is said to be so."""
    rows = []
    prefix = f"{setting}, " if setting else ""
    for e in map(eps_label, study.epsilons):
        lam = best_lambda(results, study, task, e)
        best = results[mr_mtl_label(lam)][e]
        mrmtl = mean_score(results, mr_mtl_label(lam), e)
        local, fedavg = mean_score(results, "local", e), mean_score(results, "fedavg", e)
        holds = task.better(mrmtl, local) and task.better(mrmtl, fedavg)
        gaps = {b: paired_gap(best, results[b][e]) for b in ("local", "fedavg")}
        unresolved = [b for b, (mean, se) in gaps.items() if abs(mean) <= 2 * se]
        verdict = ("does not hold" if not holds else "holds (one seed)" if len(best) < 2
                   else f"holds on the means, within 2 s.e. of {' and '.join(unresolved)}" if unresolved else "holds")
        rows.append(ResultRow(
            f"{prefix}eps={e}", "MR-MTL(best lambda) better than both Local and FedAvg",
            f"lambda*={lam:g}: {mrmtl:.5f} vs local {local:.5f}, fedavg {fedavg:.5f}; "
            + "; ".join(gap_text(b, gap) for b, gap in gaps.items()),
            expected, verdict,
        ))
    return rows


def lambda_trend_row(results: Results, study: SiloStudy, task: SiloTask, setting: str = "lambda sweep") -> list[ResultRow]:
    """Best lambda over the private epsilons, ascending: non-increasing as privacy loosens (claim 4)."""
    private = [eps_label(e) for e in sorted(study.epsilons) if e != NON_PRIVATE]
    if len(private) < 2:
        return []
    lams = [best_lambda(results, study, task, e) for e in private]
    grows = all(a >= b for a, b in zip(lams, lams[1:]))
    return [ResultRow(
        setting, "best lambda as epsilon grows " + " -> ".join(private), " -> ".join(f"{x:g}" for x in lams),
        "non-increasing (claim 4)", "holds" if grows else "does not hold",
    )]


def plot_study(results: Results, study: SiloStudy, task: SiloTask, path: Path, title: str) -> None:
    """Left: every method's metric vs epsilon (mean ± std over seeds). Right: MR-MTL vs
    lambda per epsilon, with Local (left end) and FedAvg (right end) as dashed levels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [eps_label(e) for e in study.epsilons]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    xs = range(len(labels))
    for method, by_eps in results.items():
        stats = [mean_std(by_eps[e]) for e in labels]
        left.errorbar(xs, [m for m, _ in stats], yerr=[s for _, s in stats], marker="o", capsize=3, label=method)
    left.set_xticks(list(xs), [f"eps={e}" for e in labels])
    left.set_ylabel(task.label)
    left.set_title(f"{title}: utility vs privacy")
    left.legend(fontsize=7)
    plot_lambda_panel(right, results, study, task, "MR-MTL vs lambda")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_lambda_panel(ax, results: Results, study: SiloStudy, task: SiloTask, title: str) -> None:
    """MR-MTL's metric vs lambda, one line per epsilon, Local and FedAvg as dashed levels."""
    for i, e in enumerate(eps_label(x) for x in study.epsilons):
        colour = f"C{i}"
        ax.plot(study.lambdas, [mean_score(results, mr_mtl_label(lam), e) for lam in study.lambdas],
                marker="o", color=colour, label=f"MR-MTL, eps={e}")
        for baseline, style in (("local", (0, (2, 2))), ("fedavg", (0, (6, 2)))):
            if baseline in results:
                ax.axhline(mean_score(results, baseline, e), color=colour, linestyle=style, linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("lambda (short dashes: Local, long dashes: FedAvg)")
    ax.set_ylabel(task.label)
    ax.set_title(title)
    ax.legend(fontsize=7)
