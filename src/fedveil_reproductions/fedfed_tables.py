"""FedFed's Tables 1-2 and 5 protocol (Yang et al. NeurIPS 2023 §4, App. F; spec 003 §2-3) at CPU
scale: each base algorithm (FedAvg, FedProx, SCAFFOLD, FedNova) with and without FedFed.

``fedfed_digits``: the 10,000-image MNIST subset (``../shared/data/mnist-10k``, 28x28 grey,
pixels in [0, 1]) over 10 clients, 5 a round (the paper's K = 10, 50%), under Dirichlet
alpha = 0.1 and 0.05 and two classes per client (#C = 2). Per partition and seed, phase 1
distils the features (``fedfed_distill``, T_d rounds) once; every base then trains with
(``fedfed_<base>``) and without it. A sweep over the release's noise sigma (FedAvg, alpha 0.1)
gives accuracy against sigma and against the rigorous epsilon.

``fedfed_cifar``: FedAvg with and without FedFed under Dirichlet alpha = 0.1 on a SYNTHETIC
32x32x3 stand-in for CIFAR-10 (``multidomain_synthetic``, one domain, 10 classes, pixels
rescaled to [0, 1]; no CIFAR-10 download here), next to Table 1's CIFAR-10 row.

Reported per run: the best pooled test accuracy over rounds (the paper's "best top-1"), the
rounds to reach the target (the floor, in whole percent, of plain FedAvg's best accuracy in
the same seed and partition) and the speed-up over plain FedAvg; the release's epsilon
(rigorous, from the run's ledger and the analytic Gaussian, and the paper's formula);
Eq. 17's communication overhead.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from fedveil.config import validate
from fedveil.privacy.feature_release import (
    communication_ratio,
    kov_composition,
    paper_epsilon,
    release_epsilon,
)
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

from .paper_numbers import paper_numbers

PAPER = paper_numbers(__name__)
BASES = ("fedavg", "fedprox", "scaffold", "fednova")
LABELS = {"fedavg": "FedAvg", "fedprox": "FedProx", "scaffold": "SCAFFOLD", "fednova": "FedNova"}
PARTITIONS: dict[str, dict[str, Any]] = {
    "alpha=0.1": {"name": "dirichlet", "alpha": 0.1},
    "alpha=0.05": {"name": "dirichlet", "alpha": 0.05},
    "#C=2": {"name": "shards", "classes_per_client": 2},
}
DELTA = 1e-5


@dataclass
class FedFedStudy:
    data: dict[str, Any]
    partitions: list[str] = field(default_factory=lambda: list(PARTITIONS))
    bases: list[str] = field(default_factory=lambda: list(BASES))
    bases_of: dict[str, list[str]] = field(default_factory=dict)  # partition -> its bases, if not all of ``bases``
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    num_clients: int = 10
    clients_per_round: int = 5
    rounds: int = 20  # T_r (the paper: 1,000)
    distill_rounds: int = 15  # T_d, as the paper
    sigma: float = 0.15  # the release's noise std (the paper's sigma_s^2 = 0.15 read as a std, as its code)
    rho: float = 0.5  # ||x_s|| <= rho ||x|| (the paper reports no value)
    sigmas: list[float] = field(default_factory=lambda: [0.05, 0.15, 0.5, 1.5])  # the sweep (FedAvg, first partition)
    model: dict[str, Any] = field(default_factory=lambda: {"name": "lenet", "options": {"width": 0.5}})
    distiller: dict[str, Any] = field(default_factory=lambda: {"latent": 32, "width": 8})
    client: dict[str, Any] = field(default_factory=lambda: {
        "epochs": 1, "batch_size": 64, "lr": 0.01, "momentum": 0.9, "weight_decay": 1e-4})
    distill_client: dict[str, Any] = field(default_factory=lambda: {
        "epochs": 1, "batch_size": 32, "lr": 0.05, "momentum": 0.9})
    mu: float = 0.1  # FedProx (the official code's)
    # SCAFFOLD's option II control variate assumes plain SGD: with momentum 0.9 its clients'
    # variates are ~10x too large and it diverged here (accuracy 0.10 by round 4, with and
    # without FedFed); it runs without momentum at the same effective step
    scaffold_client: dict[str, Any] = field(default_factory=lambda: {"momentum": 0.0, "lr": 0.1})
    table: str = "digits"  # "digits" (Tables 2, 5) or "cifar" (Table 1, the 32x32 stand-in)

    @property
    def paper(self) -> dict[str, Any]:
        """The paper's numbers this study is compared with: its source, accuracies and speed-ups."""
        return PAPER[self.table]


