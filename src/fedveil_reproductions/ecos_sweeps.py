"""ECOS's compression size R and score scale s on Digits (Hong, dissertation App. D.2.2-D.2.3,
Figs. D.1 and D.2; spec 000 part 2, B.3, B.10 "figure-only results"; no numbers).

``ecos_sweeps``: selection only, no training.  The ID+OoD split of ``ecos_digits`` (the
client holds half of its domain, the cloud the other half plus the four other domains; the
spec's analyses use the SVHN client, we run every domain), seeds 1-3.  Per R (s = 1) and per
s (R = 100), one noisy coverage upload per client and seed (sigma 25, gamma 0.8); every s
and budget is post-processing of that same upload.  Reported per budget: the in-distribution
share of the selection (the figures' "ID-TPR": the share of selected samples that come from
the client's domain) and the number selected (the "effective samples").  Beside the noisy
upload, the same selection from the exact counts shows what the noise costs at each R.

Claims checked (the figures' text):

* D.1: a small budget wants a larger R (the best R at the smallest budget is larger than the
  best R at the largest); at a large budget the largest R is not the best (noise on small
  per-centroid counts).
* D.2: a larger s raises the ID share at the smallest budget; at the largest budget s >= 3
  selects fewer samples than s = 1 (few clusters take the budget and run out of rows).

Budgets keep the paper's shares of the pool: 1,000 / 2,000 / 5,000 / 8,000 of a ~33,000-row
ID+OoD pool are 3% / 6% / 15% / 24%; ours 200 / 400 / 1,000 / 1,700 of 7,200 rows.
"""
from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from fedveil.data.source import DataSource
from fedveil.ecos.coverage import coverage_counts, private_coverage
from fedveil.ecos.pipeline import CloudPool, ECOSSettings, plan
from fedveil.ecos.selection import ecos_select
from fedveil.ecos.splits import split_rows
from fedveil.reproduce import (
    REPRODUCTIONS,
    ReproductionContext,
    ReproductionReport,
    ResultRow,
    StudyReproduction,
)
from fedveil.reproduce import verdicts as st
from fedveil.seeding import numpy_generator

from .ecos_study import DOMAIN_NAMES, Record, default_ecos, load_domains, seed_means
from .paper_numbers import paper_numbers

PAPER = paper_numbers(__name__)


@dataclass
class SweepStudy:
    """The R and s grids, the budgets (standing for ``paper_budgets``), client domains and seeds."""

    ecos: ECOSSettings = field(default_factory=default_ecos)
    R_grid: list[int] = field(default_factory=lambda: [10, 25, 50, 100, 200])
    s_grid: list[float] = field(default_factory=lambda: [1.0, 2.0, 3.0, 5.0])
    budgets: list[int] = field(default_factory=lambda: [200, 400, 1000, 1700])
    paper_budgets: list[int] = field(default_factory=lambda: [1000, 2000, 5000, 8000])
    domains: list[int] = field(default_factory=lambda: list(range(len(DOMAIN_NAMES))))
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    rows_per_domain: int = 1600
    test_rows_per_domain: int = 400
    size: int = 16

    def __post_init__(self) -> None:
        if len(self.budgets) != len(self.paper_budgets):
            raise ValueError(f"paper_budgets {self.paper_budgets} must pair with budgets {self.budgets} one to one.")
        if self.ecos.R not in self.R_grid or 1.0 not in self.s_grid:
            raise ValueError(f"R_grid must hold the study's R = {self.ecos.R} and s_grid must hold s = 1.")


def study(ctx: ReproductionContext) -> SweepStudy:
    """The full study, or the quick one: one domain and seed, 60 rows per domain, two R, two s, two budgets."""
    if not ctx.quick:
        return SweepStudy()
    return SweepStudy(R_grid=[5, 100], s_grid=[1.0, 5.0], budgets=[20, 100], paper_budgets=[1000, 8000],
                      domains=[1], seeds=[1], rows_per_domain=60, test_rows_per_domain=20)


