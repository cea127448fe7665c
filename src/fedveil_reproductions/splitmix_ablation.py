"""Split-Mix's network scaling and BN statistics ablation (Hong et al. ICLR 2022 Table C.3,
Digits; spec 000 part 2 §A.6, §A.12).

Split-Mix (8 bases, budgets 8-4-2-1) on the digit domains of ``splitmix_digits``, trained
with rescaled init on / off x rescale layer (Scaler) on / off, under four BN options:
*batch average* (batch statistics at train and test), *tracked* (running statistics,
averaged by the server like parameters) and *post average* (the tracked runs' statistics
thrown away; each client re-estimates them with 20 cumulative passes over its own training
rows, Scalers off, and is scored on its own test rows:
:func:`~fedveil.runtime.saved_model.post_average`) and *locally tracked* (each client keeps
the running statistics of the bases it trains, ``algorithm.buffers = "local"``, and is scored
with them on its own test rows). Each model is served at widths x0.125 .. x1.

Claims checked (the table's conclusions): (a) rescaled init helps (without the Scaler, under
batch average); (b) post average is at least as good as batch average; (c) the Scaler breaks
tracked BN (tracked with the Scaler far below tracked without it); (d) locally tracked is at
least as good as globally tracked.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from fedveil.reproduce import (
    REPRODUCTIONS,
    PlannedRun,
    Reproduction,
    ReproductionContext,
    ReproductionReport,
    ResultRow,
    Summaries,
)
from fedveil.reproduce import verdicts as st
from fedveil.runtime.saved_model import evaluate_saved

from .paper_numbers import paper_numbers
from .splitmix_study import WIDTHS, SplitMixStudy, run_config

PAPER = paper_numbers(__name__)
REFRESH_PASSES = 20
# the trained runs: "_local" = tracked BN whose statistics each client keeps (algorithm.buffers = "local")
TRAINED_AS = {"batch average": "batch_average", "tracked": "batch_tracked", "post average": "batch_tracked",
              "locally tracked": "batch_tracked_local"}
Key = tuple[str, bool, bool]
Results = dict[Key, dict[float, list[float]]]


@dataclass
class AblationStudy:
    base: SplitMixStudy = field(default_factory=lambda: SplitMixStudy(methods=["split_mix"]))
    options: list[str] = field(default_factory=lambda: ["batch average", "tracked", "post average", "locally tracked"])
    refresh_passes: int = REFRESH_PASSES


def ablation_study(quick: bool = False) -> AblationStudy:
    if quick:
        base = SplitMixStudy(methods=["split_mix"], seeds=[0], clients_per_domain=2, rows_per_domain=120,
                             test_rows_per_domain=60, rounds=4)
        return AblationStudy(base=base, refresh_passes=2)
    return AblationStudy()


def name_of(norm: str, init: bool, layer: bool, seed: int) -> str:
    return f"{norm}_init{int(init)}_layer{int(layer)}_seed{seed}"


def trained(study: AblationStudy) -> list[tuple[str, bool, bool, int]]:
    """(trained BN, rescaled init, Scaler, seed) of every training run."""
    return [(norm, init, layer, seed) for seed in study.base.seeds for norm in sorted({TRAINED_AS[o] for o in study.options})
            for init in (False, True) for layer in (False, True)]


def study_plan(ctx: ReproductionContext, study: AblationStudy) -> list[PlannedRun]:
    """One training per (trained BN, init, layer, seed)."""
    runs = []
    for norm, init, layer, seed in trained(study):
        config = run_config(ctx, study.base, "split_mix", seed, None)
        config["model"]["options"].update({"norm": norm.removesuffix("_local"), "rescale_init": init,
                                           "rescale_layer": layer})
        if norm.endswith("_local"):
            config["algorithm"]["buffers"] = "local"
        runs.append(PlannedRun(name_of(norm, init, layer, seed), config))
    return runs


def score(ctx: ReproductionContext, study: AblationStudy) -> Results:
    """Every BN option's accuracy at every width; post average re-scores the tracked runs."""
    results: Results = {}
    for norm, init, layer, seed in trained(study):
        out = ctx.runs_dir / name_of(norm, init, layer, seed)
        for option in study.options:
            if TRAINED_AS[option] != norm:
                continue
            refresh = study.refresh_passes if option == "post average" else 0
            for row in evaluate_saved(out, list(WIDTHS), refresh_bn=refresh, local_bn=option == "locally tracked"):
                results.setdefault((option, init, layer), {}).setdefault(row["width"], []).append(row["accuracy"])
    return results


def paper_row(key: Key) -> list[float]:
    """Table C.3's accuracies (%) at x0.125 .. x1 for (BN option, rescaled init, Scaler)."""
    option, init, layer = key
    return PAPER["table_c3"][option][f"init_{'on' if init else 'off'}"][f"layer_{'on' if layer else 'off'}"]


def paper_x1(first: Key, second: Key) -> str:
    """Two Table C.3 cells at x1, as "a% vs b%"."""
    return f"{paper_row(first)[-1]}% vs {paper_row(second)[-1]}%"


def table_rows(results: Results, study: AblationStudy) -> list[ResultRow]:
    rows = []
    for option in study.options:
        for init in (False, True):
            for layer in (False, True):
                got, paper = results[(option, init, layer)], paper_row((option, init, layer))
                rows.append(ResultRow(
                    f"{option}, rescale init {'on' if init else 'off'}, rescale layer {'on' if layer else 'off'}",
                    "accuracy x0.125 / x0.25 / x0.5 / x1",
                    " / ".join(f"{st.mean(got[w]):.4f}" for w in WIDTHS) + f" (± {max(st.std(got[w]) for w in WIDTHS):.4f})",
                    " / ".join(f"{p}%" for p in paper),
                ))
    return rows


