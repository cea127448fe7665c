"""MR-MTL and Ditto vs lambda on heterogeneous CIFAR-10-like silos, on a SYNTHETIC 32x32
stand-in (Liu et al. 2022, Fig. 1.3(d), G.4; spec 002 §5, §6.1).

The paper's split (pFedHN's): 30 silos, each with a random number of images of 5 random
classes of CIFAR-10's 10, 1,515-1,839 training images per silo, its ConvNet, batch 100,
clip 8, delta 1e-4, 200 rounds. CIFAR-10 cannot be had offline here, so the silos hold
``multidomain_synthetic`` images (one domain, 10 classes, 32x32x3: smooth class
prototypes with within-class fields and pixel noise), 5 classes each (the ``shards``
partitioner: every class held by 15 silos, rows dealt evenly). Every method's learning
rate is tuned per epsilon on a seed that is not reported, as the paper tunes eta.
Claims checked:

- Fig. 1.3(d): MR-MTL at its best lambda is at least as good as Local and FedAvg;
- Fig. G.4: Ditto's best lambda is larger under privacy, but its utility at that lambda
  is below MR-MTL's (its second training per round costs noise; claim 8).

Two more arms test why FedAvg wins under DP. The main stand-in's silos hold ~160 training
rows, so keeping the paper's sampling rate means batch 10 where the paper's is 100, and its
MLP has 4.6x the ConvNet's parameters: each silo's DP-SGD step is 11-13x noisier than the
paper's (:func:`noise_to_signal`). The "paper noise-to-signal" arm reruns Fig. 1.3(d) at
the paper's ratio (5x the rows at 5x the batch, a 16-unit MLP); its "noise control" reruns
the arm's silos at batch 10, which changes only the noise-to-signal (3x).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from fedveil.models import build_model
from fedveil.models.complexity import count_params
from fedveil.privacy.calibration import calibrate_noise
from fedveil.reproduce import (
    REPRODUCTIONS,
    ReproductionContext,
    ReproductionReport,
    ResultRow,
    StudyReproduction,
)

from .paper_numbers import paper_numbers
from .silo_study import (
    NON_PRIVATE,
    LearningRates,
    Results,
    SiloStudy,
    SiloTask,
    beats_both_rows,
    best_lambda,
    eps_label,
    example_privacy,
    gap_text,
    lambda_trend_row,
    lr_edge_notes,
    lr_rows,
    mean_score,
    mr_mtl_label,
    paired_gap,
    plot_study,
    run_tuned_grid,
    score_rows,
    study_record,
)

PAPER = paper_numbers(__name__)

SILOS, CLASSES_PER_SILO = 30, 5
MLP = {"name": "mlp", "options": {"hidden": [64]}}
SMALL_MLP = {"name": "mlp", "options": {"hidden": [16]}}  # 49,338 parameters, near the paper's ConvNet
INTRA_CLASS, PIXEL_NOISE = 3.0, 1.5  # per-silo logistic regression scores ~0.7: hard, as CIFAR-10 is
CONVNET = {"name": "convnet"}  # the paper's ConvNet (42,442 parameters at 32x32x3)
# the paper's per-silo DP-SGD (spec 002 §5): ConvNet, ~1,670 training rows per silo, batch 100, 200 one-epoch rounds
PAPER_PARAMS, PAPER_ROWS, PAPER_BATCH, PAPER_ROUNDS = 42_442, 1_670, 100, 200


def ditto_label(lam: float) -> str:
    return f"ditto(lam={lam:g})"


def cifar_study(epsilons: list[float], lambdas: list[float], seeds: list[int], rounds: int,
                ditto_lambdas: list[float] | None = None) -> SiloStudy:
    """Local, FedAvg, MR-MTL over ``lambdas`` and Ditto over ``ditto_lambdas`` (default: the same)."""
    ditto = lambdas if ditto_lambdas is None else ditto_lambdas
    return SiloStudy(epsilons=epsilons, lambdas=lambdas, baselines=["local", "fedavg"], seeds=seeds, rounds=rounds,
                     lr=0.01, extra_methods={ditto_label(lam): {"name": "ditto", "lam": lam} for lam in ditto})


@dataclass
class CifarPlan:
    samples_per_class: int = 600  # 6,000 images: 200 per silo (the paper: ~1,900 of real CIFAR-10)
    silos: int = SILOS  # fewer only in tests
    batch_size: int = 10  # 10 of ~160 training rows: the paper's sampling rate (100 of ~1,670)
    model: dict = field(default_factory=lambda: dict(MLP))
    study: SiloStudy = field(default_factory=lambda: cifar_study([2.0, 8.0, NON_PRIVATE], [0.1, 1.0, 10.0], [1, 2], 50,
                                                                    ditto_lambdas=[0.1, 1.0]))
    lrs: list[float] = field(default_factory=lambda: [0.0003, 0.001, 0.003, 0.01, 0.03])  # tuned per method and epsilon
    tune_seeds: list[int] = field(default_factory=lambda: [0])  # their runs pick the lr and are not reported
    arms: "list[Arm]" = field(default_factory=lambda: [paper_noise_arm(), noise_control_arm()])


@dataclass
class Arm:
    """A variant of the study run beside the main one: ``name`` is its setting column, its
    runs live in ``folder`` under the experiment's runs folder."""

    name: str
    folder: str
    plan: CifarPlan


