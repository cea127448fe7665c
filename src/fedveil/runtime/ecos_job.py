"""One ECOS job end to end (``fedveil ecos CONFIG.toml``): plan the client's privacy, load the
data, split client and cloud rows (B.8), select (Alg. 5.1 or a baseline), label the
selection (truly, or by the client's private kNN), train the cloud's model and score it on
the client domain's test rows (spec 000 part 2, PART B).

:func:`run_job` writes into its folder

* ``config.json``: the job's config, every default filled in (:meth:`ECOSJobConfig.to_dict`);
* ``selection.json``: the chosen cloud rows (indices into the cloud pool and into the
  training set), their count and in-distribution share, the client's upload (its noisy
  coverage scores and their bytes), the stage costs and the ledger after the selection;
* ``labels.json`` (private kNN labels only): the released rows and labels, and the ledger
  after the labelling;
* ``ledger.json``: the client's privacy ledger (:meth:`PrivacyLedger.state_dict`) and its
  epsilon at delta, rewritten after each private stage;
* ``summary.json``: accuracy, epsilon, bytes up and down, seconds per stage.

Decisions:

* Privacy first: the releases the job will make (the coverage upload of a private method;
  the labelling of at most ``budget`` queries) and their composed epsilon are printed before
  any data is read, and a plan over ``ecos.epsilon_budget`` is refused.  The labelling is
  planned at ``budget`` queries, an upper bound (ECOS may select fewer); the ledger records
  the actual count.
* Reruns: a folder whose ``config.json`` holds another config is refused.  With the same
  config, a stage whose file is there is read back, not redone: the ledger is the one that
  stage file saved, so a rerun after a crash records no second release.  A stage that was
  cut short before its file was written is recomputed from the same seeded streams, so it
  reproduces the same release (same data, same noise) and records it once.  A job whose
  ``summary.json`` is there is complete: its summary is returned as it is.
* Seeds: the split draws from ``ecos/split`` under ``data.split_seed`` (the ``ID`` and
  ``ID+OoD`` clouds of a seed share the client's half, as in ``ecos_labelling``); the pool's
  clustering, the noise, the selection, the labels, the model and its batches from
  ``seed``'s streams (:mod:`fedveil.ecos.pipeline`).
* Bytes: the client's data counts as its 8-bit pixels (C x H x W bytes a row); it uploads
  the coverage summary (4 R + 24 bytes) and, with private kNN, 5 bytes per released label;
  it downloads the R float32 centroids and, with private kNN, the queries as 8-bit pixels.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..data import DATASETS
from ..data.source import DataSource
from ..ecos.cloud_training import accuracy, initial_model, train_classifier
from ..ecos.pipeline import PRIVATE_METHODS, CloudPool, label, plan, plan_labelling, select
from ..ecos.selection_plot import plot_selection
from ..ecos.splits import split_rows
from ..errors import ConfigError
from ..privacy.events import Release
from ..privacy.ledger import PrivacyLedger
from ..seeding import numpy_generator
from .ecos_config import ECOSJobConfig

__all__ = [
    "CONFIG_FILE", "JobPlan", "LABELS_FILE", "LEDGER_FILE", "SELECTION_FILE", "SUMMARY_FILE", "format_summary",
    "plan_job", "run_job",
]

CONFIG_FILE = "config.json"
SELECTION_FILE = "selection.json"
SELECTION_PLOT = "selection.png"  # pool and selection per domain, and the uploaded counts
LABELS_FILE = "labels.json"
LEDGER_FILE = "ledger.json"
SUMMARY_FILE = "summary.json"
STAGES = ("cloud_features", "clustering", "client_summary", "selection", "labelling", "training")


# ------------------------------------------------------------------------------ plan


@dataclasses.dataclass(frozen=True)
class JobPlan:
    """The releases a job's client will make (``what`` names each) and their composed
    epsilon at ``delta`` (an upper bound when labelling: planned at ``budget`` queries)."""

    releases: tuple[Release, ...]
    what: tuple[str, ...]
    epsilon: float
    delta: float

    def describe(self, subject: str) -> str:
        """One line saying what ``subject``'s releases are and the epsilon they compose to."""
        if not self.releases:
            return f"client {subject} releases nothing (epsilon 0): the selection and the labels read none of its data"
        bound = "at most " if any("queries" in w for w in self.what) else ""
        return (f"client {subject} will spend epsilon {bound}{self.epsilon:.4g} at delta {self.delta:g} "
                f"({' + '.join(self.what)})")