def claim_rows(results: Results, study: AblationStudy) -> list[ResultRow]:
    rows = []
    one = 1.0

    def acc(key: Key) -> list[float]:
        return results[key][one]

    if "batch average" in study.options:
        diff, se = st.difference(acc(("batch average", False, False)), acc(("batch average", True, False)))
        rows.append(ResultRow("batch average, no Scaler, x1", "(a) rescaled init above default init",
                              f"{st.mean(acc(('batch average', True, False))):.4f} vs {st.mean(acc(('batch average', False, False))):.4f}",
                              paper_x1(("batch average", True, False), ("batch average", False, False)), st.lower_verdict(diff, se)))
    if {"batch average", "post average"} <= set(study.options):
        diff, se = st.difference(acc(("batch average", True, True)), acc(("post average", True, True)))
        rows.append(ResultRow("rescale init and Scaler on, x1", "(b) post average >= batch average",
                              f"{st.mean(acc(('post average', True, True))):.4f} vs {st.mean(acc(('batch average', True, True))):.4f}",
                              paper_x1(("post average", True, True), ("batch average", True, True)), st.at_least_verdict(diff, se)))
    if {"tracked", "locally tracked"} <= set(study.options):
        diff, se = st.difference(acc(("tracked", True, False)), acc(("locally tracked", True, False)))
        rows.append(ResultRow("rescaled init, no Scaler, x1", "(d) locally tracked >= globally tracked",
                              f"{st.mean(acc(('locally tracked', True, False))):.4f} vs {st.mean(acc(('tracked', True, False))):.4f}",
                              paper_x1(("locally tracked", True, False), ("tracked", True, False)), st.at_least_verdict(diff, se)))
    if "tracked" in study.options:
        diff, se = st.difference(acc(("tracked", True, True)), acc(("tracked", True, False)))
        rows.append(ResultRow("tracked BN, rescaled init, x1", "(c) the Scaler breaks tracked BN",
                              f"{st.mean(acc(('tracked', True, True))):.4f} with vs {st.mean(acc(('tracked', True, False))):.4f} without",
                              paper_x1(("tracked", True, True), ("tracked", True, False)), st.lower_verdict(diff, se)))
    return rows


def scale_notes(study: AblationStudy, quick: bool) -> list[str]:
    b = study.base
    notes = [
        "data, clients, rounds and optimiser as splitmix_digits: digit_domains_synthetic (MNIST and four synthetic "
        f"Digits-like domains) at {b.size}x{b.size}, {b.rows_per_domain} training rows per domain, "
        f"{5 * b.clients_per_domain} clients, {b.rounds} rounds, lr {b.lr['split_mix']} cosine; seeds {b.seeds}",
        f"post average, as the reference code: for each client, the final model's BN statistics re-estimated with "
        f"{study.refresh_passes} cumulative passes over its own training rows (batches of {b.batch_size}, Scalers off), "
        "then scored on its domain's test rows; the mean over clients equals the pooled accuracy here (equal domains)",
        "locally tracked: tracked BN whose statistics each client keeps for the bases it trained "
        "(algorithm.buffers = \"local\"), each client scored on its domain's test rows with its own statistics",
        "score: the final model on the pooled test rows (the paper: best-validation checkpoint)",
    ]
    if quick:
        notes.append("quick mode: a few rounds and rows, one seed; not comparable")
    return notes


def plot(results: Results, study: AblationStudy, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(study.options), figsize=(4.2 * len(study.options), 3.8), squeeze=False, sharey=True)
    for ax, option in zip(axes[0], study.options):
        for init in (False, True):
            for layer in (False, True):
                got = results[(option, init, layer)]
                ax.errorbar(WIDTHS, [st.mean(got[w]) for w in WIDTHS], yerr=[st.std(got[w]) for w in WIDTHS], marker="o",
                            capsize=3, label=f"init {'on' if init else 'off'}, Scaler {'on' if layer else 'off'}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(WIDTHS, [f"x{w:g}" for w in WIDTHS])
        ax.set_title(option)
        ax.set_xlabel("width")
    axes[0][0].set_ylabel("test accuracy")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def study_report(ctx: ReproductionContext, study: AblationStudy) -> ReproductionReport:
    """Every option's accuracy per width beside Table C.3, the claims and a figure."""
    results = score(ctx, study)
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    figures = ["ablation.png"]
    plot(results, study, ctx.out_dir / figures[0])
    return ReproductionReport(
        title="Split-Mix ablation: rescaled init, rescale layer and BN statistics (Table C.3)",
        source=PAPER["source"],
        rows=table_rows(results, study) + claim_rows(results, study),
        scale_notes=scale_notes(study, ctx.quick),
        extra={"study": asdict(study), "accuracy": {
            f"{o}|init={int(i)}|layer={int(l)}": {f"{w:g}": v for w, v in by.items()} for (o, i, l), by in results.items()
        }},
        figures=figures,
    )


def plan(ctx: ReproductionContext) -> list[PlannedRun]:
    return study_plan(ctx, ablation_study(ctx.quick))


def report(ctx: ReproductionContext, summaries: Summaries) -> ReproductionReport:
    return study_report(ctx, ablation_study(ctx.quick))


REPRODUCTIONS.register("splitmix_ablation", "Split-Mix rescaled init / Scaler / BN statistics ablation on digits (Table C.3)")(
    Reproduction(plan, report)
)
