"""Robustness customised at test time: dual-BN adversarial training (Split-Mix DAT) vs
FedAvg+AT at several lambda_n, standard (SA) and robust (RA) accuracy (Hong et al. ICLR 2022
Fig. 4.7 a-b, full width; spec 000 part 2 §A.7, §A.12; the paper gives curves, no numbers).

Setup: the five digit domains of ``splitmix_digits`` (``digit_domains_synthetic``, pixels in
[0, 1]); FedBN's digits CNN with tracked BN, no rescaling (the reference code's AT
settings); PGD L-inf eps 8/255, 7 steps, step min(1.25 eps, eps + 4/255) / 7, random start,
in training and at test. FedAvg+AT trains one model per lambda_n (ordinary BN shared by
clean and adversarial batches); DAT trains one dual-BN model with lambda_n = 0.5 and is
mixed at test time with lambda in {0, 0.2, 0.5, 0.8, 1} (Eq. 4.2), the attack made against
the mixed model. The full-width runs of the reference code use one x1 base, so DAT here is
``fedavg`` with a dual-BN model (``split_mix`` with one base is the same training).

FedAvg+OAT (Once-for-All AT, the paper's other baseline) trains one model with FiLM-
conditioned dual BNs, lambda drawn per step from the AT grid, and is served at each of them.

Claims checked: (a) the DAT curve is at least as good as FedAvg+AT's points: for each AT
point, the DAT curve's RA at the same SA (linear interpolation) is not lower, or, where the
curve does not span that SA, some DAT setting is as good on both (:func:`pareto_verdict`);
(b) DAT's lambda trades accuracy for robustness (RA grows and SA falls from 0 to 1); (c) the
DAT curve is at least as good as FedAvg+OAT's points (the paper: OAT is unstable in FL);
(d) Split-Mix DAT's SA and RA grow with width and (e) its widest model beats the only
budget-compatible FedAvg+AT (x0.125) on both (Fig. 4.7c-d). The
gap between the trained clean and noise BNs is reported: the mix can trade no more than it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

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
from fedveil.runtime.run_dir import MODEL_FILE
from fedveil.runtime.saved_model import evaluate_saved
from fedveil.training.adversarial import PGD

from .paper_numbers import paper_numbers
from .splitmix_study import WIDTHS, digit_domains

PAPER = paper_numbers(__name__)
EPS, STEPS = 8 / 255, 7
# method -> setting (lambda_n for AT, test lambda for DAT) -> {"sa": [...], "ra": [...]} per seed
Results = dict[str, dict[float, dict[str, list[float]]]]
# (width, test lambda) of Split-Mix DAT, or "budget_at" (FedAvg+AT at x0.125) -> {"sa", "ra"} per seed
JointResults = dict[Any, dict[str, list[float]]]
JOINT_LAMBDA_N = 0.5
JOINT_METHODS = ("splitmix_dat", "budget_at")  # Fig. 4.7c-d


@dataclass
class RobustStudy:
    at_lambdas: list[float] = field(default_factory=lambda: [0.0, 0.1, 0.3, 0.5, 1.0])
    test_lambdas: list[float] = field(default_factory=lambda: [0.0, 0.2, 0.5, 0.8, 1.0])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    clients_per_domain: int = 2
    rows_per_domain: int = 200
    test_rows_per_domain: int = 100
    size: int = 16
    width: float = 0.25
    rounds: int = 30
    lr: float = 0.1
    oat: bool = True  # also FedAvg+OAT (one FiLM-conditioned model, lambda drawn per step from at_lambdas)
    joint: bool = True  # also width x robustness (Fig. 4.7c-d): Split-Mix DAT vs budget-compatible FedAvg+AT
    joint_width: float = 1.0  # the Split-Mix DAT model's x1: 8 bases of joint_width / 8


def robust_study(quick: bool = False) -> RobustStudy:
    if quick:
        return RobustStudy(at_lambdas=[0.0, 1.0], test_lambdas=[0.0, 1.0], seeds=[0], rows_per_domain=40,
                           test_rows_per_domain=20, rounds=2)
    return RobustStudy()


def run_config(ctx: ReproductionContext, study: RobustStudy, seed: int, norm: str, lam: float,
               oat: bool = False) -> dict[str, Any]:
    """One run: FedAvg+AT at ``lam`` (one BN), DAT (``norm`` dual, ``lam`` 0.5) or, with ``oat``,
    FedAvg+OAT (FiLM dual BN, lambda drawn per step from the AT grid)."""
    adversarial = {"lam": lam, "eps": EPS, "steps": STEPS} if lam > 0 else {}
    if oat:
        adversarial = {"eps": EPS, "steps": STEPS, "oat_lams": list(study.at_lambdas)}
    return {
        "seed": seed,
        "data": digit_domains(ctx, study.clients_per_domain, study.rows_per_domain, study.test_rows_per_domain, study.size),
        "model": {"name": "digit_cnn", "options": {"width": study.width, "norm": norm, "rescale_init": False,
                                                   "rescale_layer": False}},
        "algorithm": {"name": "fedavg", **({"adversarial": adversarial} if adversarial else {})},
        "client": {"epochs": 1, "batch_size": 32, "lr": study.lr, "momentum": 0.9, "weight_decay": 5e-4,
                   "lr_schedule": "cosine"},
        "federation": {"rounds": study.rounds, "clients_per_round": 5 * study.clients_per_domain},
        "eval": {"every": study.rounds, "batch_size": 128},
        "checkpoint": {"every": 5},
    }


def joint_config(ctx: ReproductionContext, study: RobustStudy, seed: int, method: str) -> dict[str, Any]:
    """Fig. 4.7c-d: ``splitmix_dat`` (Split-Mix, 8 dual-BN bases, budgets 8-4-2-1, adversarial
    lambda_n 0.5) or ``budget_at`` (FedAvg+AT at the width every client can afford, x0.125)."""
    adversarial = {"lam": JOINT_LAMBDA_N, "eps": EPS, "steps": STEPS}
    if method == "splitmix_dat":
        config = run_config(ctx, study, seed, "dual_batch_tracked", JOINT_LAMBDA_N)
        config["model"]["options"].update({"width": study.joint_width, "bases": 8})
        config["algorithm"] = {"name": "split_mix", "adversarial": adversarial}
        return config
    config = run_config(ctx, study, seed, "batch_tracked", JOINT_LAMBDA_N)
    config["model"]["options"]["width"] = study.joint_width * WIDTHS[0]
    return config


def score_joint(ctx: ReproductionContext, study: RobustStudy) -> JointResults:
    """SA and RA of Split-Mix DAT at every width x test lambda, and of budget-compatible FedAvg+AT."""
    attack, results = PGD(EPS, STEPS), {}
    scale = study.joint_width  # WIDTHS are relative to the model's x1 (joint_width wide)
    for seed in study.seeds:
        for method in JOINT_METHODS:
            widths, lams = ([w * scale for w in WIDTHS], study.test_lambdas) if method == "splitmix_dat" else ([None], [None])
            for row in evaluate_saved(ctx.runs_dir / f"{method}_seed{seed}", widths, lams=lams, attack=attack):
                key = (row["width"] / scale, row["lam"]) if method == "splitmix_dat" else "budget_at"
                cell = results.setdefault(key, {"sa": [], "ra": []})
                cell["sa"].append(row["accuracy"])
                cell["ra"].append(row["robust_accuracy"])
    return results


def joint_rows(joint: JointResults, study: RobustStudy) -> list[ResultRow]:
    rows = [ResultRow(f"Split-Mix DAT x{w:g}, test lambda = {lam:g}", "SA; RA (PGD-7, 8/255)",
                      f"{st.cell(joint[(w, lam)]['sa'])}; {st.cell(joint[(w, lam)]['ra'])}", "curve only (Fig. 4.7c-d)")
            for w in WIDTHS for lam in study.test_lambdas]
    at = joint["budget_at"]
    rows.append(ResultRow(f"FedAvg+AT x{WIDTHS[0]:g} (budget-compatible), lambda_n = {JOINT_LAMBDA_N:g}",
                          "SA; RA (PGD-7, 8/255)", f"{st.cell(at['sa'])}; {st.cell(at['ra'])}", "curve only (Fig. 4.7c-d)"))
    mid = sorted(study.test_lambdas)[len(study.test_lambdas) // 2]
    small, big = joint[(WIDTHS[0], mid)], joint[(WIDTHS[-1], mid)]
    sa, ra = st.difference(small["sa"], big["sa"]), st.difference(small["ra"], big["ra"])
    rows.append(ResultRow(
        f"Split-Mix DAT, test lambda {mid:g}, x{WIDTHS[0]:g} -> x{WIDTHS[-1]:g}", "(d) SA and RA grow with width",
        f"SA {st.mean(small['sa']):.4f} -> {st.mean(big['sa']):.4f}; RA {st.mean(small['ra']):.4f} -> {st.mean(big['ra']):.4f}",
        "both rise with width (Fig. 4.7c-d)", f"SA: {st.lower_verdict(*sa)}; RA: {st.lower_verdict(*ra)}",
    ))
    sa, ra = st.difference(at["sa"], big["sa"]), st.difference(at["ra"], big["ra"])
    rows.append(ResultRow(
        f"Split-Mix DAT x{WIDTHS[-1]:g} (test lambda {mid:g}) vs FedAvg+AT x{WIDTHS[0]:g}",
        "(e) the widest customised model beats the only budget-compatible FedAvg on both",
        f"SA {st.mean(big['sa']):.4f} vs {st.mean(at['sa']):.4f}; RA {st.mean(big['ra']):.4f} vs {st.mean(at['ra']):.4f}",
        "Fig. 4.7c-d", f"SA: {st.at_least_verdict(*sa)}; RA: {st.at_least_verdict(*ra)}",
    ))
    return rows


def plot_joint(joint: JointResults, study: RobustStudy, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    for w in WIDTHS:
        cells = [joint[(w, lam)] for lam in study.test_lambdas]
        ax.plot([st.mean(c["sa"]) for c in cells], [st.mean(c["ra"]) for c in cells], marker="o",
                label=f"Split-Mix DAT x{w:g}, lambda {min(study.test_lambdas):g}..{max(study.test_lambdas):g}")
    at = joint["budget_at"]
    ax.plot([st.mean(at["sa"])], [st.mean(at["ra"])], "k*", markersize=12, label=f"FedAvg+AT x{WIDTHS[0]:g} (budget)")
    ax.set_xlabel("standard accuracy (SA)")
    ax.set_ylabel("robust accuracy (RA, PGD-7 8/255)")
    ax.set_title(f"Width x robustness customised at test time ({len(study.seeds)} seed(s))")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def trained(study: RobustStudy) -> list[tuple[str, float | None, int, str]]:
    """(method, AT lambda_n or None, seed, run name) of every Fig. 4.7a-b training run."""
    runs = []
    for seed in study.seeds:
        runs += [("fedavg_at", lam, seed, f"at_lam{lam:g}_seed{seed}") for lam in study.at_lambdas]
        runs.append(("dat", None, seed, f"dat_seed{seed}"))
        if study.oat:
            runs.append(("oat", None, seed, f"oat_seed{seed}"))
    return runs


def trained_config(ctx: ReproductionContext, study: RobustStudy, method: str, lam: float | None, seed: int) -> dict[str, Any]:
    if method == "fedavg_at":
        return run_config(ctx, study, seed, "batch_tracked", lam)
    if method == "dat":
        return run_config(ctx, study, seed, "dual_batch_tracked", 0.5)
    return run_config(ctx, study, seed, "film_dual_batch_tracked", 0.0, oat=True)


def study_plan(ctx: ReproductionContext, study: RobustStudy) -> list[PlannedRun]:
    """The Fig. 4.7a-b runs, then (``joint``) the width x robustness ones."""
    runs = [PlannedRun(name, trained_config(ctx, study, method, lam, seed)) for method, lam, seed, name in trained(study)]
    if study.joint:
        runs += [PlannedRun(f"{m}_seed{seed}", joint_config(ctx, study, seed, m)) for seed in study.seeds for m in JOINT_METHODS]
    return runs


def score(ctx: ReproductionContext, study: RobustStudy) -> tuple[Results, list[float]]:
    """SA and RA of every setting, and each DAT model's clean / noise BN gap (:func:`bn_gap`)."""
    attack = PGD(EPS, STEPS)
    results: Results = {}
    gaps: list[float] = []
    for method, lam, _, name in trained(study):
        out = ctx.runs_dir / name
        if method == "dat":
            gaps.append(bn_gap(out))
        lams = {"dat": study.test_lambdas, "oat": study.at_lambdas}.get(method, [None])
        for row in evaluate_saved(out, lams=lams, attack=attack):
            cell = results.setdefault(method, {}).setdefault(lam if method == "fedavg_at" else row["lam"], {"sa": [], "ra": []})
            cell["sa"].append(row["accuracy"])
            cell["ra"].append(row["robust_accuracy"])
    return results, gaps