def digits_study(ctx: ReproductionContext) -> FedFedStudy:
    data = {"name": "mnist", "root": str(ctx.data_dir("mnist-10k", "mnist")), "num_clients": 10, "test_fraction": 0.2}
    if ctx.quick:
        return FedFedStudy(data={**data, "test_fraction": 0.9}, partitions=["alpha=0.1"], bases=["fedavg"],
                           seeds=[0], rounds=3, distill_rounds=2, sigmas=[0.15, 1.5],
                           distiller={"latent": 16, "width": 8})
    return FedFedStudy(data=data, bases_of={"#C=2": ["fedavg"]})


def cifar_study(ctx: ReproductionContext) -> FedFedStudy:
    """FedAvg with / without FedFed on the 32x32 stand-in (the splitmix_cifar images in [0, 1])."""
    data = {"name": "multidomain_synthetic", "num_clients": 10, "test_fraction": 0.2, "options": {
        "num_classes": 10, "num_domains": 1, "samples_per_class": 60 if ctx.quick else 400, "image_size": 32,
        "intra_class": 4.0, "noise": 2.0, "seed": 0, "pixels": "unit"}}
    study = FedFedStudy(data=data, partitions=["alpha=0.1"], bases=["fedavg"], sigmas=[0.15], table="cifar")
    if ctx.quick:
        study.seeds, study.rounds, study.distill_rounds, study.distiller = [0], 3, 2, {"latent": 16, "width": 8}
    return study


def bases_in(study: FedFedStudy, partition: str) -> list[str]:
    return study.bases_of.get(partition, study.bases)


def _common(study: FedFedStudy, partition: str, seed: int) -> dict[str, Any]:
    return {
        "seed": seed, "data": {**study.data, "partition": PARTITIONS[partition]},
        "federation": {"clients_per_round": study.clients_per_round},
        "eval": {"every": 1, "batch_size": 512}, "checkpoint": {"every": 10}, "executor": "vectorized",
    }


def distill_config(study: FedFedStudy, partition: str, seed: int) -> dict[str, Any]:
    config = _common(study, partition, seed)
    config["model"] = {"name": "fedfed_vae", "options": {**study.distiller, "rho": study.rho, "sigma": study.sigma}}
    config["algorithm"] = {"name": "fedfed_distill"}
    config["client"] = study.distill_client
    config["federation"]["rounds"] = study.distill_rounds
    return config


def train_config(study: FedFedStudy, partition: str, seed: int, base: str, distiller: Path | None,
                 sigma: float | None = None) -> dict[str, Any]:
    """Plain ``base`` when ``distiller`` is None, else ``fedfed_<base>`` on its release."""
    config = _common(study, partition, seed)
    algorithm: dict[str, Any] = {"name": base if distiller is None else f"fedfed_{base}"}
    if base == "fedprox":
        algorithm["mu"] = study.mu
    if distiller is not None:
        algorithm.update(distiller=str(distiller), sigma=study.sigma if sigma is None else sigma)
    client = {**study.client, **study.scaffold_client} if base == "scaffold" else study.client
    config.update(model=study.model, algorithm=algorithm, client=client)
    config["federation"]["rounds"] = study.rounds
    return config


def curve_of(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r["global_test_accuracy"] for r in rows if "global_test_accuracy" in r]


# (partition, base, "with" | "without") -> per seed: accuracy curve; ("sweep", sigma) -> curves
Results = dict[tuple[str, str, str], list[list[float]]]


