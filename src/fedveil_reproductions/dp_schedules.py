"""Dynamic vs uniform noise schedules for private GD (Hong, dissertation Ch. 2, §2.5; spec §1.10).

Setup (spec §1.10): MNIST subsets (10 digits, N = 1000; MNIST35 = digits 3 and 5 with a
data-size sweep), PCA to 60 dims fitted on the training subset, centred, unit std, rescaled
so the largest row norm is 10; one hidden layer (ReLU) with cross-entropy; full-batch PGD
(Alg. 2.1) with lr 0.1, clip 4 and budget (4, 1e-8)-DP, i.e. rho = 0.196352-zCDP, R = 0.392704.

Schedules: **uni** sigma_t^2 = T/R with T tuned on an auxiliary Gaussian data set of the same
size (labels from a random linear teacher), and **exp** (the GD-optimal exponential-influence
schedule, :func:`gd_dynamic_sigmas`) with (T, gamma) tuned on the same auxiliary set. Both
spend exactly R. The claim (no numbers in the dissertation; ``paper/dp_schedules.toml``): as N
grows, exp beats uni on training loss and test accuracy.

Every run is Alg. 2.1 through the library's :func:`~fedveil.privacy.dp_gd.train_dp_gd` (a
:class:`~fedveil.privacy.schedules.PredefinedSchedule` of the sigmas, budget R, noise from a
torch generator seeded per run).

Besides the absolute loss, each seed also runs the same PGD without noise for each schedule's T
(:func:`train_noiseless`); the excess loss (private − noiseless, what Table 2.1 bounds, spec §1.11)
and the paired gap excess_uni − excess_exp with its standard error decide the claim
(:func:`claim_verdict`).

:func:`run_study` is the core (sizes, seeds, grids and model width are parameters);
:func:`dp_schedules` picks the quick or full configuration.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedveil.data.errors import DataError
from fedveil.data.loaders.mnist import SUBSET, read_idx
from fedveil.privacy.dp_gd import DPGDParams, train_dp_gd
from fedveil.privacy.schedules import (
    PredefinedSchedule,
    gd_dynamic_sigmas,
    uniform_sigmas,
)
from fedveil.privacy.zcdp import epsilon_from_budget, rho_from_epsilon_delta
from fedveil.reproduce import (
    REPRODUCTIONS,
    ReproductionContext,
    ReproductionReport,
    ResultRow,
    StudyReproduction,
)

from .paper_numbers import paper_numbers

PAPER = paper_numbers(__name__)
EPSILON, DELTA = 4.0, 1e-8
ACTIVATION = "relu"


@dataclass
class StudyConfig:
    """Everything :func:`run_study` varies; the defaults are the full run."""

    sizes_35: list[int] = field(default_factory=lambda: [250, 500, 750, 1000])  # MNIST35 sweep, the paper's range N <= 1000
    size_10: int | None = 1000  # the 10-class task (None: skip)
    seeds: list[int] = field(default_factory=lambda: list(range(20)))  # paired excess-gap s.e. well below the gap
    tune_seeds: list[int] = field(default_factory=lambda: [100])  # seeds of the auxiliary-set runs
    T_grid: list[int] = field(default_factory=lambda: [50, 75, 100, 125, 150])
    gamma_grid: list[float] = field(default_factory=lambda: [0.9, 0.95, 0.98, 0.99])
    hidden: int = 1000
    pca_dim: int = 60
    max_norm: float = 10.0
    lr: float = 0.1
    clip: float = 4.0
    epsilon: float = EPSILON
    delta: float = DELTA
    max_test: int | None = None  # cap on the held-out test rows (None: all remaining)
    data_seed: int = 0  # which training subset is drawn (fixed over the repetitions)


# --------------------------------------------------------------------------------------
# Data


def load_mnist_file(data_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """All images (n, 784) as floats in [0, 1] and labels of the one IDX pair in ``data_dir``
    (``images-idx3-ubyte[.gz]`` + ``labels-idx1-ubyte[.gz]``, else the official train pair)."""
    for stems in (SUBSET, ("train-images-idx3-ubyte", "train-labels-idx1-ubyte")):
        paths = []
        for stem in stems:
            found = [p for p in (data_dir / f"{stem}.gz", data_dir / stem) if p.exists()]
            paths.append(found[0] if found else None)
        if all(paths):
            images, labels = read_idx(paths[0], ndim=3), read_idx(paths[1], ndim=1)
            if len(images) != len(labels):
                raise DataError(f"{paths[0]} has {len(images)} images but {paths[1]} has {len(labels)} labels")
            return images.reshape(len(images), -1).astype(np.float32) / 255.0, labels.astype(np.int64)
    raise DataError(
        f"no MNIST IDX files in {data_dir}: expected images-idx3-ubyte[.gz] + labels-idx1-ubyte[.gz] "
        "(e.g. the 10k subset in shared/data/mnist-10k)"
    )


def _normalise(x: np.ndarray, mean: np.ndarray, std: np.ndarray, scale: float) -> np.ndarray:
    return ((x - mean) / std * scale).astype(np.float32)


def _fit_normaliser(x: np.ndarray, max_norm: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Centre, unit std per feature, then one factor so that max_n ||x_n|| = max_norm."""
    mean, std = x.mean(0), x.std(0)
    std = np.where(std > 0, std, 1.0)
    z = (x - mean) / std
    return mean, std, max_norm / float(np.linalg.norm(z, axis=1).max())