def plan_job(config: ECOSJobConfig) -> JobPlan:
    """The client's releases and their composed epsilon, before any work; a one-line
    ConfigError when it exceeds ``ecos.epsilon_budget``."""
    settings, releases, what = config.ecos.settings, [], []
    try:
        if config.ecos.method in PRIVATE_METHODS:
            releases += plan(settings).releases
            what.append(f"coverage upload, sigma {settings.sigma:g}, gamma {settings.sample_rate:g}")
        if config.private_labels:
            releases += plan_labelling(settings, config.labels.knn, config.ecos.budget).releases
            what.append(f"private kNN labels of <= {config.ecos.budget} queries")
    except ValueError as err:
        raise ConfigError(f"ecos.epsilon_budget: {err}") from None
    epsilon = PrivacyLedger(settings.accountant).epsilon_of(releases, settings.delta) if releases else 0.0
    if settings.epsilon_budget is not None and epsilon > settings.epsilon_budget:
        raise ConfigError(
            f"ecos.epsilon_budget: the job's releases compose to epsilon {epsilon:.4g} at delta {settings.delta:g}, "
            f"over the budget {settings.epsilon_budget:g}; raise the noise, lower the sampling rate or the budget"
        )
    return JobPlan(tuple(releases), tuple(what), epsilon, settings.delta)


# ------------------------------------------------------------------------------ files


def _write_json(path: Path, value: Any) -> None:
    """Write ``value`` as JSON atomically (a temporary file renamed over ``path``)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=2) + "\n")
    os.replace(tmp, path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ConfigError(f"cannot read {path}: {' '.join(str(err).split())}; remove it to redo its stage") from None


def _first_difference(a: Any, b: Any, where: str = "") -> str | None:
    """The dotted key where ``a`` and ``b`` first differ (None: equal)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for key in sorted(set(a) | set(b), key=str):
            dotted = f"{where}.{key}" if where else str(key)
            if key not in a or key not in b:
                return dotted
            found = _first_difference(a[key], b[key], dotted)
            if found is not None:
                return found
        return None
    return None if a == b else (where or "config")


def _value_at(tree: Any, dotted: str) -> str:
    for key in dotted.split("."):
        if not isinstance(tree, Mapping) or key not in tree:
            return "unset"
        tree = tree[key]
    return json.dumps(tree)


def _check_folder(out: Path, config: ECOSJobConfig) -> bool:
    """Whether ``out`` already holds this job (True), or is new or empty (False); refuses a
    folder of another config or one that holds something else."""
    saved = out / CONFIG_FILE
    if saved.exists():
        before, now = _read_json(saved), json.loads(json.dumps(config.to_dict()))
        differs = _first_difference(before, now)
        if differs is not None:
            there, here = _value_at(before, differs), _value_at(now, differs)
            raise ConfigError(f"{out} holds an ECOS job of another config ({differs}: {there} there, {here} here); "
                              "choose another --out folder or remove that one")
        return True
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out} exists and holds no ECOS job ({CONFIG_FILE}); choose another --out folder")
    return False


# ------------------------------------------------------------------------------ data


@dataclasses.dataclass(eq=False)
class _Data:
    source: DataSource
    domain: np.ndarray
    client_domain: int
    subject: str
    client: np.ndarray  # training rows of the client
    pool: np.ndarray  # training rows of the cloud pool
    test: Any  # the client domain's test rows


