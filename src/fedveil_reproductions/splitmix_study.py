"""The code the Split-Mix reproductions share: the widths served, the digit domains, one
method's run config, the runs of a per-width study and their scores, the methods' costs,
and the accuracy-per-width rows and figure."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedveil.models import build_model
from fedveil.models.complexity import count_macs, count_params
from fedveil.reproduce import PlannedRun, ReproductionContext, ResultRow
from fedveil.reproduce import verdicts as st
from fedveil.runtime.saved_model import evaluate_saved

WIDTHS = (0.125, 0.25, 0.5, 1.0)
LABELS = {"split_mix": "Split-Mix", "heterofl": "HeteroFL", "sheterofl": "SHeteroFL", "fedavg": "FedAvg (individual)"}
# method -> width -> accuracy per seed
Results = dict[str, dict[float, list[float]]]


def per_width(table: dict[str, Sequence[float]]) -> dict[str, dict[float, float]]:
    """A paper table of one row per method (values at x0.125 .. x1) as method -> width -> value."""
    return {method: dict(zip(WIDTHS, row)) for method, row in table.items()}


@dataclass
class SplitMixStudy:
    methods: list[str] = field(default_factory=lambda: ["split_mix", "heterofl", "sheterofl", "fedavg"])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    clients_per_domain: int = 4
    rows_per_domain: int = 400
    test_rows_per_domain: int = 200
    size: int = 16
    rounds: int = 100
    batch_size: int = 32
    lr: dict[str, float] = field(default_factory=lambda: {"split_mix": 0.01, "heterofl": 0.1, "sheterofl": 0.1, "fedavg": 0.1})
    model: str = "digit_cnn"
    full_width: float = 1.0  # the real width that plays "x1" (a scaled-down family when < 1)
    epochs: int = 1
    loss: str = "auto"

    def data_section(self, ctx: ReproductionContext) -> dict[str, Any]:
        return digit_domains(ctx, self.clients_per_domain, self.rows_per_domain, self.test_rows_per_domain, self.size)

    @property
    def num_clients(self) -> int:
        return 5 * self.clients_per_domain


def digit_domains(ctx: ReproductionContext, clients_per_domain: int, rows: int, test_rows: int, size: int) -> dict[str, Any]:
    """The ``[data]`` section of the Split-Mix digits studies: the five domains of
    ``digit_domains_synthetic`` (fixed data seed), a separate test set, clients numbered domain by domain."""
    return {
        "name": "digit_domains_synthetic", "root": str(ctx.data_dir("mnist-10k", "mnist")),
        "num_clients": 5 * clients_per_domain, "test_fraction": 0.0,
        "options": {"rows_per_domain": rows, "test_rows_per_domain": test_rows, "size": size, "seed": 0},
        "partition": {"name": "domain"},
    }


def run_config(ctx: ReproductionContext, study: SplitMixStudy, method: str, seed: int, width: float | None) -> dict[str, Any]:
    """One training run: ``width`` is the individual FedAvg model's width (None otherwise)."""
    model = {"name": study.model, "options": {"width": study.full_width * (1.0 if width is None else width)}}
    algorithm: dict[str, Any] = {"name": method}
    if method == "split_mix":
        model["options"]["bases"] = round(1 / WIDTHS[0])
        if study.full_width != 1.0:  # Split-Mix reads budgets as real widths, (S)HeteroFL as fractions of x1
            algorithm["budgets"] = served_widths(study, method)
    return {
        "seed": seed,
        "data": study.data_section(ctx),
        "model": model,
        "algorithm": algorithm,
        "client": {"epochs": study.epochs, "batch_size": study.batch_size, "lr": study.lr[method], "momentum": 0.9,
                   "weight_decay": 5e-4, "lr_schedule": "cosine", "loss": study.loss},
        "federation": {"rounds": study.rounds, "clients_per_round": study.num_clients},
        "eval": {"every": study.rounds, "batch_size": 128},
        "checkpoint": {"every": 10},
    }


def served_widths(study: SplitMixStudy, method: str) -> list[float]:
    """The widths x0.125 .. x1 as ``method`` reads them: Split-Mix's budgets and test-time
    widths are real widths (``full_width`` times the fraction), HeteroFL's and SHeteroFL's
    fractions of the model's width."""
    return [study.full_width * w for w in WIDTHS] if method == "split_mix" else list(WIDTHS)