@dataclass
class Task:
    name: str
    x: torch.Tensor
    y: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int


def make_task(
    images: np.ndarray, labels: np.ndarray, digits: list[int] | None, n: int, cfg: StudyConfig, name: str
) -> Task:
    """Train subset of n images of ``digits`` (all if None), the rest of those digits as test set;
    PCA + normalisation fitted on the training subset only (not private, see scale notes)."""
    from sklearn.decomposition import PCA

    keep = np.arange(len(labels)) if digits is None else np.flatnonzero(np.isin(labels, digits))
    if n >= len(keep):
        raise DataError(f"{name}: asked for {n} training images but only {len(keep)} are available")
    rng = np.random.default_rng(cfg.data_seed)
    order = keep[rng.permutation(len(keep))]
    train, test = order[:n], order[n:]
    if cfg.max_test is not None:
        test = test[: cfg.max_test]
    classes = sorted(set(labels[keep].tolist())) if digits is None else sorted(digits)
    remap = {c: i for i, c in enumerate(classes)}
    to_y = np.vectorize(remap.__getitem__, otypes=[np.int64])
    pca = PCA(n_components=min(cfg.pca_dim, n, images.shape[1]), random_state=0).fit(images[train])
    ptrain, ptest = pca.transform(images[train]), pca.transform(images[test])
    mean, std, scale = _fit_normaliser(ptrain, cfg.max_norm)
    return Task(
        name,
        torch.from_numpy(_normalise(ptrain, mean, std, scale)),
        torch.from_numpy(to_y(labels[train])),
        torch.from_numpy(_normalise(ptest, mean, std, scale)),
        torch.from_numpy(to_y(labels[test])),
        len(classes),
    )