def _load(config: ECOSJobConfig) -> _Data:
    data = config.data
    source = DATASETS.get(data.name)(data.root, download=data.download, **data.options)
    train, test = source.train, source.test
    if "domain" not in train.groups:
        raise ConfigError(f"data.name: {data.name} has no per-row 'domain' group; ECOS splits the client's domain "
                          "from the cloud's (e.g. digit_domains_synthetic)")
    if train.x.ndim != 4 or source.task != "classification":
        raise ConfigError(f"data.name: ECOS needs image classification (N x C x H x W); {data.name} has rows of "
                          f"shape {tuple(train.x.shape[1:])}, task {source.task}")
    if test is None or "domain" not in test.groups:
        raise ConfigError(f"data.options: {data.name} loaded no test split with a 'domain' group, where the job scores "
                          "the cloud's model (digit_domains_synthetic: set test_rows_per_domain > 0)")
    domain = train.groups["domain"].numpy()
    names = list(train.info.get("domain_names") or [])
    present = sorted(int(d) for d in np.unique(domain))
    if isinstance(data.client_domain, str):
        if data.client_domain not in names:
            choices = ", ".join(names) if names else f"none (give an index of {present})"
            raise ConfigError(f"data.client_domain: {data.name} has no domain named {data.client_domain!r}; "
                              f"its names: {choices}")
        d = names.index(data.client_domain)
    else:
        d = data.client_domain
    if d not in present:
        raise ConfigError(f"data.client_domain: {data.name} has no domain {d}; its domains: {present}")
    subject = names[d] if d < len(names) else f"domain{d}"
    stream = "OoD" if data.cloud == "OoD" else "ID+OoD"  # ID and ID+OoD share the client's half
    try:
        client, pool = split_rows(domain, d, data.cloud, numpy_generator(data.split_seed, "ecos/split", stream, d))
    except ValueError as err:
        raise ConfigError(f"data.client_domain: {err}") from None
    if pool.size == 0:
        raise ConfigError(f"data.cloud: the {data.cloud} cloud of domain {d} holds no rows")
    if config.ecos.budget > pool.size:
        raise ConfigError(f"ecos.budget: B = {config.ecos.budget} exceeds the {pool.size} rows of the "
                          f"{data.cloud} cloud pool")
    test_rows = test.subset(test.groups["domain"] == d)
    if len(test_rows) == 0:
        raise ConfigError(f"data.options: domain {d} has no test rows to score the cloud's model on")
    return _Data(source, domain, d, subject, client, pool, test_rows)


def _preflight(config: ECOSJobConfig, data: _Data) -> None:
    """phi's options and the model's on the data's image shape, before any file is written."""
    train = data.source.train
    try:
        config.ecos.settings.features(train.x[data.pool[:2]])
    except ValueError as err:
        raise ConfigError(f"ecos.extractor_options: {' '.join(str(err).split())}") from None
    try:
        initial_model(tuple(train.x.shape[1:]), data.source.num_classes, config.cloud.model,
                      config.cloud.model_options, config.seed)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"cloud.model_options: {' '.join(str(err).split())}") from None


# ------------------------------------------------------------------------------ stages


def _ledger_of(state: Mapping[str, Any], where: Path) -> PrivacyLedger:
    try:
        return PrivacyLedger.from_state_dict(state)
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{where} holds no valid ledger ({err}); remove it to redo its stage") from None


def _write_ledger(out: Path, ledger: PrivacyLedger, subject: str, delta: float) -> float:
    epsilon = ledger.epsilon(subject, delta)  # 0 when nothing was recorded
    _write_json(out / LEDGER_FILE, {
        "subject": subject, "accountant": ledger.accountant.kind, "delta": delta, "epsilon": epsilon,
        "releases": [r.label for r in ledger.releases(subject)],
        "ledger": ledger.state_dict(),
    })
    return epsilon


