"""FADE's Office protocol (Hong et al. 2021 §5.2, Table 1 / dissertation Table 3.1) on the
synthetic multi-domain stand-in: 1 labelled source user + 3 unlabelled target users.

Setup (spec 004 §2.2): ``multidomain_synthetic`` with 31 classes and 3 domains (Office's
class count; 20 images per class and domain, 16x16x3) stands in for Office-31. A task
``s->t`` gives the source user every row of domain s and the three target users the rows
of domain t (``class_window`` with ``source_domain`` / ``target_domain``): non-iid targets
hold 20 consecutive classes with stride 10 (Office's "user 1 has class 0 to 20 and user 2
has class 10 to 30", wrapping mod 31), iid targets hold every class. The source model is
pre-trained on the source user (50 rounds x 20 steps), then each method adapts for 200
rounds, 2 users per round, 5 local steps of batch 32, SGD momentum 0.9 with the DANN decay,
server momentum beta = 0.5 (:mod:`fedveil_reproductions.fade_uda` lists the methods).

Central baselines run the same objectives on pooled data with the same core: one source
user and one target user holding every target row, both in every round, one local step,
beta = 1 and uniform weights, which is centralised minibatch SGD on a batch of 32 source +
32 target rows (the mean of the two users' losses; central SHOT trains the target user
alone), for as many sample gradients as the federated runs. Local momentum restarts every
round, so with one step it would do nothing: central runs use plain SGD at heavy-ball's
effective step, lr / (1 - momentum).

Claims checked (Table 3.1): (i) CDAN-type >= DANN with non-iid and with iid targets;
(ii) iid targets >= non-iid targets for every federated method; (iii) FADE-CDAN beats
Source only; (iv) FADE-CDAN comes close to central CDAN (gap reported).
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
CLASSES = 31
SPLITS = ("non-iid", "iid")

# (setting, method) -> task -> target accuracy per seed; setting in SPLITS + ("central", "federated")
Results = dict[tuple[str, str], dict[str, list[float]]]


@dataclass
class OfficeStudy:
    tasks: list[str] = field(default_factory=lambda: ["0->1", "1->2"])
    methods: list[str] = field(default_factory=lambda: ["dann", "cdan", "shot", "cdan_shot"])
    central: list[str] = field(default_factory=lambda: ["dann", "cdan", "shot"])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    samples_per_class: int = 20
    image_size: int = 16
    domain_shift: float = 0.5
    window: int = 20
    stride: int = 10
    pretrain_rounds: int = 50
    pretrain_steps: int = 20
    rounds: int = 200
    steps: int = 5
    batch_size: int = 32
    lr: float = 0.01
    momentum: float = 0.9
    beta: float = 0.5


def office_study(quick: bool = False) -> OfficeStudy:
    """The full study or the quick smoke run (about a minute and a half on 2 CPU cores)."""
    if quick:
        return OfficeStudy(tasks=["0->1"], methods=["dann", "cdan", "shot"], central=["cdan"], seeds=[0],
                           pretrain_rounds=25, rounds=60)
    return OfficeStudy()


def ends(task: str) -> tuple[int, int]:
    source, target = task.split("->")
    return int(source), int(target)


def data_config(study: OfficeStudy, task: str, split: str) -> dict[str, Any]:
    source, target = ends(task)
    central = split == "central"
    return {
        "name": "multidomain_synthetic", "num_clients": 2 if central else 4,
        "options": {  # the generator's seed stays 0: one fixed data set, like a real one
            "num_classes": CLASSES, "num_domains": 3, "samples_per_class": study.samples_per_class,
            "image_size": study.image_size, "domain_shift": study.domain_shift, "seed": 0,
        },
        "partition": {
            "name": "class_window", "window": study.window if split == "non-iid" else CLASSES, "stride": study.stride,
            "source_clients": 1, "source_domain": source, "target_domain": target,
        },
    }


def pretrain_config(study: OfficeStudy, task: str, seed: int) -> dict[str, Any]:
    """The source user alone, no adversary."""
    return {
        "seed": seed,
        "data": data_config(study, task, "non-iid"),
        "model": {"name": "fade_cnn", "options": {"groups": 3}},
        "algorithm": {"name": "fade", "group_key": "domain", "beta": study.beta, "lam": 0.0, "unlabelled_clients": [1, 2, 3]},
        "client": {"steps": study.pretrain_steps, "batch_size": study.batch_size, "lr": study.lr, "momentum": study.momentum},
        "federation": {"rounds": study.pretrain_rounds, "clients_per_round": 1, "client_probabilities": [1, 0, 0, 0]},
        "eval": {"every": study.pretrain_rounds},
        "checkpoint": {"every": 0},
    }


def adapt_config(study: OfficeStudy, task: str, split: str, method: str, seed: int, pretrained: Path) -> dict[str, Any]:
    base = pretrain_config(study, task, seed)
    client = {**base["client"], "steps": study.steps, "lr_schedule": "dann"}
    if split == "central":
        rounds = study.rounds * study.steps  # one local step per round: as many sample gradients as federated
        target_only = method == "shot"  # SHOT adapts without the source data
        federation = {"rounds": rounds, "clients_per_round": 1 if target_only else 2,
                      "client_probabilities": [0, 1] if target_only else [1, 1]}
        algorithm = {**base["algorithm"], "beta": 1.0, "weighting": "uniform", "unlabelled_clients": [1]}
        # one step per round restarts momentum every step: plain SGD at heavy-ball's effective step instead
        client.update(steps=1, momentum=0.0, lr=study.lr / (1.0 - study.momentum))
    else:
        rounds = study.rounds
        federation = {"rounds": rounds, "clients_per_round": 2}
        algorithm = base["algorithm"]
    config = {
        **base, "data": data_config(study, task, split), "algorithm": algorithm, "client": client,
        "federation": federation, "eval": {"every": rounds},
    }
    return adapted(config, method, pretrained)


def cells(ctx: ReproductionContext, study: OfficeStudy) -> list[tuple[str, str, str, PlannedRun]]:
    """Every run as (task, setting, method, run): per task and seed the pre-training (the
    federated Source only) first, then every split x method and the central baselines adapting from it."""
    adapt = [(split, m) for split in SPLITS for m in study.methods] + [("central", m) for m in study.central]
    runs = []
    for task in study.tasks:
        tag = task.replace("->", "_to_")
        for seed in study.seeds:
            pre = f"{tag}_pretrain_seed{seed}"
            runs.append((task, "federated", "source_only", PlannedRun(pre, pretrain_config(study, task, seed))))
            for split, method in adapt:
                config = adapt_config(study, task, split, method, seed, ctx.runs_dir / pre)
                runs.append((task, split, method, PlannedRun(f"{tag}_{split}_{method}_seed{seed}", config)))
    return runs


def plan(ctx: ReproductionContext) -> list[PlannedRun]:
    """Pre-training per task and seed, then every adaptation run starting from it."""
    return [run for *_, run in cells(ctx, office_study(ctx.quick))]


def scores(ctx: ReproductionContext, study: OfficeStudy) -> Results:
    """Every run's target accuracy, scored from its final model (``model.pt``)."""
    rows: dict[str, tuple] = {}
    results: Results = {}
    for task, split, method, run in cells(ctx, study):
        if task not in rows:
            rows[task] = target_rows(run.config["data"], ends(task)[1])
        acc = accuracy(ctx.runs_dir / run.name, run.config, CLASSES, *rows[task])
        results.setdefault((split, method), {}).setdefault(task, []).append(acc)
    results[("central", "source_only")] = results[("federated", "source_only")]  # one source model serves both
    return results