def auxiliary_task(n: int, dim: int, num_classes: int, cfg: StudyConfig, seed: int = 12345) -> Task:
    """Gaussian random data of the same size, normalised like the real data; labels from a
    random linear teacher (argmax of x W + b). It touches no private data."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim))
    mean, std, scale = _fit_normaliser(x, cfg.max_norm)
    x = _normalise(x, mean, std, scale)
    w, b = rng.standard_normal((dim, num_classes)), 0.1 * rng.standard_normal(num_classes)
    y = np.argmax(x @ w + b, axis=1).astype(np.int64)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    return Task(f"aux-{n}", xt, yt, xt, yt, num_classes)


# --------------------------------------------------------------------------------------
# Training


def make_model(dim: int, hidden: int, num_classes: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    act = nn.ReLU() if ACTIVATION == "relu" else nn.Sigmoid()
    return nn.Sequential(nn.Linear(dim, hidden), act, nn.Linear(hidden, num_classes))


def _train(task: Task, sigmas: np.ndarray, cfg: StudyConfig, seed: int, budget: float | None) -> dict[str, float]:
    """Alg. 2.1 (full batch, beta = 0) by :func:`train_dp_gd` from the seed's init:
    ``theta_{t+1} = theta_t - lr (sum_n clip_C(g_n) + C sigma_t nu_t) / N``, ``nu_t`` drawn from a
    generator seeded by ``seed`` too (``sigma_t = 0``: a non-private clipped GD step), each step
    charged ``1/sigma_t^2`` to ``budget``. Final training loss on the whole training set, test
    accuracy and the epsilon spent (at ``cfg.delta``); a schedule that does not fit ``budget`` is refused."""
    model = make_model(task.x.shape[1], cfg.hidden, task.num_classes, seed)
    run = train_dp_gd(
        model, task.x, task.y, nn.functional.cross_entropy, PredefinedSchedule(tuple(sigmas)),
        DPGDParams(lr=cfg.lr, clip_norm=cfg.clip, budget=budget, delta=cfg.delta),
        torch.Generator().manual_seed(10_000 + seed),
    )
    if run.stop_reason == "budget":
        raise ValueError(f"the schedule's {len(sigmas)} steps spend more than the budget R = {budget:.6g}: "
                         f"it pays for {run.steps}")
    with torch.no_grad():
        loss = nn.functional.cross_entropy(torch.func.functional_call(model, run.params, (task.x,)), task.y).item()
        pred = torch.func.functional_call(model, run.params, (task.x_test,)).argmax(1)
        acc = (pred == task.y_test).float().mean().item()
    if not math.isfinite(loss):
        loss = float("inf")
    return {"loss": loss, "acc": acc, "steps": run.steps, "epsilon": run.epsilon}


def train_eval(task: Task, sigmas: np.ndarray, cfg: StudyConfig, seed: int) -> dict[str, float]:
    """One PGD run under ``sigmas`` within the budget R; final non-private train loss and test accuracy."""
    return _train(task, sigmas, cfg, seed, budget=2 * rho_from_epsilon_delta(cfg.epsilon, cfg.delta))


def train_noiseless(task: Task, T: int, cfg: StudyConfig, seed: int) -> dict[str, float]:
    """The same run without noise (non-private clipped full-batch GD: same init seed, T steps, lr,
    clip): the reference of the excess loss that Table 2.1's utility bounds measure; epsilon is inf."""
    return _train(task, np.zeros(T), cfg, seed, budget=None)


def tune(aux: Task, cfg: StudyConfig) -> dict:
    """Grid-search T (uniform) and (T, gamma) (dynamic) on the auxiliary set by mean final loss."""
    R = 2 * rho_from_epsilon_delta(cfg.epsilon, cfg.delta)

    def score(sigmas: np.ndarray) -> float:
        return statistics.fmean(train_eval(aux, sigmas, cfg, s)["loss"] for s in cfg.tune_seeds)

    uni = {T: score(uniform_sigmas(R, T)) for T in cfg.T_grid}
    dyn = {(T, g): score(gd_dynamic_sigmas(R, T, g)) for T in cfg.T_grid for g in cfg.gamma_grid}
    T_uni = min(uni, key=uni.get)
    T_dyn, gamma = min(dyn, key=dyn.get)
    return {
        "uniform_T": T_uni,
        "dynamic_T": T_dyn,
        "dynamic_gamma": gamma,
        "aux_loss_uniform": {str(k): v for k, v in uni.items()},
        "aux_loss_dynamic": {f"T={k[0]},gamma={k[1]}": v for k, v in dyn.items()},
    }


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def _sem(values: list[float]) -> float:
    """Standard error of the mean of paired differences; NaN with one seed."""
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan


def compare(task: Task, cfg: StudyConfig) -> dict:
    """Tune both schedules on an auxiliary set of the task's size, then train on the task over the
    seeds, plus the noiseless run of each seed at each schedule's T (the excess-loss reference).

    Per seed: ``excess_<schedule> = loss_<schedule> − loss_noiseless(T_<schedule>)`` and the paired
    differences ``excess_gap = excess_uniform − excess_dynamic``, ``loss_gap = loss_uniform −
    loss_dynamic`` and ``acc_gap = acc_dynamic − acc_uniform`` (both schedules of a seed share the
    init and the noise generator's seed); ``*_se`` = stdev of the paired differences / sqrt(n)."""
    R = 2 * rho_from_epsilon_delta(cfg.epsilon, cfg.delta)
    t0 = time.perf_counter()
    tuned = tune(auxiliary_task(len(task.x), task.x.shape[1], task.num_classes, cfg), cfg)
    schedules = {
        "uniform": uniform_sigmas(R, tuned["uniform_T"]),
        "dynamic": gd_dynamic_sigmas(R, tuned["dynamic_T"], tuned["dynamic_gamma"]),
    }
    runs = {name: [train_eval(task, sig, cfg, seed) for seed in cfg.seeds] for name, sig in schedules.items()}
    steps = sorted({tuned["uniform_T"], tuned["dynamic_T"]})
    ref = {T: [train_noiseless(task, T, cfg, seed) for seed in cfg.seeds] for T in steps}
    out = {"task": task.name, "n_train": len(task.x), "n_test": len(task.x_test), "seeds": list(cfg.seeds), **tuned}
    out["noiseless"] = {str(T): {"loss": [r["loss"] for r in rs], "acc": [r["acc"] for r in rs]} for T, rs in ref.items()}
    for name, rs in runs.items():
        for metric in ("loss", "acc"):
            values = [r[metric] for r in rs]
            out[f"{name}_{metric}"] = values
            out[f"{name}_{metric}_mean"], out[f"{name}_{metric}_std"] = _mean_std(values)
        T = tuned[f"{name}_T"]
        out[f"{name}_noiseless_loss"] = base = out["noiseless"][str(T)]["loss"]
        out[f"{name}_noiseless_loss_mean"], out[f"{name}_noiseless_loss_std"] = _mean_std(base)
        out[f"{name}_excess"] = excess = [l - b for l, b in zip(out[f"{name}_loss"], base)]
        out[f"{name}_excess_mean"], out[f"{name}_excess_std"] = _mean_std(excess)
        out[f"{name}_epsilon"] = rs[0]["epsilon"]
    paired = {
        "excess_gap": [u - d for u, d in zip(out["uniform_excess"], out["dynamic_excess"])],
        "loss_gap": [u - d for u, d in zip(out["uniform_loss"], out["dynamic_loss"])],
        "acc_gap": [d - u for u, d in zip(out["uniform_acc"], out["dynamic_acc"])],
    }
    for key, values in paired.items():
        out[key] = values
        out[f"{key}_mean"] = statistics.fmean(values)
        out[f"{key}_se"] = _sem(values)
    out["excess_significance"] = significance(out["excess_gap_mean"], out["excess_gap_se"])
    out["seconds"] = time.perf_counter() - t0
    return out


def significance(gap: float, se: float) -> str:
    """``gap`` = uni − exp (positive: exp better): 'exp lower' / 'uni lower' beyond 2 standard
    errors, else 'not resolved'."""
    if math.isnan(se):
        return "not resolved"
    if gap > 2 * se:
        return "exp lower"
    if gap < -2 * se:
        return "uni lower"
    return "not resolved"


def claim_verdict(sweep: list[dict]) -> dict:
    """The claim "exp beats uni as N grows" judged on the excess training loss over the MNIST35
    sweep (sorted by N): per size the paired gap's significance; the trend is the per-seed paired
    change of the gap from the smallest to the largest N (same seeds at every N), significant beyond
    2 s.e. Reproduced: exp significantly lower at every size and the gap grows significantly.
    Partly: exp significantly lower at >= 1 size and significantly higher at none. Else not reproduced."""
    sweep = sorted(sweep, key=lambda r: r["n_train"])
    status = [significance(r["excess_gap_mean"], r["excess_gap_se"]) for r in sweep]
    first, last = sweep[0], sweep[-1]
    change = [b - a for a, b in zip(first["excess_gap"], last["excess_gap"])]
    d_mean, d_se = statistics.fmean(change), _sem(change)
    trend = {"exp lower": "grows", "uni lower": "shrinks", "not resolved": "no resolved change"}[significance(d_mean, d_se)]
    wins, losses = status.count("exp lower"), status.count("uni lower")
    if wins == len(sweep) and trend == "grows":
        verdict = "claim reproduced"
    elif wins >= 1 and losses == 0:
        verdict = "claim partly reproduced"
    else:
        verdict = "claim NOT reproduced"
    return {
        "verdict": verdict, "status": status, "wins": wins, "losses": losses,
        "unresolved": [r["n_train"] for r, st in zip(sweep, status) if st == "not resolved"],
        "trend": trend, "trend_change": d_mean, "trend_se": d_se,
    }