def bn_gap(run_dir: Path) -> float:
    """How far apart the trained clean and noise BNs are: the mean over dual BN layers of
    ||stat_clean - stat_noise|| / ||stat_clean|| for the running mean and the running variance."""
    state = torch.load(Path(run_dir) / MODEL_FILE, weights_only=True)
    gaps = []
    for key in state:
        if key.endswith(".clean.running_mean") or key.endswith(".clean.running_var"):
            clean, noise = state[key], state[key.replace(".clean.", ".noise.")]
            gaps.append(float((clean - noise).norm() / clean.norm()))
    return sum(gaps) / len(gaps)


def curve_ra_at(dat: dict[float, dict[str, list[float]]], sa: float) -> float:
    """The DAT curve's RA at standard accuracy ``sa`` (mean curve, linear in SA; NaN outside its SA range)."""
    points = sorted((st.mean(v["sa"]), st.mean(v["ra"])) for v in dat.values())
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    if not xs[0] - 1e-9 <= sa <= xs[-1] + 1e-9:
        return float("nan")
    return float(np.interp(sa, xs, ys))


def table_rows(results: Results, study: RobustStudy) -> list[ResultRow]:
    rows = []
    for lam in study.at_lambdas:
        got = results["fedavg_at"][lam]
        rows.append(ResultRow(f"FedAvg+AT, lambda_n = {lam:g}", "SA; RA (PGD-7, 8/255)",
                              f"{st.cell(got['sa'])}; {st.cell(got['ra'])}", "curve only (Fig. 4.7a)"))
    for lam in study.test_lambdas:
        got = results["dat"][lam]
        rows.append(ResultRow(f"DAT (lambda_n = 0.5), test lambda = {lam:g}", "SA; RA (PGD-7, 8/255)",
                              f"{st.cell(got['sa'])}; {st.cell(got['ra'])}", "curve only (Fig. 4.7a)"))
    for lam, got in sorted(results.get("oat", {}).items()):
        rows.append(ResultRow(f"FedAvg+OAT, test lambda = {lam:g}", "SA; RA (PGD-7, 8/255)",
                              f"{st.cell(got['sa'])}; {st.cell(got['ra'])}", "curve only (Fig. 4.7a-b)"))
    return rows