# ----------------------------------------------------------------------------- report


def averaged(results: Results, key: tuple[str, str]) -> list[float]:
    """Per seed, the accuracy averaged over the tasks (the table's "Avg." column)."""
    by_task = list(results[key].values())
    return [sum(seeds) / len(seeds) for seeds in zip(*by_task)]


def label(setting: str, method: str) -> str:
    return f"{LABELS[method]} ({setting})"


def table_rows(results: Results, study: OfficeStudy) -> list[ResultRow]:
    rows = []
    for key in results:
        if key == ("central", "source_only"):
            continue
        for task in study.tasks:
            rows.append(ResultRow(f"task {task}", label(*key), st.cell(results[key][task]), "—"))
        paper = PAPER["average"].get(key[0], {}).get(key[1])
        rows.append(ResultRow(
            "average over tasks", label(*key), st.cell(averaged(results, key)),
            f"{paper} (%, Office/Office-Home avg)" if paper is not None else "not in the table",
        ))
    return rows


def claim_rows(results: Results, study: OfficeStudy) -> list[ResultRow]:
    rows = []
    table = PAPER["average"]  # setting -> method -> Table 3.1's "Avg." (%)

    def avg(key: tuple[str, str]) -> str:
        return f"{st.mean(averaged(results, key)):.4f}"

    for split in SPLITS:
        for cdan in ("cdan", "cdan_shot"):
            if (split, cdan) in results and (split, "dann") in results:
                diff, se = st.difference(averaged(results, (split, "dann")), averaged(results, (split, cdan)))
                rows.append(ResultRow(
                    f"{split} targets, average", f"(i) {LABELS[cdan]} >= FADE-DANN",
                    f"{avg((split, cdan))} vs {avg((split, 'dann'))}",
                    ", ".join(f"{table[s]['cdan']} vs {table[s]['dann']} ({s})" for s in SPLITS),
                    st.at_least_verdict(diff, se),
                ))
    for method in study.methods:
        if ("iid", method) in results and ("non-iid", method) in results:
            diff, se = st.difference(averaged(results, ("non-iid", method)), averaged(results, ("iid", method)))
            paper = {m: f"{table['iid'][m]} vs {table['non-iid'][m]}" for m in ("dann", "cdan", "shot")}
            rows.append(ResultRow(
                "average", f"(ii) {LABELS[method]}: iid >= non-iid targets",
                f"{avg(('iid', method))} vs {avg(('non-iid', method))}", paper.get(method, "—"),
                st.at_least_verdict(diff, se),
            ))
    if ("non-iid", "cdan") in results:
        diff, se = st.difference(averaged(results, ("federated", "source_only")), averaged(results, ("non-iid", "cdan")))
        rows.append(ResultRow(
            "non-iid targets, average", "(iii) FADE-CDAN above Source only",
            f"{avg(('non-iid', 'cdan'))} vs {avg(('federated', 'source_only'))}",
            f"{table['non-iid']['cdan']} vs {table['federated']['source_only']}", st.lower_verdict(diff, se),
        ))
    if ("central", "cdan") in results and ("non-iid", "cdan") in results:
        diff, se = st.difference(averaged(results, ("central", "cdan")), averaged(results, ("non-iid", "cdan")))
        federated, central = table["non-iid"]["cdan"], table["central"]["cdan"]
        rows.append(ResultRow(
            "non-iid targets, average", "(iv) FADE-CDAN close to central CDAN: gap",
            f"{diff * 100:+.2f} ± {se * 100:.2f} points", f"{federated} vs {central} ({federated - central:+.1f} points)",
            "reported",
        ))
    return rows