def run_study(data_dir: Path, cfg: StudyConfig, log=print) -> list[dict]:
    """The core: one :func:`compare` per task (10-class at ``size_10``, MNIST35 at each of ``sizes_35``)."""
    images, labels = load_mnist_file(Path(data_dir))
    tasks = []
    if cfg.size_10 is not None:
        tasks.append((None, cfg.size_10, f"MNIST (10 digits), N={cfg.size_10}"))
    tasks += [([3, 5], n, f"MNIST35, N={n}") for n in cfg.sizes_35]
    results = []
    for digits, n, name in tasks:
        res = compare(make_task(images, labels, digits, n, cfg, name), cfg)
        res["digits"] = "all" if digits is None else "3,5"
        log(
            f"[dp_schedules] {name}: uni(T={res['uniform_T']}) loss {res['uniform_loss_mean']:.4f} "
            f"excess {res['uniform_excess_mean']:+.4f} acc {res['uniform_acc_mean']:.4f} | "
            f"exp(T={res['dynamic_T']}, gamma={res['dynamic_gamma']}) loss {res['dynamic_loss_mean']:.4f} "
            f"excess {res['dynamic_excess_mean']:+.4f} acc {res['dynamic_acc_mean']:.4f} | excess gap "
            f"{res['excess_gap_mean']:+.4f} ± {res['excess_gap_se']:.4f} s.e. ({res['seconds']:.1f}s)"
        )
        results.append(res)
    return results


# --------------------------------------------------------------------------------------
# Report


def _pm(mean: float, std: float, n: int) -> str:
    return f"{mean:.4f} ± {std:.4f} (n={n})"


