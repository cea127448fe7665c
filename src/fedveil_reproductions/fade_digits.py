"""FADE digits UDA with imbalanced users: MNIST <-> scikit-learn digits, varying the chance
that a round's one user is the target user (Hong et al. 2021 §5.1, dissertation Fig. 3.2;
spec 004 §2.2; the paper gives curves, no numbers).

Setup: two users, one per domain (``mnist_digits``: MNIST and optdigits, both 8x8), the
source user labelled, the target user unlabelled (``algorithm.unlabelled_clients``); one
user per round, the target user with probability p (``federation.client_probabilities``);
10 local steps of batch 32, SGD with momentum 0.9, server momentum beta = 0.5. The
source model is pre-trained on the source user alone (lambda = 0), then adaptation runs
with the DANN lambda ramp and learning-rate decay from it with a fresh discriminator
(:mod:`fedveil_reproductions.fade_uda`). Methods: no adversary (the control), FADE-DANN
with the vanilla loss and with the squared loss (Eq. 3.6). Score: transductive accuracy of
the final global model on every target-domain row.

Claims checked (the text around Fig. 3.2): (i) severe imbalance (small p) lowers the
target accuracy of the vanilla loss; (ii) the squared loss does better than the vanilla
one under severe imbalance; and, as a sanity check the figure implies, (iii) the
adversary beats the no-adversary control when users are balanced.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

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

from .fade_uda import LABELS, accuracy, adapted, target_rows
from .paper_numbers import paper_numbers

PAPER = paper_numbers(__name__)
DOMAINS = {"mnist": 0, "digits": 1}  # domain ids of the mnist_digits data set

# direction -> method -> p -> target accuracy per seed ("source_only" -> list per seed)
Results = dict[str, dict[str, Any]]


@dataclass
class DigitsStudy:
    directions: list[str] = field(default_factory=lambda: ["mnist->digits", "digits->mnist"])
    target_probabilities: list[float] = field(default_factory=lambda: [0.05, 0.2, 0.5])
    methods: list[str] = field(default_factory=lambda: ["none", "dann", "squared"])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    pretrain_rounds: int = 300
    rounds: int = 1000
    steps: int = 10
    batch_size: int = 32
    lr: float = 0.01
    momentum: float = 0.9
    beta: float = 0.5
    eval_every: int = 250


def digits_study(quick: bool = False) -> DigitsStudy:
    """The full study or the quick smoke run (about a minute on 2 CPU cores)."""
    if quick:
        return DigitsStudy(
            directions=["mnist->digits"], target_probabilities=[0.05, 0.5], seeds=[0], pretrain_rounds=100, rounds=150,
            eval_every=75,
        )
    return DigitsStudy()


def ends(direction: str) -> tuple[int, int]:
    source, target = direction.split("->")
    return DOMAINS[source], DOMAINS[target]


def base_config(ctx: ReproductionContext, study: DigitsStudy, direction: str, seed: int) -> dict[str, Any]:
    """The pre-training run: the source user alone, no adversary."""
    source, target = ends(direction)
    probabilities = [0.0, 0.0]
    probabilities[source] = 1.0
    return {
        "seed": seed,
        "data": {
            "name": "mnist_digits", "root": str(ctx.data_dir("mnist-10k", "mnist")), "num_clients": 2,
            "partition": {"name": "domain", "key": "domain", "clients_per_domain": [1, 1]},
        },
        "model": {"name": "fade_cnn", "options": {"groups": 2}},
        "algorithm": {"name": "fade", "group_key": "domain", "beta": study.beta, "lam": 0.0, "unlabelled_clients": [target]},
        "client": {"steps": study.steps, "batch_size": study.batch_size, "lr": study.lr, "momentum": study.momentum},
        "federation": {"rounds": study.pretrain_rounds, "clients_per_round": 1, "client_probabilities": probabilities},
        "eval": {"every": study.pretrain_rounds, "group": "domain", "metrics": ["group_accuracy"]},
        "checkpoint": {"every": 0},
    }


def adapt_config(base: dict[str, Any], study: DigitsStudy, direction: str, method: str, p: float, pretrained: Path) -> dict[str, Any]:
    source, target = ends(direction)
    probabilities = [0.0, 0.0]
    probabilities[source], probabilities[target] = 1.0 - p, p
    config = {
        **base,
        "client": {**base["client"], "lr_schedule": "dann"},
        "federation": {**base["federation"], "rounds": study.rounds, "client_probabilities": probabilities},
        "eval": {**base["eval"], "every": study.eval_every},
    }
    return adapted(config, method, pretrained)


def run_name(direction: str, method: str, p: float, seed: int) -> str:
    return f"{direction.replace('->', '_to_')}_{method}_p{p:g}_seed{seed}"


def cells(ctx: ReproductionContext, study: DigitsStudy) -> list[tuple[str, str, float | None, PlannedRun]]:
    """Every run as (direction, method, p, run): per direction and seed the pre-training
    (method "source_only", p None) first, then every p x method adapting from it."""
    runs = []
    for direction in study.directions:
        for seed in study.seeds:
            base = base_config(ctx, study, direction, seed)
            pre = f"{direction.replace('->', '_to_')}_pretrain_seed{seed}"
            runs.append((direction, "source_only", None, PlannedRun(pre, base)))
            for p in study.target_probabilities:
                for method in study.methods:
                    config = adapt_config(base, study, direction, method, p, ctx.runs_dir / pre)
                    runs.append((direction, method, p, PlannedRun(run_name(direction, method, p, seed), config)))
    return runs


def plan(ctx: ReproductionContext) -> list[PlannedRun]:
    """Pre-training per direction and seed, then every method x p."""
    return [run for *_, run in cells(ctx, digits_study(ctx.quick))]


def scores(ctx: ReproductionContext, study: DigitsStudy) -> Results:
    """Every run's target accuracy, scored from its final model (``model.pt``)."""
    rows: dict[str, tuple] = {}
    results: Results = {}
    for direction, method, p, run in cells(ctx, study):
        if direction not in rows:
            rows[direction] = target_rows(run.config["data"], ends(direction)[1])
        acc = accuracy(ctx.runs_dir / run.name, run.config, 10, *rows[direction])
        by_method = results.setdefault(direction, {})
        if p is None:
            by_method.setdefault(method, []).append(acc)
        else:
            by_method.setdefault(method, {}).setdefault(p, []).append(acc)
    return results