PAPER_NOISE, NOISE_CONTROL = "paper noise-to-signal", "noise control (batch 10)"


def paper_noise_arm() -> Arm:
    """The study at the paper's noise-to-signal: 5x the rows per silo (~800 training rows),
    so that batch 50 keeps the sampling rate, and a 16-unit MLP (49k parameters) for the
    64-unit one (197k); Local, FedAvg and MR-MTL only."""
    return Arm(PAPER_NOISE, "paper_noise", CifarPlan(
        samples_per_class=3000, batch_size=50, model=dict(SMALL_MLP), lrs=[0.001, 0.003, 0.01, 0.03], arms=[],
        study=cifar_study([2.0, 8.0, NON_PRIVATE], [0.1, 1.0, 10.0], [1, 2], 50, ditto_lambdas=[])))


def noise_control_arm() -> Arm:
    """The paper-noise arm's silos and model at batch 10: the sampling rate falls 5x (so
    sigma falls too) and the noise-to-signal rises 3x; nothing else changes but the number
    of steps per epoch. At epsilon 8 with the arm's best lambda there (1)."""
    arm = paper_noise_arm().plan
    return Arm(NOISE_CONTROL, "noise_control", CifarPlan(
        samples_per_class=arm.samples_per_class, batch_size=10, model=arm.model, lrs=[0.001, 0.003], arms=[],
        study=cifar_study([8.0], [1.0], [1, 2], 50, ditto_lambdas=[])))


def quick_plan() -> CifarPlan:
    return CifarPlan(study=cifar_study([8.0, NON_PRIVATE], [1.0], [1], 3), lrs=[0.003, 0.01], arms=[])


def cifar_task(plan: CifarPlan) -> SiloTask:
    """Test accuracy of the model each silo uses."""

    def config(algorithm: dict, epsilon: float, seed: int, study: SiloStudy) -> dict[str, Any]:
        return {
            "seed": seed,
            "executor": "vectorized",
            "data": {
                "name": "multidomain_synthetic", "num_clients": plan.silos, "test_fraction": 0.2,
                "options": {"num_classes": 10, "num_domains": 1, "samples_per_class": plan.samples_per_class,
                            "image_size": 32, "intra_class": INTRA_CLASS, "noise": PIXEL_NOISE, "seed": 0},
                "partition": {"name": "shards", "classes_per_client": CLASSES_PER_SILO},
            },
            "model": plan.model,
            "algorithm": algorithm,
            "client": {"batch_size": plan.batch_size, "lr": study.lr},
            "federation": {"rounds": study.rounds, "clients_per_round": plan.silos},
            "privacy": example_privacy(epsilon, delta=1e-4, clip=8.0),
            "eval": {"every": study.rounds},
            "checkpoint": {"every": 0},
        }

    return SiloTask("heterogeneous CIFAR-10 silos (synthetic stand-in)", "accuracy", config)


def noise_to_signal(epsilon: float, rows: int, batch: int, rounds: int, params: int) -> float:
    """sigma * sqrt(d) / B: the expected norm of the Gaussian noise on one DP-SGD step's mean
    gradient in units of the clip norm (the most one example's clipped gradient can add),
    sigma calibrated (RDP, Poisson) to (epsilon, 1e-4) at sampling rate B/n over ``rounds``
    one-epoch rounds of ceil(n/B) steps, as every silo's DP-SGD here and in the paper."""
    sigma = calibrate_noise(epsilon, 1e-4, batch / rows, rounds * math.ceil(rows / batch))
    return sigma * math.sqrt(params) / batch