def run_client(source: DataSource, study: SweepStudy, d: int, seed: int) -> list[Record]:
    """Every (R, s, budget) of one client domain and seed, from noisy and from exact counts."""
    train = source.train
    domain = train.groups["domain"].numpy()
    client, pool_rows = split_rows(domain, d, "ID+OoD", numpy_generator(seed, "ecos/split", "ID+OoD", d))
    client_features = study.ecos.features(train.x[client])
    grid = [(R, 1.0) for R in study.R_grid] + [(study.ecos.R, s) for s in study.s_grid if s != 1.0]
    records, pools = [], {}
    for R, s in grid:
        settings = dataclasses.replace(study.ecos, R=R, scale_s=s)
        if R not in pools:
            pool = CloudPool(train.x[pool_rows], settings, seed)
            upload = private_coverage(client_features, pool.centroids, settings.sigma, settings.sample_rate,
                                      numpy_generator(seed, "ecos/coverage", R))
            pools[R] = (pool, upload.scores, coverage_counts(client_features, pool.centroids).astype(np.float64))
        pool, noisy, exact = pools[R]
        for budget in study.budgets:
            for counts, kind in ((noisy, "noisy"), (exact, "exact")):
                rng = numpy_generator(seed, "ecos/sweep", R, s, budget, kind)
                chosen = pool_rows[ecos_select(pool.features, pool.centroids, counts, budget, s, rng, settings.cap)]
                records.append({"domain": d, "seed": seed, "R": R, "s": s, "budget": budget, "counts": kind,
                                "selected": int(chosen.size),
                                "id_share": float(np.mean(domain[chosen] == d)) if chosen.size else 0.0,
                                "pool_id_share": float(np.mean(domain[pool_rows] == d)), "client_rows": int(client.size)})
    return records


def run(ctx: ReproductionContext, study: SweepStudy) -> list[Record]:
    """Every client's selections, seed by seed."""
    source = load_domains(ctx, study)
    jobs = [(d, seed) for seed in study.seeds for d in study.domains]
    records = []
    for d, seed in tqdm(jobs, desc="ecos_sweeps", unit="client", dynamic_ncols=True):
        records += run_client(source, study, d, seed)
    return records


def best_R(records: list[Record], budget: int, Rs: list[int]) -> int:
    """The R with the highest mean ID share (noisy counts, s = 1) at ``budget``."""
    return max(Rs, key=lambda R: st.mean(seed_means(records, "id_share", R=R, s=1.0, budget=budget, counts="noisy")))


def rows_of(study: SweepStudy, records: list[Record]) -> list[ResultRow]:
    """ID share and samples selected per R and s, and the verdicts of the figures' claims."""
    claims, rows = PAPER["claims"], []
    budgets = " / ".join(f"{b} ({p})" for b, p in zip(study.budgets, study.paper_budgets))
    r_grid = [(R, 1.0) for R in study.R_grid]
    s_grid = [(study.ecos.R, s) for s in study.s_grid if s != 1.0]  # s = 1 is the R sweep's R = study.ecos.R row
    for what, grid in (("R", r_grid), ("s", s_grid)):
        for R, s in grid:
            setting = f"Fig. D.{1 if what == 'R' else 2}: R = {R}, s = {s:g}"
            for kind in ("noisy", "exact"):
                shares = [100 * st.mean(seed_means(records, "id_share", R=R, s=s, budget=b, counts=kind))
                          for b in study.budgets]
                sizes = [st.mean(seed_means(records, "selected", R=R, s=s, budget=b, counts=kind)) for b in study.budgets]
                rows.append(ResultRow(setting, f"{kind} counts: ID share % / selected at B = {budgets}",
                                      " / ".join(f"{a:.1f}% ({n:.0f})" for a, n in zip(shares, sizes)),
                                      "curves only" if kind == "noisy" else "not in the paper (no noise)"))
    small, large = study.budgets[0], study.budgets[-1]
    at_small, at_large = best_R(records, small, study.R_grid), best_R(records, large, study.R_grid)
    rows.append(ResultRow("Fig. D.1", f"a small budget wants a larger R: best R at B={small} >= best R at B={large}",
                          f"{at_small} vs {at_large}", claims["small_budget_R"],
                          "holds" if at_small > at_large else
                          "not shown: the same R is best at both budgets" if at_small == at_large else "does not hold"))
    top = max(study.R_grid)
    rows.append(ResultRow("Fig. D.1", f"at B={large} the largest R ({top}) is not the best (noise on small counts)",
                          f"best R = {at_large}", claims["large_budget_R"],
                          "holds" if at_large != top else "does not hold"))
    s_top = max(study.s_grid)

    def compare(setting: str, claim: str, low: list[float], high: list[float], paper: str, scale: float, unit: str):
        diff, se = st.difference(low, high)
        rows.append(ResultRow(setting, claim, f"{scale * st.mean(high):.1f}{unit} vs {scale * st.mean(low):.1f}{unit}",
                              paper, st.lower_verdict(diff, se)))

    compare("Fig. D.2", f"a larger s raises the ID share at B={small}: s = {s_top:g} above s = 1",
            seed_means(records, "id_share", R=study.ecos.R, s=1.0, budget=small, counts="noisy"),
            seed_means(records, "id_share", R=study.ecos.R, s=s_top, budget=small, counts="noisy"),
            claims["small_budget_s"], 100, "%")
    for s in [s for s in study.s_grid if s >= 3]:
        compare("Fig. D.2", f"at B={large} s = 1 selects more samples than s = {s:g}",
                seed_means(records, "selected", R=study.ecos.R, s=s, budget=large, counts="noisy"),
                seed_means(records, "selected", R=study.ecos.R, s=1.0, budget=large, counts="noisy"),
                claims["large_budget_s"], 1, "")
    epsilons = {R: plan(dataclasses.replace(study.ecos, R=R)).epsilon for R in study.R_grid}
    rows.append(ResultRow("B.4", "the upload's epsilon at every R (one upload, whatever R, s or B)",
                          "; ".join(f"R={R}: {e:.4f}" for R, e in epsilons.items()), claims["epsilon"],
                          "holds" if max(epsilons.values()) - min(epsilons.values()) <= 1e-12 else "does not hold"))
    return rows