def scale_notes(study: OfficeStudy, quick: bool) -> list[str]:
    notes = [
        "data: the synthetic multidomain_synthetic stand-in (procedural class prototypes, per-domain affine + colour "
        f"shift of strength {study.domain_shift}), 31 classes x {study.samples_per_class} images per domain at "
        f"{study.image_size}x{study.image_size}x3, instead of Office-31 / Office-Home (no download here); tasks "
        f"{study.tasks} between its domains, not A/D/W",
        "network: fade_cnn trained from scratch (conv3x3(16)-pool-conv3x3(32)-pool, 100-d bottleneck, head 100-31, "
        "D 100-50-20-3; CDAN's D input 100 x 31) instead of an ImageNet-pretrained ResNet-50 (no weights here); "
        "no weight-normalised head, no dropout, no label smoothing",
        f"rounds: {study.pretrain_rounds} x {study.pretrain_steps} steps pre-training, {study.rounds} adaptation "
        f"rounds x {study.steps} steps (the official code: 300-601 rounds); seeds {study.seeds} (the paper: 3)",
        "SHOT's target terms: information maximisation (weight 1) + 0.3 x pseudo-label CE, head frozen (SHOT's "
        "own weights; the official FADE code has IM weight 0)",
        "target users hold 80% of the target rows (the rest is held out); the score is the final global model's "
        "accuracy on every target row (transductive, as the official code)",
        "central baselines: the same objectives on pooled data with one local step per round (minibatch SGD, "
        f"no momentum, lr {study.lr / (1 - study.momentum):g} = lr / (1 - momentum)), not the published central "
        "implementations",
    ]
    if quick:
        notes.append(f"quick mode: one task and seed, {study.rounds} adaptation rounds; not comparable to the paper")
    return notes


def plot(results: Results, study: OfficeStudy, path: Path) -> None:
    """Average target accuracy per method: non-iid, iid and central bars side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = ["source_only"] + list(dict.fromkeys(study.methods + study.central))
    settings = [("federated", "non-iid"), ("federated", "iid"), ("central", "central")]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / len(settings)
    for i, (kind, split) in enumerate(settings):
        xs, ys, es = [], [], []
        for j, method in enumerate(methods):
            key = (kind if method == "source_only" else split, method)
            if key in results:
                values = averaged(results, key)
                xs.append(j + (i - 1) * width)
                ys.append(st.mean(values))
                es.append(st.std(values))
        ax.bar(xs, ys, width, yerr=es, capsize=3, label=split)
    ax.set_xticks(range(len(methods)), [LABELS[m] for m in methods], rotation=15, fontsize=8)
    ax.set_ylabel("target accuracy (avg over tasks)")
    ax.set_title(f"Office protocol on synthetic domains: mean ± std over {len(study.seeds)} seeds")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(ctx: ReproductionContext, summaries: Summaries) -> ReproductionReport:
    """Target accuracies per setting, method and task (from each run's ``model.pt``: the
    summaries do not score the target domain), the claims' verdicts and the figure."""
    study = office_study(ctx.quick)
    results = scores(ctx, study)
    figures = ["office_target_accuracy.png"]
    plot(results, study, ctx.out_dir / figures[0])
    return ReproductionReport(
        title="FADE UDA, Office protocol (1 source + 3 targets) on synthetic domains",
        source=PAPER["source"],
        rows=table_rows(results, study) + claim_rows(results, study),
        scale_notes=scale_notes(study, ctx.quick),
        extra={"study": asdict(study), "target_accuracy": {f"{s}/{m}": v for (s, m), v in results.items()}},
        figures=figures,
    )


REPRODUCTIONS.register(
    "fade_office",
    "FADE UDA, Office protocol on synthetic domains: DANN / CDAN / SHOT, iid vs non-iid targets (Hong 2021 Table 3.1)",
)(Reproduction(plan, report))