def cells(ctx: ReproductionContext, study: FedFedStudy) -> list[tuple[tuple[str, str, str] | None, PlannedRun]]:
    """Every run with its key in :data:`Results` (None: phase 1): per seed and partition the
    distillation first, then every base without and with FedFed, then (first partition) the sweep over sigma."""
    runs: list[tuple[tuple[str, str, str] | None, PlannedRun]] = []
    for seed in study.seeds:
        for partition in study.partitions:
            tag = partition.replace("=", "").replace("#", "")
            distilled = f"distill_{tag}_seed{seed}"
            runs.append((None, PlannedRun(distilled, distill_config(study, partition, seed))))
            for base in bases_in(study, partition):
                for mode, distiller in (("without", None), ("with", ctx.runs_dir / distilled)):
                    runs.append(((partition, base, mode), PlannedRun(
                        f"{tag}_{base}_{mode}_seed{seed}", train_config(study, partition, seed, base, distiller))))
            if partition == study.partitions[0]:
                for sigma in study.sigmas:
                    if sigma == study.sigma:  # the main run of FedAvg with FedFed
                        continue
                    runs.append(((partition, "sweep", f"{sigma:g}"), PlannedRun(
                        f"{tag}_sweep_sigma{sigma:g}_seed{seed}",
                        train_config(study, partition, seed, "fedavg", ctx.runs_dir / distilled, sigma))))
    return runs


def plan(ctx: ReproductionContext, study: FedFedStudy) -> list[PlannedRun]:
    """Phase 1 first in each partition and seed, then the runs that share its release."""
    return [run for _, run in cells(ctx, study)]


def scores(ctx: ReproductionContext, study: FedFedStudy, summaries: Summaries) -> tuple[Results, dict[float, list[float]]]:
    """The accuracy curves (from the runs' per-round metrics) and the ledger's epsilon per swept sigma."""
    results: Results = {}
    epsilons: dict[float, list[float]] = {}
    for key, run in cells(ctx, study):
        if key is None:
            continue
        results.setdefault(key, []).append(curve_of(ctx.runs_dir / run.name))
        main = key == (study.partitions[0], "fedavg", "with")  # the sweep's point at the study's sigma
        if key[1] == "sweep" or (main and study.sigma in study.sigmas):
            sigma = float(key[2]) if key[1] == "sweep" else study.sigma
            epsilons.setdefault(sigma, []).append(summaries[run.name]["epsilon"])
            if main:
                results.setdefault((key[0], "sweep", f"{sigma:g}"), []).append(curve_of(ctx.runs_dir / run.name))
    return results, epsilons


def rounds_to(curve: list[float], target: float) -> int | None:
    return next((i + 1 for i, acc in enumerate(curve) if acc >= target), None)


def targets_of(results: Results, partition: str) -> list[float]:
    """Per seed: plain FedAvg's best accuracy rounded down to a whole percent (the paper's target)."""
    return [math.floor(100 * max(c)) / 100 for c in results[(partition, "fedavg", "without")]]


def _rounds_cell(rounds: list[int | None]) -> str:
    reached = [r for r in rounds if r is not None]
    if not reached:
        return "None"
    text = f"{st.mean(reached):.1f}"
    return text if len(reached) == len(rounds) else f"{text} ({len(rounds) - len(reached)} of {len(rounds)} never)"


def speedup(baseline: list[int | None], method: list[int | None]) -> float | None:
    """Mean over seeds of FedAvg-without rounds / method rounds (seeds where both reached)."""
    pairs = [(b, m) for b, m in zip(baseline, method) if b is not None and m is not None]
    return st.mean([b / m for b, m in pairs]) if pairs else None


def _speedup_cell(value: float | None) -> str:
    return "None" if value is None else f"x{value:.1f}"


def table_rows(study: FedFedStudy, results: Results) -> list[ResultRow]:
    rows = []
    for partition in study.partitions:
        targets = targets_of(results, partition)
        base_rounds = [rounds_to(c, t) for c, t in zip(results[(partition, "fedavg", "without")], targets)]
        for base in bases_in(study, partition):
            best = {m: [100 * max(c) for c in results[(partition, base, m)]] for m in ("with", "without")}
            rounds = {m: [rounds_to(c, t) for c, t in zip(results[(partition, base, m)], targets)] for m in best}
            paper = study.paper["accuracy"].get(partition, {}).get(base)
            diff, se = st.difference(best["without"], best["with"])
            rows.append(ResultRow(
                partition, f"{LABELS[base]}: best accuracy % with (without) FedFed",
                f"{st.cell(best['with'], 2)} ({st.cell(best['without'], 2)})",
                "n/a" if paper is None else f"{paper[0]} ({paper[1]})",
                f"gain {diff:+.2f}: " + st.lower_verdict(diff, se).replace("holds", "FedFed higher", 1),
            ))
            ups = {m: speedup(base_rounds, rounds[m]) for m in rounds}
            paper_up = study.paper["speedup"].get(partition, {}).get(base)
            rows.append(ResultRow(
                partition, f"{LABELS[base]}: rounds to {st.mean(targets) * 100:.0f}% with (without); speed-up",
                f"{_rounds_cell(rounds['with'])} ({_rounds_cell(rounds['without'])}); "
                f"{_speedup_cell(ups['with'])} ({_speedup_cell(ups['without'])})",
                "n/a" if paper_up is None else f"x{paper_up}",
            ))
    return rows