def _selection_stage(config: ECOSJobConfig, data: _Data, out: Path, pool: Callable[[], CloudPool]) -> dict:
    """Select (or read back) the cloud rows; returns the stage record, ledger state included."""
    settings, train = config.ecos.settings, data.source.train
    ledger = PrivacyLedger(settings.accountant)
    try:
        picked = select(config.ecos.method, train.x[data.client], pool(), config.ecos.budget, settings, ledger,
                        data.subject, config.seed)
    except ValueError as err:
        raise ConfigError(f"ecos: {' '.join(str(err).split())}") from None
    chosen = data.pool[picked.indices]
    return {
        "method": config.ecos.method, "budget": config.ecos.budget, "selected": int(chosen.size),
        "client_rows": int(data.client.size), "pool_rows": int(data.pool.size),
        "id_share": float(np.mean(data.domain[chosen] == data.client_domain)) if chosen.size else 0.0,
        "summary_bytes": picked.cost.upload_bytes,
        "coverage_scores": picked.summary.scores.tolist() if picked.summary is not None else None,
        "epsilon": picked.epsilon, "cost": dataclasses.asdict(picked.cost),
        "indices": [int(i) for i in picked.indices], "rows": [int(r) for r in chosen],
        "ledger": ledger.state_dict(),
    }


def _labelling_stage(config: ECOSJobConfig, data: _Data, chosen: np.ndarray, ledger: PrivacyLedger) -> dict:
    """The client's private kNN labels of the selection, recorded in ``ledger``."""
    train = data.source.train
    try:
        answered = label(train.x[data.client], train.y[data.client], train.x[chosen], data.source.num_classes,
                         config.ecos.settings, config.labels.knn, ledger, data.subject, config.seed)
    except ValueError as err:
        raise ConfigError(f"labels: {' '.join(str(err).split())}") from None
    released = chosen[answered.answer.indices]
    labels = answered.answer.labels
    truth = train.y.numpy()[released]
    return {
        "queries": int(chosen.size), "released": int(released.size),
        "rows": [int(r) for r in released], "labels": [int(v) for v in labels],
        "label_accuracy": float(np.mean(truth == labels)) if released.size else 0.0,
        "upload_bytes": answered.answer.nbytes, "seconds": answered.client_seconds, "epsilon": answered.epsilon,
        "ledger": ledger.state_dict(),
    }


def _train(config: ECOSJobConfig, data: _Data, rows: np.ndarray, labels: np.ndarray):
    train, cloud = data.source.train, config.cloud
    labelled = train.subset(torch.from_numpy(rows).long())
    labelled = dataclasses.replace(labelled, y=torch.from_numpy(labels).to(labelled.y.dtype))
    try:
        if cloud.trainer == "supervised" or not rows.size:
            return train_classifier(labelled, data.source.num_classes, cloud.model, cloud.model_options, cloud.sgd,
                                    config.seed)
        from ..ecos.fixmatch import train_fixmatch

        return train_fixmatch(labelled, train.x[data.pool], data.source.num_classes, cloud.model, cloud.model_options,
                              cloud.sgd, cloud.fixmatch.settings, config.seed)
    except ValueError as err:
        raise ConfigError(f"cloud: {' '.join(str(err).split())}") from None


# ------------------------------------------------------------------------------ the job


