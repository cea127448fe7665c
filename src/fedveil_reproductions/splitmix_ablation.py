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

from tqdm.auto import tqdm

from fedveil.config import validate
from fedveil.reproduce import (
    REPRODUCTIONS,
    ReproductionContext,
    ReproductionReport,
    ResultRow,
    run_once,
)
from fedveil.reproduce import verdicts as st
from fedveil.runtime.saved_model import evaluate_saved

from .splitmix_digits import WIDTHS, SplitMixStudy, run_config

REFRESH_PASSES = 20
# Table C.3: (BN option, rescale init, rescale layer) -> accuracy (%) at x0.125, x0.25, x0.5, x1
PAPER = {
    ("batch average", False, False): (81.1, 84.3, 86.2, 87.3),
    ("batch average", False, True): (81.1, 84.2, 86.2, 87.2),
    ("batch average", True, False): (84.5, 87.5, 88.9, 89.8),
    ("batch average", True, True): (84.6, 87.5, 89.0, 89.8),
    ("post average", False, False): (81.2, 84.5, 86.2, 87.4),
    ("post average", False, True): (81.2, 84.4, 86.2, 87.3),
    ("post average", True, False): (84.5, 87.5, 89.0, 89.9),
    ("post average", True, True): (84.9, 87.8, 89.3, 90.2),
    ("tracked", False, False): (79.6, 82.8, 84.8, 85.7),
    ("tracked", False, True): (9.4, 10.6, 10.6, 10.6),
    ("tracked", True, False): (83.5, 86.4, 87.9, 88.7),
    ("tracked", True, True): (8.8, 8.8, 8.8, 10.6),
    ("locally tracked", False, False): (81.1, 84.3, 86.3, 87.3),
    ("locally tracked", False, True): (9.8, 10.6, 10.1, 11.7),
    ("locally tracked", True, False): (84.9, 87.7, 89.1, 90.0),
    ("locally tracked", True, True): (10.5, 10.6, 12.1, 11.1),
}
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


def run_study(ctx: ReproductionContext, study: AblationStudy, progress: bool = True) -> Results:
    """One training per (trained BN, init, layer, seed); post average re-scores the tracked runs."""
    jobs = []
    for seed in study.base.seeds:
        for norm in sorted({TRAINED_AS[o] for o in study.options}):
            for init in (False, True):
                for layer in (False, True):
                    config = run_config(ctx, study.base, "split_mix", seed, None)
                    config["model"]["options"].update({"norm": norm.removesuffix("_local"), "rescale_init": init,
                                                       "rescale_layer": layer})
                    if norm.endswith("_local"):
                        config["algorithm"]["buffers"] = "local"
                    validate(config)
                    jobs.append((norm, init, layer, config, ctx.runs_dir / name_of(norm, init, layer, seed)))
    results: Results = {}
    for norm, init, layer, config, out in tqdm(jobs, desc="splitmix_ablation", unit="run", disable=not progress,
                                               dynamic_ncols=True):
        run_once(config, out)
        for option in study.options:
            if TRAINED_AS[option] != norm:
                continue
            refresh = study.refresh_passes if option == "post average" else 0
            for row in evaluate_saved(out, list(WIDTHS), refresh_bn=refresh, local_bn=option == "locally tracked"):
                results.setdefault((option, init, layer), {}).setdefault(row["width"], []).append(row["accuracy"])
    return results


def table_rows(results: Results, study: AblationStudy) -> list[ResultRow]:
    rows = []
    for option in study.options:
        for init in (False, True):
            for layer in (False, True):
                got, paper = results[(option, init, layer)], PAPER[(option, init, layer)]
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
                              "89.8% vs 87.3%", st.lower_verdict(diff, se)))
    if {"batch average", "post average"} <= set(study.options):
        diff, se = st.difference(acc(("batch average", True, True)), acc(("post average", True, True)))
        rows.append(ResultRow("rescale init and Scaler on, x1", "(b) post average >= batch average",
                              f"{st.mean(acc(('post average', True, True))):.4f} vs {st.mean(acc(('batch average', True, True))):.4f}",
                              "90.2% vs 89.8%", st.at_least_verdict(diff, se)))
    if {"tracked", "locally tracked"} <= set(study.options):
        diff, se = st.difference(acc(("tracked", True, False)), acc(("locally tracked", True, False)))
        rows.append(ResultRow("rescaled init, no Scaler, x1", "(d) locally tracked >= globally tracked",
                              f"{st.mean(acc(('locally tracked', True, False))):.4f} vs {st.mean(acc(('tracked', True, False))):.4f}",
                              "90.0% vs 88.7%", st.at_least_verdict(diff, se)))
    if "tracked" in study.options:
        diff, se = st.difference(acc(("tracked", True, True)), acc(("tracked", True, False)))
        rows.append(ResultRow("tracked BN, rescaled init, x1", "(c) the Scaler breaks tracked BN",
                              f"{st.mean(acc(('tracked', True, True))):.4f} with vs {st.mean(acc(('tracked', True, False))):.4f} without",
                              "10.6% vs 88.7%", st.lower_verdict(diff, se)))
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


def run_experiment(ctx: ReproductionContext, study: AblationStudy, progress: bool = True) -> ReproductionReport:
    results = run_study(ctx, study, progress)
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    figures = ["ablation.png"]
    plot(results, study, ctx.out_dir / figures[0])
    return ReproductionReport(
        title="Split-Mix ablation: rescaled init, rescale layer and BN statistics (Table C.3)",
        source="Hong et al. ICLR 2022, Table C.3 (Digits; spec 000 part 2 §A.6, §A.12)",
        rows=table_rows(results, study) + claim_rows(results, study),
        scale_notes=scale_notes(study, ctx.quick),
        extra={"study": asdict(study), "accuracy": {
            f"{o}|init={int(i)}|layer={int(l)}": {f"{w:g}": v for w, v in by.items()} for (o, i, l), by in results.items()
        }},
        figures=figures,
    )


@REPRODUCTIONS.register("splitmix_ablation", "Split-Mix rescaled init / Scaler / BN statistics ablation on digits (Table C.3)")
def splitmix_ablation(ctx: ReproductionContext) -> ReproductionReport:
    return run_experiment(ctx, ablation_study(ctx.quick))