def privacy_rows(study: FedFedStudy, epsilons: dict[float, list[float]], results: Results, d: int) -> list[ResultRow]:
    """Accuracy against sigma and epsilon (rigorous and the paper's formula)."""
    partition = study.partitions[0]
    m = math.sqrt(d)
    rows = []
    for sigma in study.sigmas:
        acc = [100 * max(c) for c in results[(partition, "sweep", f"{sigma:g}")]]
        rigorous = release_epsilon(sigma, study.rho, m, DELTA)
        paper = paper_epsilon(study.rho, sigma, study.rounds, DELTA)
        rows.append(ResultRow(
            f"{partition}, FedAvg+FedFed, sigma={sigma:g}",
            "best accuracy %; epsilon per client: rigorous (ledger, RDP) / paper's formula; all 10 clients (KOV)",
            f"{st.cell(acc, 2)}; {rigorous:.4g} ({st.mean(epsilons[sigma]):.4g}) / {paper:.3g}; "
            f"{kov_composition(paper, study.num_clients, DELTA):.3g}",
            PAPER["sweep"],
        ))
    return rows


def communication_row(study: FedFedStudy, rows_per_client: float, model_floats: int, d: int) -> ResultRow:
    gamma = rows_per_client * d * study.num_clients / model_floats  # a K / m: shared data over the model
    ratio = communication_ratio(study.distill_rounds, study.rounds, study.clients_per_round / study.num_clients,
                                study.num_clients, gamma)
    c = PAPER["communication"]
    paper = communication_ratio(c["distill_rounds"], c["rounds"], c["sample_rate"], c["clients"], c["gamma"])
    return ResultRow("Eq. 17", f"extra communication over {study.rounds} rounds (gamma = {gamma:.3g})",
                     f"{100 * ratio:.1f}%", f"{100 * paper:.2f}% (T_r {c['rounds']:,}, gamma {c['gamma']:g})",
                     "larger: far fewer training rounds to spread the one-off costs over")


def scale_notes(study: FedFedStudy, quick: bool) -> list[str]:
    if study.table == "digits":
        data = ("data: the 10,000-image MNIST subset (80% train over 10 clients, 20% pooled test), not FMNIST / CIFAR-10; "
                "the paper's numbers are FMNIST's (Table 2) for the Dirichlet rows and CIFAR-10's (Table 5) for #C=2")
    else:
        o = study.data["options"]
        data = (f"data: SYNTHETIC stand-in for CIFAR-10 (multidomain_synthetic, one domain, 10 classes, "
                f"{o['samples_per_class']} images per class at 32x32x3, each rescaled to [0, 1]) instead of CIFAR-10's "
                "50,000 images (no download here); the paper's numbers are CIFAR-10's (Table 1)")
    notes = [
        data,
        f"{study.rounds} training rounds (the paper: 1,000) and {study.distill_rounds} distillation rounds "
        f"({'as' if study.distill_rounds == 15 else '15 in'} the paper), "
        f"LeNet (width {study.model.get('options', {}).get('width', 1)}) instead of ResNet-18, seeds {study.seeds}; "
        "'best' is the best pooled accuracy over the rounds"
        + "".join(f"; {p}: {', '.join(LABELS[b] for b in bs)} only" for p, bs in study.bases_of.items()),
        f"the distiller: a small conv beta-VAE (latent {study.distiller['latent']}, width {study.distiller['width']}) and "
        f"CNN classifier trained by SGD (the code: a 2048-d VAE and ResNet-18 by AdamW, with mixup and mosaic steps)",
        f"SCAFFOLD trains with {study.scaffold_client} (its option II control variate assumes plain SGD; with "
        "momentum 0.9 it diverged in this study, with and without FedFed)",
        f"one noisy copy per record at sigma {study.sigma} with the paper's clip rho = {study.rho} (the code shares two "
        "copies, without a clip); each round a client adds as many class-balanced shared rows as it has own rows",
        "the rigorous epsilon is per record under zero-out neighbours for the features given the generator; the generator "
        "itself trains on raw data and the labels are shared in the clear (as in the paper), which no epsilon here covers",
    ]
    if quick:
        notes.append("quick mode: a fraction of the rows, 3 rounds, one seed; not comparable")
    return notes


