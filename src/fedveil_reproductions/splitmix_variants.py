"""Split-Mix under other budget distributions and contact rates (Hong et al. ICLR 2022
App. C.1.5, Figs. C.4 and C.5; spec 000 part 2 §A.1, §A.11; figures only, no numbers).

The digit domains, model and schedule of ``splitmix_digits``; Split-Mix against the
width-sliced baseline. ``splitmix_budgets`` (Fig. C.4) uses the reference code's budget settings: equal client groups in
client order (so budgets follow domains) ``8-4-2-1`` (the default), ``8-1-1-1``, ``8-2-1-1``,
``8-2-2-1`` (more budget-sufficient clients), ``8-4-4-1`` (more insufficient), ``8-4-8d3-2``
(steps of 1/8: 1/8, 1/4, 3/8, 1/2) and log-normal budgets ``ln0.5_0.4`` (scipy
``lognorm(0.5, scale=0.4)`` binned to widths 1/8 .. 1). The baseline is SHeteroFL for the
group settings and HeteroFL for the log-normal one (as the paper: slimmable training needs
the budgets on the 8-4-2-1 ladder). Each model is served at x0.125 .. x1.

``splitmix_contact`` (Fig. C.5) keeps the 8-4-2-1 budgets and lowers the clients per round
(2, 5, 10 and all 20; the paper: 2 .. all 50).

Claims checked (the figures' direction): under every setting Split-Mix is at least as
accurate as the baseline at the widest width the setting offers; fewer clients per round
lower Split-Mix's accuracy (Fig. C.5).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from fedveil.reproduce import (
    REPRODUCTIONS,
    PlannedRun,
    Reproduction,
    ReproductionContext,
    ReproductionReport,
    ResultRow,
)
from fedveil.reproduce import verdicts as st
from fedveil.runtime.saved_model import evaluate_saved

from .paper_numbers import paper_numbers
from .splitmix_study import WIDTHS, SplitMixStudy, run_config

PAPER = paper_numbers(__name__)
# name -> algorithm keys (budgets of equal groups, or log-normal)
DISTRIBUTIONS: dict[str, dict[str, Any]] = {
    "8-4-2-1": {"budgets": [0.125, 0.25, 0.5, 1.0]},
    "8-1-1-1": {"budgets": [0.125, 1.0, 1.0, 1.0]},
    "8-2-1-1": {"budgets": [0.125, 0.5, 1.0, 1.0]},
    "8-2-2-1": {"budgets": [0.125, 0.5, 0.5, 1.0]},
    "8-4-4-1": {"budgets": [0.125, 0.25, 0.25, 1.0]},
    "8-4-8d3-2": {"budgets": [0.125, 0.25, 0.375, 0.5]},
    "ln0.5_0.4": {"lognormal": [0.5, 0.4]},
}
CONTACT_RATES = ("2", "5", "10", "all")
# (setting, method) -> width -> accuracy per seed
Results = dict[tuple[str, str], dict[float, list[float]]]


@dataclass
class VariantStudy:
    """``kind`` "budgets" (settings: names of :data:`DISTRIBUTIONS`) or "contact" (settings:
    clients per round)."""

    kind: str = "budgets"
    base: SplitMixStudy = field(default_factory=lambda: SplitMixStudy(methods=["split_mix", "sheterofl"]))
    settings: list[str] = field(default_factory=lambda: list(DISTRIBUTIONS))


def variant_study(kind: str, quick: bool = False) -> VariantStudy:
    settings = list(DISTRIBUTIONS) if kind == "budgets" else list(CONTACT_RATES)
    if quick:
        base = SplitMixStudy(methods=["split_mix", "sheterofl"], seeds=[0], clients_per_domain=2, rows_per_domain=120,
                             test_rows_per_domain=60, rounds=2)
        return VariantStudy(kind, base, [settings[0], settings[-1]])
    # 50 rounds (splitmix_digits: 100): 42 + 24 runs must fit 2 CPU cores; the figures give no numbers
    return VariantStudy(kind, SplitMixStudy(methods=["split_mix", "sheterofl"], rounds=50), settings)


def baseline_of(study: VariantStudy, setting: str) -> str:
    """SHeteroFL, or HeteroFL for log-normal budgets (slimmable training needs the 8-4-2-1 ladder)."""
    return "heterofl" if study.kind == "budgets" and "lognormal" in DISTRIBUTIONS[setting] else "sheterofl"


def widest(study: VariantStudy, setting: str) -> float:
    """The widest budget the setting gives (log-normal: every width up to 1)."""
    return max(DISTRIBUTIONS[setting].get("budgets", [1.0])) if study.kind == "budgets" else 1.0


def job_config(ctx: ReproductionContext, study: VariantStudy, setting: str, method: str, seed: int) -> dict[str, Any]:
    algorithm = method if method == "split_mix" else baseline_of(study, setting)
    config = run_config(ctx, study.base, algorithm, seed, None)
    if study.kind == "budgets":
        config["algorithm"].update(DISTRIBUTIONS[setting])
    else:
        config["federation"]["clients_per_round"] = study.base.num_clients if setting == "all" else int(setting)
    return config


def trained(study: VariantStudy) -> list[tuple[str, str, int, str]]:
    """(setting, "split_mix" or "baseline", seed, run name) of every training run."""
    return [(setting, method, seed, f"{setting}_{method}_seed{seed}")
            for seed in study.base.seeds for setting in study.settings for method in ("split_mix", "baseline")]


def study_plan(ctx: ReproductionContext, study: VariantStudy) -> list[PlannedRun]:
    return [PlannedRun(name, job_config(ctx, study, setting, method, seed)) for setting, method, seed, name in trained(study)]


def score(ctx: ReproductionContext, study: VariantStudy) -> Results:
    """Every trained model's accuracy at every width."""
    results: Results = {}
    for setting, method, _, name in trained(study):
        for row in evaluate_saved(ctx.runs_dir / name, list(WIDTHS)):
            results.setdefault((setting, method), {}).setdefault(row["width"], []).append(row["accuracy"])
    return results