def silo_train_rows(plan: CifarPlan) -> int:
    return int(plan.samples_per_class * 10 / plan.silos * 0.8)  # 10 classes, 20% of each silo held out


def model_params(plan: CifarPlan) -> int:
    return count_params(build_model(plan.model["name"], (3, 32, 32), 10, **plan.model.get("options", {})))


def plan_noise_to_signal(plan: CifarPlan, epsilon: float) -> float:
    return noise_to_signal(epsilon, silo_train_rows(plan), plan.batch_size, plan.study.rounds, model_params(plan))


def noise_rows(plan: CifarPlan) -> list[ResultRow]:
    """Per private epsilon: each silo's DP-SGD noise-to-signal in the main stand-in and in
    each arm run at that epsilon, beside the paper's (ConvNet, ~1,670 rows, batch 100, 200 rounds)."""
    rows = []
    for eps in (e for e in plan.study.epsilons if e != NON_PRIVATE):
        paper = noise_to_signal(eps, PAPER_ROWS, PAPER_BATCH, PAPER_ROUNDS, PAPER_PARAMS)
        plans = {"main stand-in": plan, **{arm.name: arm.plan for arm in plan.arms if eps in arm.plan.study.epsilons}}
        ratios = {name: plan_noise_to_signal(p, eps) for name, p in plans.items()}
        rows.append(ResultRow(
            f"eps={eps_label(eps)}", "per-silo DP-SGD noise-to-signal, sigma sqrt(d) / B",
            "; ".join(f"{name} {ratios[name]:.1f} (B={p.batch_size}, n={silo_train_rows(p)}, d={model_params(p):,})"
                      for name, p in plans.items()),
            f"{paper:.1f} (the paper's setting)",
            "; ".join(f"{name} {ratio / paper:.1f}x the paper's" for name, ratio in ratios.items()),
        ))
    return rows


def ditto_lambdas(study: SiloStudy) -> list[float]:
    return [a["lam"] for a in study.extra_methods.values() if a["name"] == "ditto"]


def best_ditto(results: Results, study: SiloStudy, eps: str) -> float:
    return max(ditto_lambdas(study), key=lambda lam: mean_score(results, ditto_label(lam), eps))


def ditto_rows(results: Results, study: SiloStudy, task: SiloTask) -> list[ResultRow]:
    """Fig. G.4 at each private epsilon: Ditto's best lambda against its best without DP,
    and Ditto at its best lambda against MR-MTL at its best."""
    free = best_ditto(results, study, "inf")
    rows = []
    for e in (eps_label(x) for x in study.epsilons if x != NON_PRIVATE):
        lam = best_ditto(results, study, e)
        rows.append(ResultRow(
            f"eps={e}", "Ditto's best lambda under DP vs without DP", f"{lam:g} vs {free:g}",
            PAPER["claims"]["ditto_lambda_larger"], "holds" if lam > free else "does not hold",
        ))
        mr = best_lambda(results, study, task, e)
        mean, se = gap = paired_gap(results[ditto_label(lam)][e], results[mr_mtl_label(mr)][e])
        rows.append(ResultRow(
            f"eps={e}", f"Ditto(lambda*={lam:g}) vs MR-MTL(lambda*={mr:g})", gap_text(mr_mtl_label(mr), gap),
            PAPER["claims"]["ditto_worse"], "holds" if mean < -2 * se else "does not hold",
        ))
    return rows


def misses_explained(results: Results, study: SiloStudy) -> list[str]:
    """Where FedAvg beats MR-MTL at every lambda: whether the lambda grid can be the cause
    (the best lambda is the grid's largest) or not (the score falls past the best one)."""
    notes = []
    for e in map(eps_label, study.epsilons):
        scores = {lam: mean_score(results, mr_mtl_label(lam), e) for lam in study.lambdas}
        fedavg = mean_score(results, "fedavg", e)
        if max(scores.values()) >= fedavg:
            continue
        best = max(scores, key=scores.__getitem__)
        tried = ", ".join(f"{lam:g}: {v:.3f}" for lam, v in scores.items())
        why = ("the best lambda is the grid's largest, so a stronger pull might close the gap" if best == max(study.lambdas)
               else f"past lambda {best:g} the score falls, so the lambda grid is not the cause")
        notes.append(f"eps={e}: FedAvg ({fedavg:.3f}) beats MR-MTL at every lambda tried ({tried}); {why}")
    return notes