def plot(study: SweepStudy, records: list[Record], path: Path) -> None:
    """ID share against the budget per R (left) and per s (middle), and the samples selected per s (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    panels = ((axes[0], [(R, 1.0) for R in study.R_grid], "id_share", "R = {R}"),
              (axes[1], [(study.ecos.R, s) for s in study.s_grid], "id_share", "s = {s:g}"),
              (axes[2], [(study.ecos.R, s) for s in study.s_grid], "selected", "s = {s:g}"))
    for ax, grid, key, name in panels:
        for R, s in grid:
            values = [seed_means(records, key, R=R, s=s, budget=b, counts="noisy") for b in study.budgets]
            ax.errorbar(study.budgets, [st.mean(v) for v in values], yerr=[st.std(v) for v in values], marker="o",
                        capsize=3, label=name.format(R=R, s=s))
        ax.set_xlabel("budget B")
        ax.set_xscale("log")
        ax.set_xticks(study.budgets, [str(b) for b in study.budgets])
        ax.minorticks_off()
        ax.legend(fontsize=8)
    axes[0].set_ylabel("in-distribution share of the selection")
    axes[0].set_title("Fig. D.1: compression size R (s = 1)")
    axes[1].set_title(f"Fig. D.2: score scale s (R = {study.ecos.R})")
    axes[2].plot(study.budgets, study.budgets, "k:", label="B")
    axes[2].set_ylabel("samples selected")
    axes[2].set_title("Fig. D.2: effective samples")
    fig.suptitle(f"ECOS on synthetic Digits, ID+OoD cloud, mean ± std over {len(study.seeds)} seed(s) and "
                 f"{len(study.domains)} client domain(s)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def scale_notes(study: SweepStudy, records: list[Record], quick: bool) -> list[str]:
    """How the study departs from the figures' setting."""
    e = study.ecos
    pool = st.mean([r["pool_id_share"] for r in records])
    notes = [
        f"data as ecos_digits (digit_domains_synthetic at {study.size}x{study.size}, {study.rows_per_domain} rows per "
        f"domain): the ID+OoD split, every client domain (the paper: SVHN), the pool's own ID share {100 * pool:.1f}%",
        f"budgets {study.budgets} for the paper's {study.paper_budgets} (the same shares of the pool)",
        f"phi {e.extractor} {e.extractor_options}, sigma {e.sigma:g}, gamma {e.sample_rate:g}, cluster-size cap; one "
        "upload per R, client and seed, every s and budget post-processing of it",
        f"our clients hold {st.mean([r['client_rows'] for r in records]):,.0f} rows (the paper's SVHN half: ~3,700), so a "
        "given R leaves fewer rows per centroid against the same noise: the R at which noise bites is smaller here",
    ]
    if quick:
        notes.append("quick mode: one domain and seed, 60 rows per domain, two R, two s, two budgets; not comparable")
    return notes


def report(ctx: ReproductionContext, study: SweepStudy, records: list[Record]) -> ReproductionReport:
    """The rows per R and s with the figures' claims; the figure."""
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    plot(study, records, ctx.out_dir / "ecos_sweeps.png")
    return ReproductionReport(
        title="ECOS compression size R and score scale s (Figs. D.1-D.2 protocol, selection only)",
        source=PAPER["source"],
        rows=rows_of(study, records),
        scale_notes=scale_notes(study, records, ctx.quick),
        extra={"study": asdict(study), "records": records},
        figures=["ecos_sweeps.png"],
    )


REPRODUCTIONS.register("ecos_sweeps", "ECOS in-distribution share vs compression size R and score scale s (Figs. D.1-D.2)")(
    StudyReproduction(study, run, report)
)