def pareto_verdict(at: dict[str, list[float]], dat: dict[float, dict[str, list[float]]]) -> tuple[str, str]:
    """Whether the DAT curve is at least as good as one FedAvg+AT point: the curve's RA at the
    point's SA when the curve spans it; else whether some DAT setting is as good on both SA and
    RA (within 2 standard errors), or the AT point beats every DAT setting on both."""
    sa, ra = st.mean(at["sa"]), st.mean(at["ra"])
    slack_sa, slack_ra = 2 * st.sem(at["sa"]), 2 * st.sem(at["ra"])
    curve = curve_ra_at(dat, sa)
    if not np.isnan(curve):
        return f"{curve:.4f} vs {ra:.4f}", "holds" if curve >= ra - slack_ra else "does not hold"
    points = [(st.mean(v["sa"]), st.mean(v["ra"])) for v in dat.values()]
    best = max(points, key=lambda p: p[1])
    shown = f"DAT best RA {best[1]:.4f} at SA {best[0]:.4f} vs {ra:.4f} at SA {sa:.4f}"
    if any(s >= sa - slack_sa and r >= ra - slack_ra for s, r in points):
        return shown, "holds (a DAT setting is as good on both)"
    if all(sa >= s and ra >= r for s, r in points):
        return shown, "does not hold (the AT point beats every DAT setting)"
    return shown, "neither dominates (a trade-off)"