@dataclass
class ArmResults:
    """An arm's scores and tuned learning rates."""

    scores: Results
    lrs: LearningRates


def mrmtl_minus_fedavg(scores: Results, study: SiloStudy, task: SiloTask, e: str) -> tuple[float, tuple[float, float]]:
    """MR-MTL's best lambda at ``e`` and its paired gap to FedAvg (mean, s.e.)."""
    lam = best_lambda(scores, study, task, e)
    return lam, paired_gap(scores[mr_mtl_label(lam)][e], scores["fedavg"][e])


def noise_cause_rows(results: Results, arm: ArmResults, study: SiloStudy, arm_study: SiloStudy,
                     task: SiloTask) -> list[ResultRow]:
    """Per private epsilon where FedAvg beats MR-MTL at every lambda in the main stand-in:
    MR-MTL(best lambda) minus FedAvg there and in the paper-noise arm, and the same gaps
    without DP (what the arm's larger silos change with no noise at all). The noise-to-signal
    is the cause when the arm turns the gap (MR-MTL at or above FedAvg), part of it when the
    arm only narrows it."""
    def gaps(e: str) -> tuple[tuple[float, tuple[float, float]], tuple[float, tuple[float, float]]]:
        return mrmtl_minus_fedavg(results, study, task, e), mrmtl_minus_fedavg(arm.scores, arm_study, task, e)

    free = ""
    if NON_PRIVATE in study.epsilons and NON_PRIVATE in arm_study.epsilons:
        (_, (main_free, _)), (_, (arm_free, _)) = gaps("inf")
        free = f"; without DP: main {main_free:+.4f}, arm {arm_free:+.4f}"
    rows = []
    for e in (eps_label(x) for x in study.epsilons if x != NON_PRIVATE and x in arm_study.epsilons):
        (main_lam, main_gap), (arm_lam, arm_gap) = gaps(e)
        if main_gap[0] >= 0:
            continue
        rows.append(ResultRow(
            f"eps={e}", "why FedAvg beats MR-MTL: MR-MTL(best lambda) minus FedAvg, main stand-in vs paper-noise arm",
            f"main (lambda*={main_lam:g}) {gap_text('fedavg', main_gap)}; arm (lambda*={arm_lam:g}) "
            f"{gap_text('fedavg', arm_gap)}{free}", PAPER["claims"]["beats_fedavg"],
            "the cause is each silo's DP noise-to-signal: at the paper's ratio MR-MTL is at or above FedAvg"
            if arm_gap[0] >= 0 else
            f"partly the noise-to-signal: at the paper's ratio the gap narrows ({main_gap[0]:+.3f} -> {arm_gap[0]:+.3f}) "
            "but FedAvg still wins; the rest is not diagnosed" if arm_gap[0] > main_gap[0]
            else "not the noise-to-signal: FedAvg wins by as much at the paper's ratio",
        ))
    return rows


def dp_cost_rows(results: Results, study: SiloStudy, task: SiloTask, setting: str = "") -> list[ResultRow]:
    """Per private epsilon: the accuracy each of Local, FedAvg and MR-MTL (best lambda at
    each epsilon) loses to DP against its own no-DP score. Per-silo DP noise hits the
    models a silo trains alone hardest; FedAvg averages 30 silos' noise away."""
    if NON_PRIVATE not in study.epsilons:
        return []
    prefix = f"{setting}, " if setting else ""

    def score(label: str, e: str) -> float:
        return mean_score(results, label, e)

    rows = []
    for e in (eps_label(x) for x in study.epsilons if x != NON_PRIVATE):
        free, private = best_lambda(results, study, task, "inf"), best_lambda(results, study, task, e)
        lost = {"local": score("local", e) - score("local", "inf"), "fedavg": score("fedavg", e) - score("fedavg", "inf"),
                "mr_mtl": score(mr_mtl_label(private), e) - score(mr_mtl_label(free), "inf")}
        rows.append(ResultRow(
            f"{prefix}eps={e}", "accuracy lost to DP (score at eps minus without DP; MR-MTL at each one's best lambda)",
            ", ".join(f"{m} {v:+.3f}" for m, v in lost.items()), "",
        ))
    return rows


