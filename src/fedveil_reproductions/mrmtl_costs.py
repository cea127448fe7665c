"""What personalisation costs under silo-specific DP, on the synthetic Vehicle stand-in
(Liu et al. 2022, spec 002 §7 claims 2 and 8; Fig. 1.4, G.1; MOCHA of Fig. 1.3).

One heterogeneity (tau 0.35, where FedAvg beats Local under DP but not without it) and the
Vehicle settings of :mod:`.mrmtl_vehicle` at a fixed learning rate. Three questions:

- Fig. 1.4, claim 8 (privacy overhead): at the same (epsilon, delta) Ditto trains twice
  per round and IFCA spends budget on every cluster selection, so each silo's DP-SGD needs
  a larger noise multiplier z than Local, FedAvg and MR-MTL (which share one z); the
  study reads z from each run's privacy plan and scores the accuracy it leaves.
- Fig. G.1, claim 2 (finetuning): FedAvg then local training from 25%, 50% or 75% of the
  rounds loses FedAvg's noise averaging once the local steps start, so under DP its
  accuracy falls towards Local's.
- MOCHA (the primal form of [C1]) beside MR-MTL at the same budget.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from fedveil.config import validate
from fedveil.reproduce import (
    REPRODUCTIONS,
    ReproductionContext,
    ReproductionReport,
    ResultRow,
    StudyReproduction,
)
from fedveil.runtime.simulation import Simulation

from .paper_numbers import paper_numbers
from .silo_study import (
    NON_PRIVATE,
    Results,
    SiloStudy,
    eps_label,
    gap_text,
    mean_score,
    paired_gap,
    run_grid,
    score_rows,
    study_record,
)
from .vehicle_silos import vehicle_task

PAPER = paper_numbers(__name__)

SWITCHES = (0.25, 0.5, 0.75)  # Fig. G.1: finetuning starts after this share of the rounds


def finetune_label(switch: float) -> str:
    return f"finetune({switch:.0%})"


def cost_methods(lam: float, mocha_lams: list[float], clusters: int) -> dict[str, dict[str, Any]]:
    """Label -> ``[algorithm]`` of every compared method."""
    out: dict[str, dict[str, Any]] = {"local": {"name": "local"}, "fedavg": {"name": "fedavg"}}
    out |= {finetune_label(s): {"name": "fedavg_then_local", "switch_fraction": s} for s in SWITCHES}
    out[f"mr_mtl(lam={lam:g})"] = {"name": "mr_mtl", "lam": lam}
    out[f"ditto(lam={lam:g})"] = {"name": "ditto", "lam": lam}
    out["ifca(every round)"] = {"name": "ifca", "clusters": clusters, "select_fraction": 1.0, "fedavg_fraction": 1.0}
    out["ifca(10%)"] = {"name": "ifca", "clusters": clusters, "select_fraction": 0.1, "fedavg_fraction": 1.0}
    out |= {f"mocha(lam={m:g})": {"name": "mocha", "lam": m} for m in mocha_lams}
    return out


@dataclass
class CostStudy:
    tau: float = 0.35
    lam: float = 1.0  # MR-MTL's and Ditto's lambda (MR-MTL's best at epsilon 0.5 for tau 0.35 at lr 0.03)
    mocha_lams: list[float] = field(default_factory=lambda: [1.0, 10.0])
    clusters: int = 4  # [C1]'s Vehicle setting
    z_epsilons: list[float] = field(default_factory=lambda: [0.5, 1.0, 2.0])  # Fig. G.1's grid, planned only
    silos: tuple[int, int, int] = (23, 872, 1933)
    study: SiloStudy = field(default_factory=lambda: SiloStudy(
        epsilons=[1.0, NON_PRIVATE], lambdas=[], baselines=[], seeds=[0, 1, 2], rounds=100, lr=0.03,
    ))

    def grid(self) -> SiloStudy:
        return SiloStudy(**{**self.study.__dict__, "extra_methods": cost_methods(self.lam, self.mocha_lams, self.clusters)})


def quick_study() -> CostStudy:
    return CostStudy(mocha_lams=[1.0], z_epsilons=[1.0], study=SiloStudy(
        epsilons=[1.0, NON_PRIVATE], lambdas=[], baselines=[], seeds=[0], rounds=10, lr=0.03))


def planned_noise(plan: CostStudy, algorithm: dict[str, Any], epsilon: float) -> float:
    """The DP-SGD noise multiplier z the privacy plan calibrates for silo 0 at ``epsilon``
    (every silo gets its own z; they differ only through the silo's size)."""
    grid = plan.grid()
    config = vehicle_task(plan.tau, *plan.silos).config(algorithm, epsilon, 0, grid)
    return Simulation.from_config(validate(config)).privacy.plan.clients[0].noise_multiplier


def noise_rows(plan: CostStudy) -> tuple[list[ResultRow], dict[str, dict[str, float]]]:
    """Claim 8: z of each method at each epsilon, relative to Local's."""
    rows, table = [], {}
    for epsilon in plan.z_epsilons:
        e = eps_label(epsilon)
        zs = {label: planned_noise(plan, algorithm, epsilon) for label, algorithm in plan.grid().extra_methods.items()}
        table[e] = zs
        base = zs["local"]
        rows.append(ResultRow(
            f"eps={e}", "DP-SGD noise multiplier z of silo 0 (x Local's)",
            "; ".join(f"{label} {z:.3f} (x{z / base:.2f})" for label, z in zs.items()),
            PAPER["claims"]["more_noise"],
            "holds" if min(zs[f"ditto(lam={plan.lam:g})"], zs["ifca(every round)"]) > base * 1.01
            and zs["ifca(every round)"] > zs["ifca(10%)"] else "does not hold",
        ))
    return rows, table


def overhead_rows(results: Results, plan: CostStudy, eps: str) -> list[ResultRow]:
    """Claim 8 in accuracy: Ditto below MR-MTL at the same lambda, IFCA every round below IFCA (10%)."""
    rows = []
    for costly, cheap in ((f"ditto(lam={plan.lam:g})", f"mr_mtl(lam={plan.lam:g})"), ("ifca(every round)", "ifca(10%)")):
        mean, se = gap = paired_gap(results[costly][eps], results[cheap][eps])
        rows.append(ResultRow(
            f"eps={eps}", f"{costly} vs {cheap}", gap_text(cheap, gap),
            PAPER["claims"]["overhead_curve"],
            "holds" if mean < -2 * se else "does not hold",
        ))
    return rows


def finetune_rows(results: Results, eps: str) -> list[ResultRow]:
    """Claim 2 (Fig. G.1, 1.2 mid): under DP finetuning keeps little of FedAvg's lead over
    Local (the share kept: 1 = FedAvg's level, 0 = Local's); without DP it is not below
    FedAvg, so what it loses under DP is the noise averaging."""
    fedavg, local = mean_score(results, "fedavg", eps), mean_score(results, "local", eps)
    rows = []
    for switch in SWITCHES:
        label = finetune_label(switch)
        mean, se = gap = paired_gap(results[label][eps], results["fedavg"][eps])
        if eps == "inf":
            rows.append(ResultRow(
                "eps=inf", f"{label} vs FedAvg without DP", gap_text("fedavg", gap),
                PAPER["claims"]["finetune_without_dp"], "holds" if mean >= -2 * se else "does not hold",
            ))
            continue
        kept = (mean_score(results, label, eps) - local) / (fedavg - local) if fedavg != local else float("nan")
        rows.append(ResultRow(
            f"eps={eps}", f"{label}: share of FedAvg's lead over Local kept",
            f"{kept:.2f} ({gap_text('fedavg', gap)})",
            PAPER["claims"]["finetune_under_dp"],
            "holds" if fedavg > local and mean < -2 * se else "does not hold",
        ))
    return rows


def settings(ctx: ReproductionContext) -> CostStudy:
    """The study: quick or full."""
    return quick_study() if ctx.quick else CostStudy()


def run(ctx: ReproductionContext, plan: CostStudy) -> Results:
    """Every method's grid on the synthetic Vehicle silos."""
    return run_grid(ctx.runs_dir, plan.grid(), vehicle_task(plan.tau, *plan.silos))


def report(ctx: ReproductionContext, plan: CostStudy, results: Results) -> ReproductionReport:
    """Accuracy, noise overhead and finetuning rows; the figure."""
    grid = plan.grid()
    task = vehicle_task(plan.tau, *plan.silos)
    rows = score_rows(results, grid, task, {}, f"tau={plan.tau:g}")
    z_rows, z_table = noise_rows(plan)
    rows += z_rows
    for e in (eps_label(x) for x in grid.epsilons if x != NON_PRIVATE):
        rows += overhead_rows(results, plan, e)
        rows += finetune_rows(results, e)
    rows += finetune_rows(results, "inf")
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    plot(results, grid, z_table, ctx.out_dir / "costs.png")
    notes = [
        "synthetic Vehicle stand-in (vehicle_synthetic, see mrmtl_vehicle), tau "
        f"{plan.tau:g}; rounds {grid.rounds} (the paper: 200 for Fig. G.1), lr {grid.lr} fixed for every method "
        "(Fig. G.1 fixes 0.01 at 200 rounds), seeds " + str(grid.seeds),
        f"MR-MTL and Ditto at lambda {plan.lam:g}; MOCHA at lambda {plan.mocha_lams} (Sigma starts at I/K, so its pull "
        "is about lambda/K); IFCA with 4 clusters, selection budget 0.03 epsilon each",
        "noise multipliers from each run's privacy plan (the accountant calibrating z to the budget), not measured",
    ]
    if ctx.quick:
        notes.append("quick mode: 10 rounds, one seed, one MOCHA lambda; not comparable to the paper")
    return ReproductionReport(
        title="What personalisation costs under silo-specific DP (synthetic Vehicle stand-in)",
        source=PAPER["source"],
        rows=rows, scale_notes=notes,
        extra={"accuracy": results, "noise_multipliers": z_table,
               "study": study_record(grid)},
        figures=["costs.png"],
    )


REPRODUCTIONS.register("mrmtl_costs", "Privacy overhead of Ditto and IFCA, finetuning under DP, MOCHA: synthetic Vehicle (Liu 2022)")(
    StudyReproduction(settings, run, report)
)


def plot(results: Results, study: SiloStudy, z_table: dict[str, dict[str, float]], path) -> None:
    """Left: noise multiplier per method vs epsilon. Right: accuracy per method, private and not."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.4))
    methods = list(results)
    for i, e in enumerate(z_table):
        left.bar([m + i * 0.8 / len(z_table) for m in range(len(methods))], [z_table[e][m] for m in methods],
                 width=0.8 / len(z_table), label=f"eps={e}")
    left.set_xticks(range(len(methods)), methods, rotation=45, ha="right", fontsize=7)
    left.set_ylabel("noise multiplier z (silo 0)")
    left.set_title("privacy overhead (Fig. 1.4)")
    left.legend(fontsize=7)
    labels = [eps_label(e) for e in study.epsilons]
    for i, e in enumerate(labels):
        means = [statistics.fmean(results[m][e]) for m in methods]
        errs = [statistics.stdev(results[m][e]) if len(results[m][e]) > 1 else 0.0 for m in methods]
        right.bar([m + i * 0.8 / len(labels) for m in range(len(methods))], means, yerr=errs,
                  width=0.8 / len(labels), label=f"eps={e}", capsize=2)
    right.set_xticks(range(len(methods)), methods, rotation=45, ha="right", fontsize=7)
    right.set_ylabel("test accuracy (model each silo uses)")
    right.set_ylim(0.5, 1.0)
    right.set_title("utility at the same budget")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