def claim_rows(results: Results, study: RobustStudy, gaps: list[float]) -> list[ResultRow]:
    dat, rows = results["dat"], []
    for lam in study.at_lambdas:
        measured, verdict = pareto_verdict(results["fedavg_at"][lam], dat)
        rows.append(ResultRow(
            f"FedAvg+AT lambda_n = {lam:g}", "(a) the DAT curve is at least as good as the AT point",
            measured, "DAT curve above AT points (Fig. 4.7a)", verdict,
        ))
    for lam, point in sorted(results.get("oat", {}).items()):
        measured, verdict = pareto_verdict(point, dat)
        rows.append(ResultRow(
            f"FedAvg+OAT test lambda = {lam:g}", "(c) the DAT curve is at least as good as the OAT point",
            measured, "DAT smoother and above FedAvg+OAT (Fig. 4.7a-b)", verdict,
        ))
    lo, hi = min(study.test_lambdas), max(study.test_lambdas)
    sa_drop = st.difference(dat[hi]["sa"], dat[lo]["sa"])
    ra_gain = st.difference(dat[lo]["ra"], dat[hi]["ra"])
    rows.append(ResultRow(
        f"DAT, test lambda {lo:g} -> {hi:g}", "(b) RA rises and SA falls with lambda",
        f"RA {st.mean(dat[lo]['ra']):.4f} -> {st.mean(dat[hi]['ra']):.4f}; SA {st.mean(dat[lo]['sa']):.4f} -> "
        f"{st.mean(dat[hi]['sa']):.4f}", "smooth trade-off (Fig. 4.7a)",
        f"RA: {st.lower_verdict(*ra_gain)}; SA: {st.lower_verdict(*sa_drop)}",
    ))
    if gaps:
        rows.append(ResultRow(
            "DAT model", "relative gap between its clean and noise BN running statistics (mean over layers)",
            st.cell(gaps), "not reported",
            "the mix can only trade what the two BNs learned differently",
        ))
    return rows