def noise_control_rows(paper: ArmResults, control: ArmResults, arms: dict[str, Arm], task: SiloTask) -> list[ResultRow]:
    """At each epsilon of the noise control: MR-MTL(best lambda) minus FedAvg on the same
    silos at the paper-noise arm's batch and at the control's. Noise alone is the cause
    when the control turns MR-MTL's win into a loss."""
    at_paper, at_control = arms[PAPER_NOISE].plan, arms[NOISE_CONTROL].plan
    rows = []
    for e in (eps_label(x) for x in at_control.study.epsilons):
        (lam_p, gap_p), (lam_c, gap_c) = (mrmtl_minus_fedavg(paper.scores, at_paper.study, task, e),
                                          mrmtl_minus_fedavg(control.scores, at_control.study, task, e))
        verdict = ("no test: FedAvg already wins at the larger batch" if gap_p[0] < 0 else
                   "noise alone turns it: on the same silos FedAvg wins once the noise-to-signal is 3x"
                   if gap_c[0] < -2 * gap_c[1] else
                   "noise alone erases MR-MTL's lead: on the same silos at 3x the noise-to-signal it is within 2 s.e. "
                   "of FedAvg" if gap_c[0] < 0 else
                   "noise alone does not turn it: MR-MTL stays at or above FedAvg at 3x the noise-to-signal")
        rows.append(ResultRow(
            f"eps={e}", f"MR-MTL(best lambda) minus FedAvg on the same silos, batch {at_paper.batch_size} vs batch "
            f"{at_control.batch_size} (only the noise-to-signal changes)",
            f"batch {at_paper.batch_size}: lambda*={lam_p:g} {gap_text('fedavg', gap_p)}; batch {at_control.batch_size}: "
            f"lambda*={lam_c:g} {gap_text('fedavg', gap_c)}", "", verdict,
        ))
    return rows


def arm_rows(arm: Arm, res: ArmResults, task: SiloTask) -> list[ResultRow]:
    """An arm's scores, tuned rates and the Fig. 1.3(d) verdicts."""
    study, name = arm.plan.study, arm.name
    return (score_rows(res.scores, study, task, {}, setting=name)
            + lr_rows(res.lrs, study, setting=name, paper="tuned on the test set (the paper)")
            + beats_both_rows(res.scores, study, task, PAPER["claims"]["beats_both"], setting=name)
            + dp_cost_rows(res.scores, study, task, setting=name)
            + lambda_trend_row(res.scores, study, task, setting=f"{name}, lambda sweep"))


def arm_figure(arm: Arm) -> str:
    return f"cifar_silos_{arm.folder}.png"