def run_job(config: ECOSJobConfig, out_dir: str | Path, progress: bool = True) -> dict[str, Any]:
    """Run (or finish) the ECOS job ``config`` in ``out_dir`` and return its summary (module
    docstring); with ``progress``, one line per stage and the summary on stdout."""
    if not isinstance(config, ECOSJobConfig):
        raise ValueError(f"config must be an ECOSJobConfig; got {type(config).__name__}.")
    out = Path(out_dir)
    say: Callable[[str], None] = (lambda line: print(line, flush=True)) if progress else (lambda line: None)
    start = time.perf_counter()
    resumed = _check_folder(out, config)
    if resumed and (out / SUMMARY_FILE).exists():
        summary = _read_json(out / SUMMARY_FILE)
        say(f"[ecos] {out} holds this job, complete: nothing to do")
        if progress:
            print(format_summary(summary, out))
        return summary
    settings = config.ecos.settings
    job_plan = plan_job(config)
    d = config.data.client_domain
    say(f"[ecos] privacy plan: {job_plan.describe(d if isinstance(d, str) else f'of domain {d}')}")

    tic = time.perf_counter()
    data = _load(config)
    load_seconds = time.perf_counter() - tic
    train = data.source.train
    say(f"[ecos] data: {config.data.name}, client {data.subject} ({data.client.size:,} rows), {config.data.cloud} "
        f"cloud ({data.pool.size:,} rows), {len(data.test):,} test rows ({load_seconds:.1f} s)")
    _preflight(config, data)
    out.mkdir(parents=True, exist_ok=True)
    if not resumed:
        _write_json(out / CONFIG_FILE, config.to_dict())
    reused: list[str] = []
    pools: list[CloudPool] = []

    def pool() -> CloudPool:
        if not pools:
            pools.append(CloudPool(train.x[data.pool], settings, config.seed))
        return pools[0]

    # selection (the client's coverage upload for a private method)
    path = out / SELECTION_FILE
    if path.exists():
        selection = _read_json(path)
        if (selection.get("client_rows"), selection.get("pool_rows")) != (int(data.client.size), int(data.pool.size)):
            raise ConfigError(f"{path} was made from other data (client / pool rows differ); remove it to redo it")
        reused.append("selection")
        say(f"[ecos] selection: read back from {path} ({selection['selected']} rows; no new release)")
    else:
        tic = time.perf_counter()
        selection = _selection_stage(config, data, out, pool)
        ledger = _ledger_of(selection["ledger"], path)
        _write_ledger(out, ledger, data.subject, settings.delta)
        _write_json(path, selection)
        say(f"[ecos] selection: {config.ecos.method} picked {selection['selected']} of {data.pool.size:,} cloud rows "
            f"(ID share {selection['id_share']:.1%}), epsilon {selection['epsilon']:.4g} "
            f"({time.perf_counter() - tic:.1f} s)")
    ledger = _ledger_of(selection["ledger"], path)
    chosen = np.asarray(selection["rows"], dtype=np.int64)
    plot_selection(
        data.domain[data.pool], data.domain[chosen], data.client_domain, train.info.get("domain_names"),
        selection.get("coverage_scores"), out / SELECTION_PLOT, f"ECOS job: {config.ecos.method}, client {data.subject}",
    )

    # labels: true (a third party), or the client's private kNN (a second release)
    labelling: dict | None = None
    if config.private_labels and chosen.size:
        path = out / LABELS_FILE
        if path.exists():
            labelling = _read_json(path)
            reused.append("labelling")
            say(f"[ecos] labelling: read back from {path} ({labelling['released']} labels; no new release)")
        else:
            labelling = _labelling_stage(config, data, chosen, ledger)
            _write_ledger(out, _ledger_of(labelling["ledger"], path), data.subject, settings.delta)
            _write_json(path, labelling)
            say(f"[ecos] labelling: the client released {labelling['released']} private kNN labels of "
                f"{labelling['queries']} queries (accuracy {labelling['label_accuracy']:.1%}), epsilon "
                f"{labelling['epsilon']:.4g} ({labelling['seconds']:.1f} s)")
        ledger = _ledger_of(labelling["ledger"], path)
        rows, labels = np.asarray(labelling["rows"], dtype=np.int64), np.asarray(labelling["labels"], dtype=np.int64)
    else:
        rows, labels = chosen, train.y.numpy()[chosen]
        if config.private_labels:
            say("[ecos] labelling: nothing selected, nothing to label (no release)")
        else:
            say(f"[ecos] labelling: true labels of the {chosen.size} selected rows (a third party; no release)")
    epsilon = _write_ledger(out, ledger, data.subject, settings.delta)
    _check_epsilon(config, ledger, data.subject, epsilon, labelling)

    # training and score
    trained = _train(config, data, rows, labels)
    say(f"[ecos] training: {config.cloud.trainer} {config.cloud.model} on {rows.size} labelled rows "
        f"({trained.seconds:.1f} s)")
    tic = time.perf_counter()
    score = accuracy(trained.model, trained.params, data.test)
    eval_seconds = time.perf_counter() - tic
    say(f"[ecos] score: accuracy {score:.4f} on the client domain's {len(data.test):,} test rows")

    cost = selection["cost"]
    pixels = int(train.x[0].numel())
    client_bytes = pixels * int(data.client.size)
    upload = int(cost["upload_bytes"]) + (int(labelling["upload_bytes"]) if labelling else 0)
    download = int(cost["download_bytes"]) + (pixels * int(chosen.size) if config.private_labels else 0)
    summary = {
        "method": config.ecos.method, "dataset": config.data.name, "client": data.subject,
        "client_domain": data.client_domain, "cloud": config.data.cloud, "budget": config.ecos.budget,
        "labels": config.labels.source, "trainer": config.cloud.trainer, "model": config.cloud.model,
        "accuracy": score, "test_rows": len(data.test),
        "epsilon": epsilon, "delta": settings.delta, "planned_epsilon": job_plan.epsilon,
        "selected": int(chosen.size), "id_share": selection["id_share"],
        "labelled": int(rows.size), "label_accuracy": labelling["label_accuracy"] if labelling else 1.0,
        "client_rows": int(data.client.size), "pool_rows": int(data.pool.size),
        "upload_bytes": upload, "summary_bytes": int(selection["summary_bytes"]),
        "label_upload_bytes": int(labelling["upload_bytes"]) if labelling else 0,
        "client_data_bytes": client_bytes, "upload_share": upload / client_bytes if client_bytes else 0.0,
        "download_bytes": download,
        "seconds": {
            "data": load_seconds,
            "cloud_features": cost["cloud_features_s"], "clustering": cost["cloud_clustering_s"],
            "client_summary": cost["client_summary_s"], "selection": cost["cloud_selection_s"],
            "labelling": labelling["seconds"] if labelling else 0.0, "training": trained.seconds,
            "evaluation": eval_seconds,
        },
        "train_loss": trained.loss if math.isfinite(trained.loss) else None,
        "reused": reused, "wall_time_s": time.perf_counter() - start,
    }
    _write_json(out / SUMMARY_FILE, summary)
    if progress:
        print(format_summary(summary, out))
    return summary