def plot(results: list[dict], path: Path) -> Path | None:
    """MNIST35 rows vs N: training loss (with noiseless GD at each schedule's T), excess loss over
    noiseless GD (± std over seeds), the paired excess gap uni − exp (± 2 s.e.) and test accuracy."""
    sweep = sorted((r for r in results if r["digits"] == "3,5"), key=lambda r: r["n_train"])
    if not sweep:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    ns = [r["n_train"] for r in sweep]
    k = len(sweep[0]["seeds"])
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    panels = (
        (axes[0, 0], "loss", "final training loss", "std"),
        (axes[0, 1], "excess", "excess loss over noiseless GD (same T)", "std"),
        (axes[1, 1], "acc", "test accuracy", "std"),
    )
    for ax, metric, label, _ in panels:
        for name, short, marker in (("uniform", "uni", "o"), ("dynamic", "exp", "s")):
            ax.errorbar(
                ns, [r[f"{name}_{metric}_mean"] for r in sweep], yerr=[r[f"{name}_{metric}_std"] for r in sweep],
                marker=marker, capsize=3, label=f"{short} (± std)",
            )
        if metric == "loss":
            for name, short, ls in (("uniform", "uni", "--"), ("dynamic", "exp", ":")):
                ax.plot(ns, [r[f"{name}_noiseless_loss_mean"] for r in sweep], ls=ls, color="grey",
                        label=f"noiseless GD at {short}'s T")
        if metric == "excess":
            ax.axhline(0, color="black", lw=0.8)
        ax.set_ylabel(label)
    ax = axes[1, 0]
    ax.errorbar(ns, [r["excess_gap_mean"] for r in sweep], yerr=[2 * r["excess_gap_se"] for r in sweep],
                marker="D", capsize=3, color="C2", label="excess uni − exp (± 2 s.e., paired)")
    ax.axhline(0, color="black", lw=0.8)
    ax.set_ylabel("paired excess-loss gap (uni − exp)")
    for ax in axes.flat:
        ax.set_xscale("log")
        ax.set_xticks(ns)
        ax.set_xticklabels([str(n) for n in ns])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("training size N (MNIST35)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"PGD, ({EPSILON:g}, {DELTA:g})-DP: uniform vs dynamic noise schedule ({k} seeds)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


_SIG_TEXT = {
    "exp lower": "exp lower, significant (> 2 s.e.)",
    "uni lower": "uni lower, significant (> 2 s.e.)",
}


def _sig_text(status: str, k: int) -> str:
    return _SIG_TEXT.get(status, f"not resolved at {k} seeds (< 2 s.e.)")


def build_report(results: list[dict], cfg: StudyConfig, quick: bool, figures: list[str]) -> ReproductionReport:
    rows: list[ResultRow] = []
    for r in results:
        k = len(r["uniform_loss"])
        same_T = r["uniform_T"] == r["dynamic_T"]
        tuned = f"uni T={r['uniform_T']}; exp T={r['dynamic_T']}, gamma={r['dynamic_gamma']}"
        lstat = significance(r["loss_gap_mean"], r["loss_gap_se"])
        rows.append(ResultRow(
            f"{r['task']} ({tuned})", "final training loss, uni vs exp",
            f"{_pm(r['uniform_loss_mean'], r['uniform_loss_std'], k)} vs {_pm(r['dynamic_loss_mean'], r['dynamic_loss_std'], k)}",
            PAPER["claims"]["loss"],
            f"absolute gap uni − exp {r['loss_gap_mean']:+.4f} ± {r['loss_gap_se']:.4f} s.e. (paired): {_sig_text(lstat, k)}",
        ))
        base = (
            f"noiseless GD loss {r['uniform_noiseless_loss_mean']:.4f} at T={r['uniform_T']}" if same_T else
            f"noiseless GD loss {r['uniform_noiseless_loss_mean']:.4f} at T={r['uniform_T']}, "
            f"{r['dynamic_noiseless_loss_mean']:.4f} at T={r['dynamic_T']}"
        )
        share = ", ".join(
            f"{short} {100 * r[f'{name}_excess_mean'] / r[f'{name}_loss_mean']:+.0f}%"
            for name, short in (("uniform", "uni"), ("dynamic", "exp"))
        )
        rows.append(ResultRow(
            r["task"], "excess training loss over noiseless GD (same seed, same T), uni vs exp",
            f"{_pm(r['uniform_excess_mean'], r['uniform_excess_std'], k)} vs "
            f"{_pm(r['dynamic_excess_mean'], r['dynamic_excess_std'], k)}; {base}; excess / absolute loss: {share}",
            PAPER["claims"]["excess"],
            f"paired excess gap uni − exp {r['excess_gap_mean']:+.4f} ± {r['excess_gap_se']:.4f} s.e.: "
            f"{_sig_text(r['excess_significance'], k)}"
            + ("" if same_T else " (T differs, so this is not the absolute gap)"),
        ))
        astat = significance(r["acc_gap_mean"], r["acc_gap_se"])
        rows.append(ResultRow(
            r["task"], f"test accuracy, uni vs exp (n_test={r['n_test']})",
            f"{_pm(r['uniform_acc_mean'], r['uniform_acc_std'], k)} vs {_pm(r['dynamic_acc_mean'], r['dynamic_acc_std'], k)}",
            PAPER["claims"]["accuracy"],
            f"exp − uni {r['acc_gap_mean'] * 100:+.2f} ± {r['acc_gap_se'] * 100:.2f} s.e. points (paired): "
            + {"exp lower": "exp higher, significant (> 2 s.e.)", "uni lower": "exp LOWER, significant (> 2 s.e.)"}.get(
                astat, f"not resolved at {k} seeds (< 2 s.e.)"),
        ))
    sweep = sorted((r for r in results if r["digits"] == "3,5"), key=lambda r: r["n_train"])
    verdict = None
    if len(sweep) >= 2:
        k = len(sweep[0]["seeds"])
        verdict = claim_verdict(sweep)
        ns = [r["n_train"] for r in sweep]
        unresolved = (
            "; not resolved at " + f"{k} seeds at N=" + ",".join(map(str, verdict["unresolved"])) if verdict["unresolved"] else ""
        )
        rows.append(ResultRow(
            "MNIST35 sweep N=" + ",".join(map(str, ns)),
            "advantage of exp over uni vs N: paired excess-loss gap uni − exp ± s.e.; change of that gap from the "
            "smallest to the largest N (paired over seeds); acc gap exp − uni (points)",
            "excess gap " + ", ".join(f"N={r['n_train']}: {r['excess_gap_mean']:+.4f} ± {r['excess_gap_se']:.4f}" for r in sweep)
            + f"; change {verdict['trend_change']:+.4f} ± {verdict['trend_se']:.4f}; acc gap "
            + ", ".join(f"{r['acc_gap_mean'] * 100:+.2f} ± {r['acc_gap_se'] * 100:.2f}" for r in sweep),
            PAPER["claims"]["trend"],
            f"{verdict['verdict']} (on excess training loss): exp significantly lower at {verdict['wins']}/{len(sweep)} "
            f"sizes, uni significantly lower at {verdict['losses']}{unresolved}; the gap {verdict['trend']} "
            f"from N={ns[0]} to N={ns[-1]}",
        ))
    R = 2 * rho_from_epsilon_delta(cfg.epsilon, cfg.delta)
    k = len(cfg.seeds)
    notes = [
        f"{k} repetitions (seeds: init + noise) per schedule instead of the dissertation's 100; "
        "the training subset is drawn once (data_seed) and kept fixed over repetitions; ± is the std over repetitions, "
        "except where marked s.e.: the standard error of a paired difference (stdev of the per-seed differences / sqrt(n); "
        "both schedules and the noiseless run of a seed share its init, and both schedules its noise generator seed); "
        "'significant' means beyond 2 s.e.",
        "excess loss (what Table 2.1's utility bounds measure) = a private run's final training loss − that of the same "
        "run without noise (non-private clipped full-batch GD: same init seed, same T as that schedule, same lr and clip), "
        "per seed; Table 2.1 lets non-private GD stop at the same T. When uni and exp have the same T the paired excess gap "
        "equals the paired absolute gap; when T differs it does not",
        f"images from the 10,000-image MNIST file (shared/data/mnist-10k); the test set is the held-out rest of that file "
        f"(same digits){'' if cfg.max_test is None else f', capped at {cfg.max_test} rows'}",
        f"PCA to {cfg.pca_dim} dims is fitted on the (private) training subset, as in Abadi et al.; this preprocessing is "
        "NOT differentially private and is not charged to the budget (a faithful-to-paper simplification)",
        f"activation unspecified in the dissertation: {ACTIVATION} chosen; hidden width {cfg.hidden}"
        + (" (paper: 1000)" if cfg.hidden != 1000 else ""),
        f"budget ({cfg.epsilon:g}, {cfg.delta:g})-DP -> rho={R / 2:.6f}-zCDP, R={R:.6f}; both schedules spend exactly R "
        f"(achieved epsilon {epsilon_from_budget(R, cfg.delta):.4f}); full-batch PGD lr {cfg.lr}, clip {cfg.clip}",
        f"tuning on an auxiliary Gaussian data set of the same size and dimension (labels = argmax of a random linear teacher; "
        f"labels unspecified in the paper), {len(cfg.tune_seeds)} seed(s) per grid point, by mean final training loss: "
        f"T in {cfg.T_grid}, gamma in {cfg.gamma_grid}; tuning cost ignored as in the paper",
        "the paper's N values: MNIST (10 digits) N=1000 as in the dissertation; the MNIST35 sizes of Fig. 2.1 are not "
        "listed, and the spec's MNIST source (mnist_5k) holds up to 500 3s + 500 5s, i.e. N <= 1000, so MNIST35 uses N = "
        + ", ".join(map(str, cfg.sizes_35))
        + " (the 10k file has 1,895 3s+5s; the earlier N=1400 is beyond what the paper could have used and is dropped)",
        "the per-step influence estimate of Fig. 2.1 (left) is not reproduced",
        "PGD runs go through fedveil.privacy.dp_gd.train_dp_gd (Alg. 2.1, full batch) with the sigmas as a PredefinedSchedule "
        "and budget R, whose zCDP accounting gives the epsilon; for this Linear-ReLU-Linear net the library sums the clipped "
        "per-example gradients in closed form (fedveil.privacy.dp_sgd.linear_stack_grads); the noise C*sigma_t*N(0,I)/N is "
        "drawn from a torch generator seeded per run (10000 + seed)",
        "claim verdict rule: per size, exp wins if the paired excess gap uni − exp > 2 s.e.; the trend is the per-seed change "
        "of that gap from the smallest to the largest N (same seeds at every N) with its paired s.e.; reproduced = exp wins "
        "at every size and the gap grows significantly; partly = exp wins at >= 1 size and loses significantly at none; "
        "test accuracy is reported but not part of the verdict",
    ]
    if results:
        notes.append(_diagnosis(results, verdict))
    if quick:
        notes.append("quick mode: fewer sizes, 2 seeds, coarser T/gamma grids; a smoke test, not the reproduction")
    return ReproductionReport(
        title="Dynamic vs uniform noise schedule for private GD (MNIST / MNIST35)",
        source=PAPER["source"],
        rows=rows,
        scale_notes=notes,
        extra={"config": asdict(cfg), "activation": ACTIVATION, "results": results, "claim": verdict},
        figures=figures,
    )


def _diagnosis(results: list[dict], verdict: dict | None) -> str:
    """A note computed from the numbers: how large the noiseless loss and the excess are."""
    parts = []
    for r in results:
        parts.append(
            f"{r['task']}: noiseless {r['uniform_noiseless_loss_mean']:.3f}, excess uni {r['uniform_excess_mean']:+.4f} / "
            f"exp {r['dynamic_excess_mean']:+.4f} (abs. loss {r['uniform_loss_mean']:.3f} / {r['dynamic_loss_mean']:.3f})"
        )
    text = (
        "diagnosis: the absolute training loss = the loss noiseless GD itself has after the same T steps + the excess "
        "due to the noise; only the excess is what the theory bounds (noiseless loss, mean excess, absolute loss). "
        + "; ".join(parts)
    )
    neg = [r["task"] for r in results if min(r["uniform_excess_mean"], r["dynamic_excess_mean"]) < 0]
    if neg:
        text += (
            ". A negative mean excess (" + ", ".join(neg) + ") means the noisy run ends below noiseless GD at the same T: "
            "the excess is measured against GD stopped after the same T steps, not against the minimum, so it can be negative"
        )
    text += (
        ". Table 2.1's bounds shrink like 1/N² for both schedules (uni's by an extra ln N factor), so a gap that shrinks "
        "with N is consistent with the bounds; the claim as worded (exp's advantage grows with N) is judged on the gap itself"
    )
    return text


def run(ctx: ReproductionContext, cfg: StudyConfig) -> list[dict]:
    """Every task's tuning and seeds (:func:`run_study`) on the MNIST files under the data root."""
    return run_study(ctx.data_dir("mnist-10k", "mnist"), cfg)


def report(ctx: ReproductionContext, cfg: StudyConfig, results: list[dict]) -> ReproductionReport:
    """The rows beside the dissertation's claims and the figure."""
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    fig = plot(results, ctx.out_dir / "dp_schedules.png")
    return build_report(results, cfg, ctx.quick, [fig.name] if fig else [])


def settings(ctx: ReproductionContext) -> StudyConfig:
    """The study: quick or full."""
    return config_for(ctx.quick)


def config_for(quick: bool) -> StudyConfig:
    if not quick:
        return StudyConfig()
    return StudyConfig(
        sizes_35=[250, 500, 1000],  # hidden layer stays 1000 wide (the library clips linear stacks in closed form)
        size_10=1000,
        seeds=[0, 1],
        tune_seeds=[100],
        T_grid=[50, 100, 150],
        gamma_grid=[0.9, 0.95, 0.99],
    )


REPRODUCTIONS.register(
    "dp_schedules", "Dynamic vs uniform noise schedule for full-batch private GD on MNIST/MNIST35 (Hong, Ch. 2)"
)(StudyReproduction(settings, run, report))