def report(results: Results, lrs: LearningRates, plan: CifarPlan, task: SiloTask, quick: bool,
           arm_results: dict[str, ArmResults] | None = None) -> ReproductionReport:
    study = plan.study
    rows = score_rows(results, study, task, {})
    rows += lr_rows(lrs, study, paper="tuned on the test set (the paper)")
    rows += beats_both_rows(results, study, task, PAPER["claims"]["beats_both"])
    rows += lambda_trend_row(results, study, task)
    rows += ditto_rows(results, study, task)
    rows += dp_cost_rows(results, study, task)
    arm_results = arm_results or {}
    arms = {arm.name: arm for arm in plan.arms if arm.name in arm_results}
    if arms:
        rows += noise_rows(plan)
    for name, arm in arms.items():
        rows += arm_rows(arm, arm_results[name], task)
    if PAPER_NOISE in arms:
        rows += noise_cause_rows(results, arm_results[PAPER_NOISE], study, arms[PAPER_NOISE].plan.study, task)
        if NOISE_CONTROL in arms:
            rows += noise_control_rows(arm_results[PAPER_NOISE], arm_results[NOISE_CONTROL], arms, task)
    notes = [
        f"SYNTHETIC stand-in for CIFAR-10 (multidomain_synthetic: one domain, 10 classes, {plan.samples_per_class} "
        f"images per class at 32x32x3, within-class field {INTRA_CLASS:g}, pixel noise {PIXEL_NOISE:g}, raw pixels); "
        "CIFAR-10 is not available offline",
        f"{plan.silos} silos of {CLASSES_PER_SILO} classes each (shards: every class held by 15 silos, rows dealt evenly, "
        f"~{plan.samples_per_class * 10 // plan.silos} rows per silo, 20% held out; the paper: random sizes 1,515-1,839)",
        f"model {plan.model} (the paper: its ConvNet, `convnet` in the zoo, ~15x the cost per round on 2 CPU cores); "
        f"batch {plan.batch_size} (the paper's sampling rate), clip 8, delta 1e-4, lr tuned per method and epsilon over "
        f"{plan.lrs} on seed {plan.tune_seeds} (not reported), rounds {study.rounds} (the paper: 200), reported seeds "
        f"{study.seeds} (the paper: 5), MR-MTL lambdas {study.lambdas}, Ditto lambdas {ditto_lambdas(study)}",
    ]
    notes += lr_edge_notes(lrs, plan.lrs)
    notes += misses_explained(results, study)
    extra = {"accuracy": results, "lrs": lrs, "model": plan.model, "study": study_record(study)}
    figures = ["cifar_silos.png"]
    for name, arm in arms.items():
        a, res = arm.plan, arm_results[name]
        notes.append(
            f"{name} arm: the same stand-in with {a.samples_per_class} images per class (~{silo_train_rows(a)} training "
            f"rows per silo), batch {a.batch_size}, model {a.model}, epsilons {[eps_label(e) for e in a.study.epsilons]}, "
            f"lr tuned over {a.lrs} on seed {a.tune_seeds}, reported seeds {a.study.seeds}, MR-MTL lambdas "
            f"{a.study.lambdas}, no Ditto"
        )
        notes += [f"{name}: {note}" for note in lr_edge_notes(res.lrs, a.lrs)]
        extra[arm.folder] = {"accuracy": res.scores, "lrs": res.lrs, "model": a.model, "study": study_record(a.study)}
        figures.append(arm_figure(arm))
    if PAPER_NOISE in arms:
        notes.append(f"more rows per silo also help Local without DP: the {PAPER_NOISE} arm's no-DP cell shows how much of "
                     f"its change is data, not noise, and the {NOISE_CONTROL} arm changes the noise alone")
    if quick:
        notes.append("quick mode: 3 rounds, one seed, one lambda, two learning rates, epsilon 8 and no DP, no arms; "
                     "not comparable to the paper")
    return ReproductionReport(
        title="MR-MTL and Ditto on heterogeneous CIFAR-10 silos (SYNTHETIC 32x32 stand-in)",
        source=PAPER["source"],
        rows=rows, scale_notes=notes, extra=extra, figures=figures,
    )


def settings(ctx: ReproductionContext) -> CifarPlan:
    """The study: quick or full."""
    return quick_plan() if ctx.quick else CifarPlan()


def run(ctx: ReproductionContext, plan: CifarPlan) -> tuple[Results, LearningRates, dict[str, ArmResults]]:
    """The tuned grid, then each diagnostic arm's."""
    results, lrs, _ = run_tuned_grid(ctx.runs_dir, plan.study, cifar_task(plan), plan.lrs, plan.tune_seeds)
    arm_results = {}
    for arm in plan.arms:
        a = arm.plan
        scores, arm_lrs, _ = run_tuned_grid(ctx.runs_dir / arm.folder, a.study, cifar_task(a), a.lrs, a.tune_seeds)
        arm_results[arm.name] = ArmResults(scores, arm_lrs)
    return results, lrs, arm_results


def results_report(
    ctx: ReproductionContext, plan: CifarPlan, ran: tuple[Results, LearningRates, dict[str, ArmResults]],
) -> ReproductionReport:
    """The figures (the grid's, each arm's) and the report."""
    results, lrs, arm_results = ran
    task = cifar_task(plan)
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    plot_study(results, plan.study, task, ctx.out_dir / "cifar_silos.png", "CIFAR-10 stand-in")
    for arm in plan.arms:
        scores = arm_results[arm.name].scores
        plot_study(scores, arm.plan.study, task, ctx.out_dir / arm_figure(arm), f"CIFAR-10 stand-in, {arm.name}")
    return report(results, lrs, plan, task, ctx.quick, arm_results)


REPRODUCTIONS.register(
    "mrmtl_cifar", "MR-MTL and Ditto vs lambda on heterogeneous CIFAR-10-like silos, synthetic 32x32 stand-in (Liu 2022)"
)(StudyReproduction(settings, run, results_report))