def _check_epsilon(config: ECOSJobConfig, ledger: PrivacyLedger, subject: str, epsilon: float,
                   labelling: dict | None) -> None:
    """The ledger's epsilon is that of the planned releases, the labelling at its actual query count."""
    settings = dataclasses.replace(config.ecos.settings, epsilon_budget=None)
    releases = list(plan(settings).releases) if config.ecos.method in PRIVATE_METHODS else []
    if labelling is not None:
        releases += plan_labelling(settings, config.labels.knn, labelling["queries"]).releases
    expected = ledger.epsilon_of(releases, settings.delta) if releases else 0.0
    if not math.isclose(epsilon, expected, rel_tol=1e-9, abs_tol=1e-12):
        raise RuntimeError(f"ledger epsilon {epsilon!r} for {subject!r} differs from the planned {expected!r}.")


def format_summary(summary: Mapping[str, Any], out: str | Path) -> str:
    """A short human summary of a job's ``summary.json``."""
    s, sec = summary, summary["seconds"]
    labels = "true labels" if s["labels"] == "true" else f"{s['labelled']} private kNN labels"
    lines = [
        f"\nECOS job: {s['method']} on {s['dataset']}, client {s['client']}, {s['cloud']} cloud ({s['pool_rows']:,} "
        f"rows), B = {s['budget']}, {labels}, {s['trainer']} {s['model']}",
        f"  {'accuracy on the client test rows':<36} {s['accuracy']:.4f} ({s['test_rows']:,} rows)",
        f"  {'selected (in-distribution share)':<36} {s['selected']:,} ({s['id_share']:.1%})",
        f"  {'client epsilon':<36} {s['epsilon']:.4f} at delta {s['delta']:g}",
        f"  {'upload vs client data (8-bit)':<36} {s['upload_bytes']:,} B vs {s['client_data_bytes']:,} B "
        f"({s['upload_share']:.3%})",
        f"  {'download':<36} {s['download_bytes']:,} B",
        "  seconds: " + " / ".join(f"{k.replace('_', ' ')} {sec.get(k, 0.0):.2f}" for k in STAGES),
        f"  job folder: {out}  ({CONFIG_FILE}, {SELECTION_FILE}, {SELECTION_PLOT}, {LEDGER_FILE}, {SUMMARY_FILE})",
    ]
    return "\n".join(lines)