def scale_notes(study: RobustStudy, quick: bool) -> list[str]:
    notes = [
        "data: digit_domains_synthetic (MNIST and four synthetic SVHN / USPS / SynthDigits / MNIST-M-like domains of "
        f"disjoint MNIST rows) at {study.size}x{study.size} instead of FedBN's Digits at 28x28; "
        f"{study.rows_per_domain} training and {study.test_rows_per_domain} test rows per domain, "
        f"{5 * study.clients_per_domain} clients (the paper: 50)",
        f"model: the digits CNN at width {study.width:g} as the 'full-width' net (the paper: x1), tracked BN, no rescaling",
        f"training: {study.rounds} rounds (the paper's code: 300), 1 epoch, lr {study.lr} cosine, momentum 0.9; "
        f"seeds {study.seeds}",
        "attack: the reference code's PGD (step (10/255)/7, random start) for training and test (the thesis: step 2/255)",
        "score: the final model on the pooled test rows (the paper: best-validation checkpoint by (1 - lambda) SA + "
        "lambda RA, per-client mean)",
        "FedAvg+OAT: the digits CNN with FiLM-conditioned dual BNs (an MLP of lambda per BN, OAT's clean BN at "
        "lambda 0 and adversarial BN otherwise), lambda drawn per step from the AT grid, served at each of them",
        f"width x robustness (Fig. 4.7c-d): Split-Mix DAT with 8 dual-BN bases of x{study.joint_width / 8:g} "
        f"(x1 = digits CNN width {study.joint_width:g}), budgets 8-4-2-1, lambda_n {JOINT_LAMBDA_N}, lr {study.lr}, "
        "served at every width x test lambda; FedAvg+AT at x0.125 is the only FedAvg every client can afford",
    ]
    if quick:
        notes.append(f"quick mode: {study.rounds} rounds, {study.rows_per_domain} rows per domain, one seed; not comparable")
    return notes