def rows_of(results: Results, study: VariantStudy) -> list[ResultRow]:
    figure = "Fig. C.4" if study.kind == "budgets" else "Fig. C.5"
    rows = []
    for setting in study.settings:
        baseline = baseline_of(study, setting)
        name = setting if study.kind == "budgets" else f"{setting} clients per round"
        for method in ("split_mix", "baseline"):
            got = results[(setting, method)]
            label = "Split-Mix" if method == "split_mix" else ("HeteroFL" if baseline == "heterofl" else "SHeteroFL")
            rows.append(ResultRow(name, f"{label}: accuracy x0.125 / x0.25 / x0.5 / x1",
                                  " / ".join(f"{st.mean(got[w]):.4f}" for w in WIDTHS), f"curve only ({figure})"))
        w = widest(study, setting)
        ours, theirs = results[(setting, "split_mix")][w], results[(setting, "baseline")][w]
        diff, se = st.difference(theirs, ours)
        rows.append(ResultRow(name, f"Split-Mix >= {baseline} at x{w:g} (the widest budget)",
                              f"{st.mean(ours):.4f} vs {st.mean(theirs):.4f}", "Split-Mix above at larger widths",
                              st.at_least_verdict(diff, se)))
    if study.kind == "contact":
        fewest, most = study.settings[0], study.settings[-1]
        low, high = results[(fewest, "split_mix")][1.0], results[(most, "split_mix")][1.0]
        diff, se = st.difference(low, high)
        rows.append(ResultRow(f"{fewest} -> {most} clients per round", "Split-Mix x1: fewer clients per round, lower accuracy",
                              f"{st.mean(low):.4f} vs {st.mean(high):.4f}", "accuracy falls with the contact rate",
                              st.lower_verdict(diff, se)))
    return rows


def scale_notes(study: VariantStudy, quick: bool) -> list[str]:
    b = study.base
    notes = [
        "data, model and schedule as splitmix_digits: digit_domains_synthetic (MNIST + four synthetic Digits-like "
        f"domains) at {b.size}x{b.size}, {5 * b.clients_per_domain} clients numbered domain by domain, {b.rounds} rounds, "
        f"seeds {b.seeds} (the paper: real Digits, 50 clients, 300 rounds; 600 for the contact rates)",
    ]
    if study.kind == "budgets":
        notes.append("the 4-2-4d3-1 setting (steps of 1/4) is not run: it needs bases of width 1/4")
    if quick:
        notes.append("quick mode: 2 rounds and two settings; not comparable")
    else:
        notes.append("50 rounds, half of splitmix_digits' 100, so the 42 + 24 runs fit 2 CPU cores")
    return notes


def plot(study: VariantStudy, results: Results, path) -> None:
    """Accuracy against width (mean ± std over seeds), Split-Mix vs the baseline, one panel per setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(4, len(study.settings))
    rows = -(-len(study.settings) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.2 * rows), squeeze=False, sharey=True)
    for ax, setting in zip(axes.flat, study.settings):
        baseline = "HeteroFL" if baseline_of(study, setting) == "heterofl" else "SHeteroFL"
        for method, label in (("split_mix", "Split-Mix"), ("baseline", baseline)):
            got = results[(setting, method)]
            ax.errorbar(range(len(WIDTHS)), [st.mean(got[w]) for w in WIDTHS], yerr=[st.std(got[w]) for w in WIDTHS],
                        marker="o", capsize=3, label=label)
        ax.set_xticks(range(len(WIDTHS)), [f"x{w:g}" for w in WIDTHS])
        ax.set_title(setting if study.kind == "budgets" else f"{setting} clients per round", fontsize=10)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(study.settings):]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("test accuracy")
    figure = "Fig. C.4: budget distributions" if study.kind == "budgets" else "Fig. C.5: clients per round"
    fig.suptitle(f"{figure}, mean ± std over {len(study.base.seeds)} seed(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def study_report(ctx: ReproductionContext, study: VariantStudy) -> ReproductionReport:
    """Split-Mix against the baseline per setting, the claims and a figure."""
    results = score(ctx, study)
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    figure = f"splitmix_{study.kind}.png"
    plot(study, results, ctx.out_dir / figure)
    what = "other budget distributions (Fig. C.4)" if study.kind == "budgets" else "lower contact rates (Fig. C.5)"
    return ReproductionReport(
        title=f"Split-Mix under {what}",
        source=PAPER["source"],
        rows=rows_of(results, study),
        scale_notes=scale_notes(study, ctx.quick),
        extra={"study": asdict(study),
               "accuracy": {f"{d} {m}": {f"{w:g}": v for w, v in by.items()} for (d, m), by in results.items()}},
        figures=[figure],
    )


def reproduction(kind: str) -> Reproduction:
    """``splitmix_budgets`` or ``splitmix_contact``: the plan and report of :func:`variant_study`."""
    return Reproduction(lambda ctx: study_plan(ctx, variant_study(kind, ctx.quick)),
                        lambda ctx, summaries: study_report(ctx, variant_study(kind, ctx.quick)))


REPRODUCTIONS.register("splitmix_budgets", "Split-Mix vs (S)HeteroFL under other budget distributions (Fig. C.4)")(
    reproduction("budgets")
)
REPRODUCTIONS.register("splitmix_contact", "Split-Mix vs SHeteroFL with fewer clients per round (Fig. C.5)")(
    reproduction("contact")
)