# ----------------------------------------------------------------------------- report


def table_rows(results: Results, study: DigitsStudy) -> list[ResultRow]:
    rows = []
    for direction in study.directions:
        got = results[direction]
        rows.append(ResultRow(direction, "Source only: target accuracy", st.cell(got["source_only"]), PAPER["curve"]))
        for p in study.target_probabilities:
            for method in study.methods:
                rows.append(ResultRow(
                    f"{direction}, target-user probability {p:g}", f"{LABELS[method]}: target accuracy",
                    st.cell(got[method][p]), PAPER["curve"],
                ))
    return rows


def claim_rows(results: Results, study: DigitsStudy) -> list[ResultRow]:
    low, high = min(study.target_probabilities), max(study.target_probabilities)
    rows = []
    for direction in study.directions:
        got = results[direction]

        def m(method: str, p: float) -> str:
            return f"{st.mean(got[method][p]):.4f}"

        if "dann" in got and low != high:
            diff, se = st.difference(got["dann"][low], got["dann"][high])
            rows.append(ResultRow(
                direction, f"(i) vanilla: p = {low:g} below p = {high:g}", f"{m('dann', low)} vs {m('dann', high)}",
                PAPER["claims"]["imbalance_hurts"], st.lower_verdict(diff, se),
            ))
        if {"dann", "squared"} <= set(got):
            diff, se = st.difference(got["dann"][low], got["squared"][low])
            rows.append(ResultRow(
                direction, f"(ii) p = {low:g}: squared above vanilla", f"{m('squared', low)} vs {m('dann', low)}",
                PAPER["claims"]["squared_helps"], st.lower_verdict(diff, se),
            ))
        if {"dann", "none"} <= set(got):
            diff, se = st.difference(got["none"][high], got["dann"][high])
            rows.append(ResultRow(
                direction, f"(iii) p = {high:g}: vanilla adversary above no adversary", f"{m('dann', high)} vs {m('none', high)}",
                PAPER["claims"]["adaptation_helps"], st.lower_verdict(diff, se),
            ))
    return rows