def plot(results: Results, study: RobustStudy, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    at = results["fedavg_at"]
    ax.errorbar([st.mean(at[l]["sa"]) for l in study.at_lambdas], [st.mean(at[l]["ra"]) for l in study.at_lambdas],
                xerr=[st.std(at[l]["sa"]) for l in study.at_lambdas], yerr=[st.std(at[l]["ra"]) for l in study.at_lambdas],
                fmt="s", capsize=3, label="FedAvg+AT (one model per lambda_n)")
    for lam in study.at_lambdas:
        ax.annotate(f"{lam:g}", (st.mean(at[lam]["sa"]), st.mean(at[lam]["ra"])), fontsize=7)
    dat = results["dat"]
    ax.errorbar([st.mean(dat[l]["sa"]) for l in study.test_lambdas], [st.mean(dat[l]["ra"]) for l in study.test_lambdas],
                xerr=[st.std(dat[l]["sa"]) for l in study.test_lambdas], yerr=[st.std(dat[l]["ra"]) for l in study.test_lambdas],
                marker="o", capsize=3, label="DAT, one model, lambda chosen at test")
    oat = results.get("oat", {})
    if oat:
        lams = sorted(oat)
        ax.errorbar([st.mean(oat[l]["sa"]) for l in lams], [st.mean(oat[l]["ra"]) for l in lams],
                    xerr=[st.std(oat[l]["sa"]) for l in lams], yerr=[st.std(oat[l]["ra"]) for l in lams],
                    marker="^", linestyle="--", capsize=3, label="FedAvg+OAT, one model, lambda chosen at test")
    ax.set_xlabel("standard accuracy (SA)")
    ax.set_ylabel("robust accuracy (RA, PGD-7 8/255)")
    ax.set_title(f"Robustness trade-off, mean ± std over {len(study.seeds)} seed(s)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def study_report(ctx: ReproductionContext, study: RobustStudy) -> ReproductionReport:
    """SA and RA of every model and setting, the claims and the figures."""
    results, gaps = score(ctx, study)
    joint = score_joint(ctx, study) if study.joint else {}
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    figures = ["robustness_tradeoff.png"]
    plot(results, study, ctx.out_dir / figures[0])
    if joint:
        figures.append("width_robustness.png")
        plot_joint(joint, study, ctx.out_dir / figures[1])
    return ReproductionReport(
        title="Robustness customised at test time: dual-BN adversarial training vs FedAvg+AT",
        source=PAPER["source"],
        rows=table_rows(results, study) + claim_rows(results, study, gaps) + (joint_rows(joint, study) if joint else []),
        scale_notes=scale_notes(study, ctx.quick),
        extra={"study": asdict(study), "results": {m: {f"{k:g}": v for k, v in by.items()} for m, by in results.items()},
               "bn_gap": gaps,
               "joint": {("budget_at" if k == "budget_at" else f"x{k[0]:g}, lambda {k[1]:g}"): v for k, v in joint.items()}},
        figures=figures,
    )


def plan(ctx: ReproductionContext) -> list[PlannedRun]:
    return study_plan(ctx, robust_study(ctx.quick))


def report(ctx: ReproductionContext, summaries: Summaries) -> ReproductionReport:
    return study_report(ctx, robust_study(ctx.quick))


REPRODUCTIONS.register("splitmix_robust", "Split-Mix dual-BN AT vs FedAvg+AT: SA-RA trade-off chosen at test time (Fig. 4.7)")(
    Reproduction(plan, report)
)
