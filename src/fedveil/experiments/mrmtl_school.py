"""MR-MTL vs Local / FedAvg / Finetune / Ditto on School under silo-specific DP
(Liu et al. 2022, spec 002 Fig. 1.3(b), Fig. G.3 and the [C1] README, §6.1).

Setup (spec §5): the real School file, 139 schools as silos, 80/20 train/test split per
school, scores normalised to (y - 1) / 69, linear regression from zero weights with loss (y_hat - y)^2 / 2,
DP-SGD with clip 1, batch 32, one local epoch per round, lr 0.01, every silo every round,
the same (epsilon, delta = 1e-3) for every silo with its own calibrated noise. The metric is
test MSE of the model each silo would use, averaged over silos weighted by their test sizes
(personal models for personalised methods, the global model for FedAvg), after the last round.

Claims checked (no numbers in the thesis; three in the [C1] README at epsilon = 6):
FedAvg ~ 0.02564, Local ~ 0.02628, MR-MTL (lambda = 1) ~ 0.02394; MR-MTL beats both
endpoints at epsilon ~ 6 (§7 claim 3); the best lambda grows as privacy tightens (claim 4).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from ..config import validate
from ..runtime import run
from .registry import EXPERIMENTS, ExperimentContext, ExperimentReport, ResultRow

README_MSE = {"fedavg": 0.02564, "local": 0.02628, "mr_mtl(lam=1)": 0.02394}  # [C1] README, eps = 6
NON_PRIVATE = math.inf


@dataclass
class SchoolStudy:
    """What the study varies; the defaults are the full run."""

    epsilons: list[float] = field(default_factory=lambda: [1.0, 6.0, NON_PRIVATE])
    lambdas: list[float] = field(default_factory=lambda: [0.3, 1.0, 3.0])
    ditto_lambda: float = 1.0
    seeds: list[int] = field(default_factory=lambda: [0])
    rounds: int = 200
    lr: float = 0.01
    num_silos: int = 139  # the schools in the file (smaller only for tests on tiny files)


def methods(study: SchoolStudy) -> dict[str, dict[str, Any]]:
    """Method label -> ``[algorithm]`` section."""
    out: dict[str, dict[str, Any]] = {
        "local": {"name": "local"},
        "fedavg": {"name": "fedavg"},
        "finetune": {"name": "fedavg_then_local", "switch_fraction": 0.5},
        f"ditto(lam={study.ditto_lambda:g})": {"name": "ditto", "lam": study.ditto_lambda},
    }
    for lam in study.lambdas:
        out[f"mr_mtl(lam={lam:g})"] = {"name": "mr_mtl", "lam": lam}
    return out


def school_config(ctx: ExperimentContext, study: SchoolStudy, algorithm: dict, epsilon: float, seed: int) -> dict:
    privacy: dict[str, Any] = {"level": "none"}
    if epsilon != NON_PRIVATE:
        privacy = {"level": "example", "epsilon": epsilon, "delta": 1e-3, "clip": 1.0, "batch_sampling": "poisson"}
    return {
        "seed": seed,
        "executor": "vectorized",
        "data": {
            "name": "school", "root": str(ctx.data_dir("school")), "num_clients": study.num_silos, "test_fraction": 0.2,
            "partition": {"name": "natural", "key": "school"}, "options": {"normalize_target": True, "scale_features": True},
        },
        "model": {"name": "linear", "options": {"zero_init": True}},
        "algorithm": algorithm,
        "client": {"batch_size": 32, "lr": study.lr, "loss": "half_mse"},
        "federation": {"rounds": study.rounds, "clients_per_round": study.num_silos},
        "privacy": privacy,
        "eval": {"every": study.rounds},
        "checkpoint": {"every": 0},
    }


def test_mse(summary: dict) -> float:
    """Test-size-weighted mean over silos of the MSE of the model each silo uses."""
    if "personal_mse_weighted_mean" in summary:
        return summary["personal_mse_weighted_mean"]
    return summary["global_client_mse_weighted_mean"]


def run_study(ctx: ExperimentContext, study: SchoolStudy) -> dict[str, dict[str, list[float]]]:
    """MSE per method, per epsilon label, per seed."""
    results: dict[str, dict[str, list[float]]] = {}
    for label, algorithm in methods(study).items():
        for epsilon in study.epsilons:
            eps_label = "inf" if epsilon == NON_PRIVATE else f"{epsilon:g}"
            for seed in study.seeds:
                out = ctx.runs_dir / f"{label}_eps{eps_label}_seed{seed}"
                config = validate(school_config(ctx, study, algorithm, epsilon, seed))
                summary = run(config, out, resume=out.exists(), progress=False)  # a finished run is re-scored
                results.setdefault(label, {}).setdefault(eps_label, []).append(test_mse(summary))
    return results


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _cell(values: list[float]) -> str:
    mean, std = _mean_std(values)
    return f"{mean:.5f} ± {std:.5f} (n={len(values)})"


def best_lambda(results: dict, study: SchoolStudy, eps_label: str) -> float:
    return min(study.lambdas, key=lambda lam: statistics.fmean(results[f"mr_mtl(lam={lam:g})"][eps_label]))


def plot(results: dict, study: SchoolStudy, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = ["inf" if e == NON_PRIVATE else f"{e:g}" for e in study.epsilons]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    xs = range(len(labels))
    for method, by_eps in results.items():
        means = [_mean_std(by_eps[e])[0] for e in labels]
        stds = [_mean_std(by_eps[e])[1] for e in labels]
        left.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label=method)
    left.set_xticks(list(xs), [f"eps={e}" for e in labels])
    left.set_ylabel("test MSE (normalised scores)")
    left.set_title("School: utility vs privacy")
    left.legend(fontsize=7)
    for e in labels:
        right.plot(study.lambdas, [statistics.fmean(results[f"mr_mtl(lam={lam:g})"][e]) for lam in study.lambdas],
                   marker="o", label=f"MR-MTL, eps={e}")
    right.set_xscale("log")
    right.set_xlabel("lambda")
    right.set_title("MR-MTL: MSE vs lambda")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(results: dict, study: SchoolStudy, quick: bool) -> ExperimentReport:
    rows: list[ResultRow] = []
    labels = ["inf" if e == NON_PRIVATE else f"{e:g}" for e in study.epsilons]
    for e in labels:
        for method, by_eps in results.items():
            paper = README_MSE.get(method, "curve only") if e == "6" else "curve only"
            rows.append(ResultRow(f"eps={e}", f"{method}: test MSE", _cell(by_eps[e]), paper))
    for e in labels:
        lam = best_lambda(results, study, e)
        mrmtl = statistics.fmean(results[f"mr_mtl(lam={lam:g})"][e])
        local, fedavg = statistics.fmean(results["local"][e]), statistics.fmean(results["fedavg"][e])
        beats = mrmtl < min(local, fedavg)
        rows.append(ResultRow(
            f"eps={e}", "MR-MTL(best lambda) < min(Local, FedAvg)",
            f"lambda*={lam:g}: {mrmtl:.5f} vs local {local:.5f}, fedavg {fedavg:.5f}",
            "yes at eps ~ 6 (Fig. 1.3b)", "holds" if beats else "does not hold",
        ))
    private = [e for e in labels if e != "inf"]
    if len(private) >= 2:
        lams = [best_lambda(results, study, e) for e in private]  # epsilons ascending: privacy loosening
        grows = all(a >= b for a, b in zip(lams, lams[1:]))
        rows.append(ResultRow(
            "lambda sweep", "best lambda as epsilon grows " + " -> ".join(private),
            " -> ".join(f"{x:g}" for x in lams), "non-increasing (claim 4)", "holds" if grows else "does not hold",
        ))
    notes = [
        "every method run once per seed at the listed lambdas; the thesis tunes lr and lambda on the test set over "
        "larger grids (lr fixed at 0.01 here, the README's setting)",
        f"seeds: {study.seeds} (the paper: 5); rounds: {study.rounds} (the paper: 200, its code runs 201)",
        "Poisson batches accounted as Poisson (the paper's code shuffles with drop-last but accounts as Poisson)",
        "features divided by their column maxima (the two integer columns reach 91 and 43); the spec does not say "
        "how [C1] scales them, and unscaled they make every small silo's private model useless",
        "a silo's test split is 20% of its rows (fedveil's per-client split; the paper's train_test_split differs in rows)",
    ]
    if quick:
        notes.append("quick mode: 10 rounds, epsilon 6 only, lambda 1, lr 0.03; not comparable to the paper")
    return ExperimentReport(
        title="MR-MTL on School under silo-specific example-level DP",
        source="Liu 2023 (CMU-RI-TR-23-17) Fig. 1.3(b), G.3; kenziyuliu/private-cross-silo-fl README (spec 002 §6.1)",
        rows=rows, scale_notes=notes, extra={"mse": results, "study": study.__dict__ | {"epsilons": labels}},
        figures=["school_mse.png"],
    )


@EXPERIMENTS.register("mrmtl_school", "MR-MTL vs Local/FedAvg/Finetune/Ditto on School, utility vs epsilon and lambda (Liu 2022)")
def mrmtl_school(ctx: ExperimentContext) -> ExperimentReport:
    study = SchoolStudy()
    if ctx.quick:
        study = SchoolStudy(epsilons=[6.0], lambdas=[1.0], rounds=10, lr=0.03)
    results = run_study(ctx, study)
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    plot(results, study, ctx.out_dir / "school_mse.png")
    return report(results, study, ctx.quick)