def study_runs(study: SplitMixStudy) -> list[tuple[str, int, float | None, str]]:
    """(method, seed, individual FedAvg width or None, run name) of every training run."""
    return [(method, seed, width, f"{method}{'' if width is None else f'_x{width:g}'}_seed{seed}")
            for seed in study.seeds for method in study.methods for width in (WIDTHS if method == "fedavg" else [None])]


def study_plan(ctx: ReproductionContext, study: SplitMixStudy, folder: str = "") -> list[PlannedRun]:
    """Every training run of ``study``, named ``folder`` + its run name."""
    return [PlannedRun(folder + name, run_config(ctx, study, method, seed, width))
            for method, seed, width, name in study_runs(study)]


def score(ctx: ReproductionContext, study: SplitMixStudy, folder: str = "") -> Results:
    """Each trained model of :func:`study_plan` scored at every width (individual FedAvg at its own)."""
    results: Results = {}
    for method, _, width, name in study_runs(study):
        out = ctx.runs_dir / (folder + name)
        by_width = results.setdefault(method, {})
        if width is None:
            for w, row in zip(WIDTHS, evaluate_saved(out, served_widths(study, method))):
                by_width.setdefault(w, []).append(row["accuracy"])
        else:
            by_width.setdefault(width, []).append(evaluate_saved(out)[0]["accuracy"])
    return results


def costs(shape: tuple[int, ...], model: str = "digit_cnn", full_width: float = 1.0) -> dict[str, dict[float, dict[str, int]]]:
    """Inference parameters and MACs per example of each method's model at each width, and
    what a client of that budget trains per round (parameters up, forward MACs per example)."""
    def net(width: float, bases: int = 1):
        return build_model(model, shape, 10, width=full_width * width, bases=bases)

    base = net(WIDTHS[0])
    p_base, m_base = count_params(base), count_macs(base, shape)
    out: dict[str, dict[float, dict[str, int]]] = {"split_mix": {}, "heterofl": {}, "sheterofl": {}, "fedavg": {}}
    for w in WIDTHS:
        single = net(w)
        p, m = count_params(single), count_macs(single, shape)
        k = round(w / WIDTHS[0])
        out["fedavg"][w] = out["heterofl"][w] = {"params": p, "macs": m, "train_macs": m, "upload": p}
        narrower = [x for x in WIDTHS if x <= w]
        slim_macs = sum(count_macs(net(x), shape) for x in narrower)
        out["sheterofl"][w] = {"params": p, "macs": m, "train_macs": slim_macs, "upload": p}
        out["split_mix"][w] = {"params": k * p_base, "macs": k * m_base, "train_macs": k * m_base, "upload": k * p_base}
    return out


def table_rows(results: Results, study: SplitMixStudy, cost: dict, paper_table: dict, source: str) -> list[ResultRow]:
    """Each method's accuracy at each width beside ``paper_table`` (method -> width -> %) from ``source``."""
    rows = []
    for method in study.methods:
        for w in WIDTHS:
            c = cost[method][w]
            paper = paper_table.get(method, {}).get(w)
            rows.append(ResultRow(
                f"x{w:g} ({c['params']:,} params, {c['macs']:,} MACs)", f"{LABELS[method]}: test accuracy",
                st.cell(results[method][w]), f"{paper}%" if paper is not None else f"not in {source}",
                "budget-incompatible (upper bound)" if method == "fedavg" and w > WIDTHS[0] else "",
            ))
    return rows


def plot(results: Results, study: SplitMixStudy, path: Path, paper_table: dict, title: str, paper_data: str) -> None:
    """Accuracy vs width per method (mean ± std over seeds), the paper's numbers as dotted lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for method in study.methods:
        line = ax.errorbar(WIDTHS, [st.mean(results[method][w]) for w in WIDTHS],
                           yerr=[st.std(results[method][w]) for w in WIDTHS], marker="o", capsize=3, label=LABELS[method])
        if method in paper_table:
            ax.plot(WIDTHS, [paper_table[method][w] / 100 for w in WIDTHS], linestyle=":", color=line[0].get_color(),
                    label=f"{LABELS[method]} (paper, {paper_data})")
    ax.set_xscale("log", base=2)
    ax.set_xticks(WIDTHS, [f"x{w:g}" for w in WIDTHS])
    ax.set_xlabel("model width at test time")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"{title}: mean ± std over {len(study.seeds)} seed(s)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