def plot(study: FedFedStudy, results: Results, epsilons: dict[float, list[float]], d: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    partition = study.partitions[0]
    fig, (curves, tradeoff) = plt.subplots(1, 2, figsize=(11, 4))
    for base in bases_in(study, partition):
        for mode, style in (("with", "-"), ("without", "--")):
            mean = [st.mean(v) for v in zip(*results[(partition, base, mode)])]
            curves.plot(range(1, len(mean) + 1), mean, style, label=f"{LABELS[base]} {mode} FedFed")
    name = "MNIST-10k" if study.table == "digits" else "32x32 stand-in"
    curves.set(xlabel="round", ylabel="pooled test accuracy", title=f"{name}, {partition}")
    curves.legend(fontsize=7)
    acc = [st.mean([max(c) for c in results[(partition, "sweep", f"{s:g}")]]) for s in study.sigmas]
    eps = [release_epsilon(s, study.rho, math.sqrt(d), DELTA) for s in study.sigmas]
    tradeoff.semilogx(eps, acc, "o-", label="FedAvg + FedFed")
    for s, e, a in zip(study.sigmas, eps, acc):
        tradeoff.annotate(f"sigma {s:g}", (e, a), fontsize=7)
    plain = st.mean([max(c) for c in results[(partition, "fedavg", "without")]])
    tradeoff.axhline(plain, ls="--", color="grey", label="FedAvg (no sharing)")
    tradeoff.set(xlabel="rigorous epsilon per client (delta 1e-5)", ylabel="best accuracy", title="accuracy vs privacy")
    tradeoff.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(ctx: ReproductionContext, study: FedFedStudy, summaries: Summaries) -> ReproductionReport:
    """Accuracy and speed-up with and without FedFed, accuracy against sigma and epsilon,
    Eq. 17's overhead and the figure."""
    from fedveil.runtime.simulation import Simulation

    results, epsilons = scores(ctx, study, summaries)
    sim = Simulation.from_config(validate(train_config(study, study.partitions[0], study.seeds[0], "fedavg", None)))
    d = math.prod(sim.data.input_shape)
    model_floats = sum(v.numel() for v in sim.init.values())
    rows_per_client = st.mean(sim.data.train_sizes().tolist())
    rows = table_rows(study, results) + privacy_rows(study, epsilons, results, d)
    rows.append(communication_row(study, rows_per_client, model_floats, d))
    figures = ["accuracy_and_privacy.png"]
    plot(study, results, epsilons, d, ctx.out_dir / figures[0])
    return ReproductionReport(
        title="FedFed: each base algorithm with and without shared noisy features (Tables 1-2, 5 protocol)",
        source=study.paper["source"],
        rows=rows,
        scale_notes=scale_notes(study, ctx.quick),
        extra={"study": asdict(study),
               "curves": {" ".join(k): v for k, v in results.items()},
               "sweep_ledger_epsilon": {f"{s:g}": v for s, v in epsilons.items()}},
        figures=figures,
    )


def reproduction(study: Callable[[ReproductionContext], FedFedStudy]) -> Reproduction:
    """The study ``study(ctx)`` sets up, as a plan of runs and a report."""
    return Reproduction(lambda ctx: plan(ctx, study(ctx)), lambda ctx, summaries: report(ctx, study(ctx), summaries))


REPRODUCTIONS.register(
    "fedfed_digits", "FedFed on FedAvg / FedProx / SCAFFOLD / FedNova, MNIST-10k non-IID (Tables 2, 5)"
)(reproduction(digits_study))
REPRODUCTIONS.register(
    "fedfed_cifar", "FedFed on FedAvg, Dirichlet 0.1, SYNTHETIC 32x32 CIFAR-10 stand-in (Table 1)"
)(reproduction(cifar_study))