def scale_notes(study: DigitsStudy, quick: bool) -> list[str]:
    notes = [
        "domains: MNIST (the 10,000-image subset in ../shared/data/mnist-10k, its 20x20 digit box average-pooled to 8x8) "
        "and scikit-learn's 1,797 optdigits (8x8) instead of MNIST and USPS (no download here); a real pair with a "
        "real shift (writers, binarised scans), at 8x8 rather than 28x28",
        f"rounds: {study.pretrain_rounds} pre-training + {study.rounds} adaptation (the paper: 8,600 global rounds); "
        f"seeds {study.seeds} (the paper: 3); target-user probabilities {study.target_probabilities}",
        "network: fade_cnn (conv3x3(16)-pool-conv3x3(32)-pool, 100-d bottleneck, D 100-50-20-2), no dropout, "
        "instead of the official modified LeNet with Dropout2d (dropout would draw from the global RNG)",
        "optimiser: SGD momentum 0.9 restarted every round (the official code keeps each user's Nesterov momentum "
        "across rounds), lr 0.01 with the DANN decay in the adaptation phase",
        "score: transductive accuracy of the final global model on every target-domain row (the official code's "
        "protocol for Office; the paper's digits curves use the USPS / MNIST test sets)",
        "'no adversary' (lambda = 0 in the adaptation phase) is a control added here: it separates the adversary's "
        "gain from the gain of training the source model longer",
    ]
    if quick:
        notes.append(f"quick mode: {study.rounds} adaptation rounds, one direction and seed; not comparable to the paper")
    return notes


def plot(results: Results, study: DigitsStudy, path: Path) -> None:
    """Target accuracy vs target-user probability, per method, one panel per direction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(study.directions), figsize=(5.5 * len(study.directions), 4), squeeze=False)
    for ax, direction in zip(axes[0], study.directions):
        got = results[direction]
        ps = study.target_probabilities
        for method in study.methods:
            ax.errorbar(ps, [st.mean(got[method][p]) for p in ps], yerr=[st.std(got[method][p]) for p in ps],
                        marker="o", capsize=3, label=LABELS[method])
        ax.axhline(st.mean(got["source_only"]), color="grey", linestyle=":", label="Source only")
        ax.set_xscale("log")
        ax.set_xticks(ps, [f"{p:g}" for p in ps])
        ax.set_xlabel("probability that a round's user is the target user")
        ax.set_ylabel("target accuracy")
        ax.set_title(f"{direction}: mean ± std over {len(study.seeds)} seeds")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(ctx: ReproductionContext, summaries: Summaries) -> ReproductionReport:
    """Target accuracies per direction, method and p (from each run's ``model.pt``: the
    summaries do not score the target domain), the claims' verdicts and the figure."""
    study = digits_study(ctx.quick)
    results = scores(ctx, study)
    figures = ["digits_target_accuracy.png"]
    plot(results, study, ctx.out_dir / figures[0])
    return ReproductionReport(
        title="FADE digits UDA: target accuracy vs the target user's share of rounds",
        source=PAPER["source"],
        rows=table_rows(results, study) + claim_rows(results, study),
        scale_notes=scale_notes(study, ctx.quick),
        extra={"study": asdict(study), "target_accuracy": {
            d: {m: v if m == "source_only" else {f"{p:g}": a for p, a in v.items()} for m, v in by.items()}
            for d, by in results.items()
        }},
        figures=figures,
    )


REPRODUCTIONS.register(
    "fade_digits", "FADE UDA MNIST <-> digits with imbalanced users: vanilla vs squared loss (Hong 2021 Fig. 3.2)"
)(Reproduction(plan, report))
