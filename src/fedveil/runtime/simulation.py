"""The round loop: one federated simulation from a validated :class:`RunConfig`.

Everything that can fail on bad input (the device, data loading, partitioning, model
building, hyper-parameters) happens in :meth:`Simulation.from_config`, before any file is
written; the model, its initial state and every client's data then live on the run's
device. :meth:`Simulation.record` trains round by round and hands a
:class:`~fedveil.runtime.recorder.RunRecorder` one metrics row per round, a checkpoint
every ``checkpoint.every`` rounds and the summary; it resumes bit-for-bit from the
recorder's last checkpoint: all randomness is drawn from streams derived from
``(seed, purpose, round, client)``. :meth:`Simulation.run` records into a run directory.
"""
from __future__ import annotations

import gc
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from ..algorithms import ALGORITHMS, Algorithm, ClientTask, RunContext
from ..models.functional import model_state
from ..errors import ConfigError
from ..config import RunConfig
from .dataset import build_dataset
from .malloc_tuning import keep_freed_memory_for_reuse
from ..data.federated import ClientData, FederatedDataset
from ..models import build_model
from ..models.complexity import count_params, macs_per_example
from ..params import Params
from ..privacy.randomness import NoiseSource
from .callbacks import Callback
from .client_store import ClientStateStore, MemoryClientStore
from .device import CPU, federated_to, resolve_device
from .executor import auto_executor, make_executor
from .vectorized import stacked_chunk_size
from ..training.local import LocalTrainer, task_loss
from .run_privacy import RunPrivacy
from .recorder import DirectoryRecorder, MemoryRecorder, RunRecorder
from .report import write_report
from .secure_sum import SecureSumSettings, summed_in_the_clear
from .round_metrics import RoundEvaluator, check_metrics
from .run_dir import RunDirError, config_fingerprint
from .initial_model import initial_params
from .robust import robust_messages
from .sampling import client_schedule, secure_cohort
from ..seeding import derive_seed, torch_generator
from .summary import build_summary
from .tracking import check_tracking, tracking_sinks


AUTO_CNN_MIN_SIDE = 16  # smaller images (8x8 digits) train better and faster as MLP inputs


def auto_model_name(data: FederatedDataset) -> str:
    """``model.name = "auto"``: LeNet for images of at least 16x16, an MLP for smaller
    images (8x8 digits) and tabular classification, char-LSTM for token sequences and a
    linear model for tabular regression."""
    if len(data.input_shape) == 3:
        return "lenet" if min(data.input_shape[1:]) >= AUTO_CNN_MIN_SIDE else "mlp"
    if not data.test.x.is_floating_point():
        return "char_lstm"
    return "mlp" if data.task == "classification" else "linear"


@dataclass(frozen=True)
class ModelFactory:
    """Builds the run's model afresh, identically every call: on the CPU under the run's
    ``init`` seed (so the initial state does not depend on the device), then moved to
    ``device`` (default: the run's). The algorithms' :class:`RunContext` carries it."""

    name: str
    input_shape: tuple[int, ...]
    num_classes: int
    options: dict[str, Any]
    seed: int
    device: torch.device = CPU

    def __call__(self, device: torch.device | str | None = None, **options: Any) -> nn.Module:
        """The run's model; ``options`` override its builder options (e.g. ``width=0.25`` for
        HeteroFL's sub-model architecture)."""
        with torch.random.fork_rng(devices=[]), torch.device("cpu"):  # CPU draws only; the CUDA RNGs untouched
            torch.default_generator.manual_seed(derive_seed(self.seed, "init"))
            model = build_model(self.name, self.input_shape, self.num_classes, **{**self.options, **options})
        return model.to(self.device if device is None else device)


@dataclass(frozen=True)
class FederationShape:
    """What every party of a run may know of its data without holding it: the number of
    clients, the task and the shape of one example, and the model the run trains (``auto``
    resolved). A deployed server builds its algorithm from this alone."""

    num_clients: int
    task: str
    num_classes: int
    input_shape: tuple[int, ...]
    model_name: str

    @classmethod
    def of(cls, data: FederatedDataset, model_name: str = "auto") -> "FederationShape":
        """The shape of ``data``, with ``model_name`` ("auto": the data set's default model)."""
        name = auto_model_name(data) if model_name == "auto" else model_name
        return cls(data.num_clients, data.task, data.num_classes, tuple(data.input_shape), name)


def build_run_pieces(
    config: RunConfig, shape: FederationShape, device: torch.device, noise: NoiseSource | None = None
) -> tuple[ModelFactory, nn.Module, LocalTrainer, Algorithm]:
    """The run's model factory, model, local trainer and algorithm, built from the config
    and the federation's shape only (no data): the same pieces in a simulation, on a
    deployed server and on every silo. Raises :class:`ConfigError` on a bad model or loss.
    ``noise`` (default: the one ``privacy.secure_rng`` asks for) is the run's noise source,
    in the algorithm's context for every mechanism to draw from."""
    name = shape.model_name if config.model.name == "auto" else config.model.name
    factory = ModelFactory(name, shape.input_shape, shape.num_classes, dict(config.model.options), config.seed, device)
    try:
        model = factory()
    except (ValueError, TypeError) as err:
        raise ConfigError(f"model: {err}") from None
    try:
        loss_fn = task_loss(shape.task, config.client.loss)
    except ValueError as err:
        raise ConfigError(f"client.loss: {err}") from None
    trainer = LocalTrainer(model, loss_fn, config.client, config.federation.rounds)
    ctx = RunContext(
        num_clients=shape.num_clients, task=shape.task, num_classes=shape.num_classes, input_shape=shape.input_shape,
        rounds=config.federation.rounds, seed=config.seed, model_factory=factory, trainer=trainer, device=device,
        noise=NoiseSource.for_config(config.privacy.secure_rng) if noise is None else noise,
        private=config.privacy.level != "none", data=config.data.model_dump(mode="json"),
    )
    algorithm = ALGORITHMS.get(config.algorithm.name)(config.algorithm.typed_params(), ctx)
    fed = config.federation
    if (fed.aggregation != "mean" or fed.update_norm_bound is not None) and not algorithm.delta_messages:
        raise ConfigError(
            f"federation.aggregation / update_norm_bound: {config.algorithm.name}'s messages carry no update delta to "
            "bound or combine robustly; use aggregation = \"mean\" without update_norm_bound"
        )
    if config.secure_aggregation.enabled and not algorithm.secure_summable:
        raise ConfigError(
            f"secure_aggregation: {config.algorithm.name}'s server needs each client's message, not only their sum; "
            "it works with the FedAvg family (fedavg, fedprox, fedavgm, fedadam, ditto ...)"
        )
    return factory, model, trainer, algorithm


def securely_summed(config: RunConfig, algorithm, messages: list[tuple[int, Any]], round_idx: int) -> list[tuple[int, Any]]:
    """The cohort's messages as secure aggregation leaves them: one message, the weighted
    mean of their quantised updates (:mod:`fedveil.runtime.secure_sum`)."""
    settings = SecureSumSettings.from_config(config.secure_aggregation)
    if len(messages) < 2:  # one silo's "sum" is its update: a deployment ends such a round unchanged
        return []
    weights = algorithm.weights([m for _, m in messages])
    return summed_in_the_clear(messages, weights, settings, config.seed, round_idx)


def robust_messages_of(config: RunConfig, messages: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
    """The cohort's messages as ``federation.aggregation`` / ``update_norm_bound`` make them
    (:mod:`fedveil.runtime.robust`); unchanged for the plain mean."""
    fed = config.federation
    try:
        return robust_messages(messages, fed.aggregation, fed.trim_fraction, fed.update_norm_bound)
    except ValueError as err:
        raise ConfigError(f"federation.aggregation: {err}") from None


SMALL_STEP_MACS = 32_000_000  # below: one torch thread (docs/executors.md#threads); 1 M parameters x a batch of 32


def run_threads(threads: int | None, step_macs: int, default: int) -> int:
    """The run's torch CPU threads: ``threads`` when set, else 1 when one training step's
    kernels compute fewer than :data:`SMALL_STEP_MACS` multiply-accumulates (see
    :meth:`Simulation.step_macs`), else ``default`` (torch's)."""
    if threads is not None:
        return threads
    return 1 if step_macs < SMALL_STEP_MACS else default


def example_work(model: nn.Module, rows: torch.Tensor) -> int:
    """Multiply-accumulates one example costs the model's forward: its convolutions' and
    linear layers' (measured on ``rows``), at least one per parameter (each weight is used
    once: recurrent cells, which the count leaves out, and models whose forward these rows
    cannot drive alone)."""
    try:
        macs = macs_per_example(model, rows)
    except (RuntimeError, TypeError, ValueError, IndexError):  # e.g. a model fed by a trainer's input_fn
        macs = 0
    return max(macs, count_params(model))


def run_schedule(config: RunConfig, num_clients: int) -> list[np.ndarray]:
    """The run's pre-generated cohorts, round by round (a simulation, a deployed server and
    every silo draw the same ones from the seed); a bad federation setting is a ConfigError."""
    fed = config.federation
    try:
        return client_schedule(
            num_clients, fed.clients_per_round, fed.rounds, fed.sampling, config.seed, fed.client_probabilities
        )
    except ValueError as err:
        raise ConfigError(f"federation: {err}") from None


def training_task(
    seed: int, cid: int, round_idx: int, data: ClientData, trainer: LocalTrainer, privacy: RunPrivacy | None,
) -> ClientTask:
    """Client ``cid``'s job in round ``round_idx``: its rows, its own ``(seed, "train", round,
    client)`` stream and, under example-level DP, the noise its plan calibrated. A simulation
    and a deployed silo build it here alike, so both train on the same stream."""
    return ClientTask(
        client_id=cid,
        round=round_idx,
        data=data,
        generator=torch_generator(seed, "train", round_idx, cid),
        trainer=trainer,
        dp=None if privacy is None else privacy.task_dp(cid, round_idx),
        privacy_budget=None if privacy is None else privacy.plan.budget_of(cid),
    )


@dataclass
class Simulation:
    """A federated run in one process: the config, the clients' data, the model, the algorithm,
    the local trainer, the seeded client schedule and the privacy plan, and the loop that trains
    them round by round (``run`` into a run directory, ``record`` into any recorder, resumable
    from a checkpoint). Build one with :meth:`from_config`; ``train_round`` runs one round."""

    config: RunConfig
    data: FederatedDataset
    model: nn.Module
    model_name: str
    init: Params
    algorithm: Algorithm
    trainer: LocalTrainer
    schedule: list[np.ndarray]
    privacy: RunPrivacy | None = None
    callbacks: list[Callback] = field(default_factory=list)
    executor: Any = None  # built from config.executor on first use
    device: torch.device = CPU  # where the model, the data and every state live

    def __post_init__(self) -> None:
        if self.executor is None:
            name, workers = self.config.executor, self.config.threads or torch.get_num_threads()
            if name == "auto":
                name = auto_executor(self.model, self.config.privacy.level == "example", self.device, workers)
            self.executor = make_executor(name, self.config.ray, self.device, workers)
        if hasattr(self.executor, "probe"):  # the vectorized executor says now whether it can stack the model
            self.executor.probe(self.model, private=self.config.privacy.level == "example")

    @classmethod
    def from_config(
        cls, config: RunConfig, callbacks: Sequence[Callback] = (), noise: NoiseSource | None = None
    ) -> "Simulation":
        """Resolve the device, load data, build the model and the algorithm; raises before
        anything is written. The model and the data are moved to the device here, once.
        ``noise``: the run's noise source (default: the one ``privacy.secure_rng`` asks for;
        :class:`~fedveil.privacy.randomness.NoiseSource` ``("zero")`` for the audit's self-test)."""
        check_tracking(config.log)
        device = resolve_device(config.device)
        data = build_dataset(config.data, config.seed)
        check_metrics(config.eval.metrics, config.eval.group, data)
        factory, model, trainer, algorithm = build_run_pieces(
            config, FederationShape.of(data, config.model.name), device, noise
        )
        model_name = factory.name
        fed = config.federation
        schedule = run_schedule(config, data.num_clients)
        privacy = RunPrivacy.from_config(
            config.privacy, data.num_clients, dict(enumerate(data.train_sizes().tolist())), trainer, model, algorithm,
            schedule, fed.sampling, fed.clients_per_round,
            weighted_sampling=fed.client_probabilities is not None,
            secure=SecureSumSettings.from_config(config.secure_aggregation) if config.secure_aggregation.enabled else None,
        )
        init = initial_params(model_state(model), config.model.init_from, config.model.init_skip)
        data = federated_to(data, device)
        return cls(
            config, data, model, model_name, init, algorithm, trainer, schedule, privacy, list(callbacks), device=device,
        )

    # ------------------------------------------------------------------ state
    def fresh_state(self, clients: ClientStateStore | None = None) -> dict[str, Any]:
        """Round-0 state; client states go to ``clients`` (default: an empty in-memory store)."""
        clients = MemoryClientStore() if clients is None else clients
        server = self.algorithm.init_server(self.init)
        if self.algorithm.has_setup:
            server = self.setup(server)
        return {"round": 0, "server": server, "clients": clients, "elapsed_s": 0.0}

    def setup(self, server: dict[str, Any]) -> dict[str, Any]:
        """The algorithm's setup phase: every client's ``client_setup`` (from its own "setup"
        stream), its releases recorded in its ledger and checked against the plan, then the
        server's ``finish_setup``. Runs once per run: a resumed run restores its result."""
        contributions = []
        for cid, client in enumerate(self.data.clients):
            result = self.algorithm.client_setup(cid, client, torch_generator(self.config.seed, "setup", cid))
            if result.releases:
                if self.privacy is None:
                    raise RuntimeError(f"{type(self.algorithm).__name__} released data in its setup without a privacy plan")
                self.privacy.record_releases(cid, result.releases)
            contributions.append((cid, result.contribution))
        if self.privacy is not None:
            self.privacy.check.check()
        return self.algorithm.finish_setup(server, contributions)

    def client_state(self, state: dict[str, Any], cid: int):
        """Client ``cid``'s state in ``state`` (the algorithm's initial one if it has none yet)."""
        stored = state["clients"].get(cid)
        return self.algorithm.init_client(cid, state["server"]) if stored is None else stored

    def client_store(self, recorder: RunRecorder, checkpoint: dict[str, Any] | None) -> ClientStateStore:
        """The configured store of the clients' states that ``recorder`` provides, as of
        ``checkpoint`` (None: no state yet)."""
        store = recorder.client_store(self.config.federation.client_state, self.device)
        if checkpoint is None:
            store.restore({}, 0)  # a run killed before its first checkpoint may have left states
        else:
            store.restore(checkpoint["clients"], checkpoint["round"])
        return store

    def task(self, cid: int, round_idx: int) -> ClientTask:
        """Client ``cid``'s training task in round ``round_idx``: its data, seeded generator and DP."""
        return training_task(self.config.seed, cid, round_idx, self.data.clients[cid], self.trainer, self.privacy)

    # ------------------------------------------------------------------- loop
    @property
    def secure_cohorts(self) -> bool:
        """Client-level DP with ``secure_rng``: the accountant's client sampling is drawn from the
        secure source each round instead of the seeded schedule."""
        return self.privacy is not None and self.privacy.server is not None and self.privacy.noise.secure

    def cohort(self, round_idx: int) -> list[int]:
        """The clients of round ``round_idx``: the seeded schedule's, or under client-level DP
        with ``secure_rng`` a fresh draw from the secure source."""
        fed = self.config.federation
        if self.secure_cohorts:
            source = self.privacy.noise.stream("client-sampling", torch_generator(self.config.seed, "cohort", round_idx))
            drawn = secure_cohort(self.data.num_clients, fed.clients_per_round, fed.sampling, source)
        else:
            drawn = self.schedule[round_idx]
        return [int(c) for c in drawn]

    def train_round(self, state: dict[str, Any], round_idx: int) -> dict[str, Any]:
        """Run round ``round_idx`` (0-based) in place on ``state``; return its training stats.
        Raises :class:`~fedveil.privacy.ledger_check.PrivacyCheckError` (nothing of the round
        kept) if a ledger spent more than the privacy plan calibrated through this round."""
        cohort = self.cohort(round_idx)
        planned = self.algorithm.configure_round(state["server"], cohort, round_idx)
        jobs = [(self.task(cid, round_idx), self.client_state(state, cid)) for cid in cohort]
        results = self.executor.run_cohort(self.algorithm, planned, jobs)
        for cid, result in zip(cohort, results):
            if result.state is not None:
                state["clients"].put(cid, result.state, round_idx + 1)
        for (task, _), result in zip(jobs, results):
            if task.dp is not None:
                self.privacy.record_client(task.client_id, task.data.num_train, task.dp, result.dp_trainings)
            if result.releases:
                if self.privacy is None:
                    raise RuntimeError(f"{type(self.algorithm).__name__} returned noisy releases in a run without privacy")
                self.privacy.record_releases(task.client_id, result.releases)
        messages = [(c, r.message) for c, r in zip(cohort, results)]
        facts = {}
        if self.privacy is not None and self.privacy.plan.distributed is not None:
            server, facts = self._distributed_update(planned, messages, round_idx, len(cohort)), {}
        elif self.privacy is not None and self.privacy.server is not None:
            server, facts = self._client_level_update(planned, messages, round_idx)
        elif self.config.secure_aggregation.enabled:
            server = self.algorithm.aggregate(planned, securely_summed(self.config, self.algorithm, messages, round_idx), round_idx)
        else:
            server = self.algorithm.aggregate(planned, robust_messages_of(self.config, messages), round_idx)
        if self.privacy is not None:
            self.privacy.check_round(round_idx, cohort)
        state["server"], state["round"] = server, round_idx + 1
        losses = [r.stats.loss for r in results if r.stats is not None and not np.isnan(r.stats.loss)]
        row: dict[str, Any] = {"round": round_idx + 1, "cohort_size": len(cohort), "lr": self.trainer.lr_at(round_idx)}
        if losses:
            row["train_loss"] = float(np.mean(losses))
        for key in set(self.withheld) & set(row):
            del row[key]
        if self.privacy is not None:
            row.update(facts)
            row.update(self.privacy.metrics())
        extra: dict[str, list[float]] = {}
        for r in results:
            for key, value in r.extra_metrics.items():
                if "client_extra_metrics" not in self.withheld or self.algorithm.is_public_metric(key):
                    extra.setdefault(key, []).append(value)
        # average the clients' extra metrics only: epsilon_per_client is a list and stays one
        row.update({k: float(np.mean(v)) for k, v in extra.items()})
        return row

    @property
    def stacked_copies(self) -> int:
        """How many copies of the model one stacked kernel computes: the cohort (at most one
        stacked chunk) under the vectorized executor, else 1."""
        if getattr(self.executor, "name", None) != "vectorized":
            return 1
        return min(self.config.federation.clients_per_round, stacked_chunk_size(self.model))

    def _client_level_update(self, server_state, messages, round_idx: int):
        """DP-FedAvg: the server sees only the clipped, noised, uniform mean of the updates."""
        template = self.algorithm.global_params(server_state)
        generator = self.privacy.noise.stream("dp-fedavg", torch_generator(self.config.seed, "client-dp", round_idx))
        mean, facts = self.privacy.private_mean_update([m["delta"] for _, m in messages], template, generator, round_idx)
        return self.algorithm.server_update(server_state, mean), facts

    def _distributed_update(self, server_state, messages, round_idx: int, cohort_size: int):
        """Distributed DP: the server unmasks only the noisy sum of the silos' shares."""
        updates = [(cid, m["delta"]) for cid, m in messages]
        mean = self.privacy.distributed_mean_update(updates, round_idx, cohort_size, self.config.seed)
        return server_state if mean is None else self.algorithm.server_update(server_state, mean)

    def evaluator(self) -> RoundEvaluator:
        """The scorer of each evaluated round (``eval.*``: batch size, personal models, metrics)."""
        ev = self.config.eval
        return RoundEvaluator(
            self.algorithm, self.data, self.trainer, self.config.seed, ev.batch_size, ev.personal, ev.metrics, ev.group
        )

    @property
    def config_dict(self) -> dict[str, Any]:
        """The resolved config as JSON data (what ``config.json`` holds and checkpoints are fingerprinted by)."""
        return self.config.model_dump(mode="json")

    def run(self, out: str | Path, resume: bool = False, plots: bool = True) -> dict[str, Any]:
        """Train all rounds, writing into run directory ``out`` (and to the ``[log]`` trackers,
        and the PNG plots unless ``plots=False``); returns the summary."""
        with tracking_sinks(self.config.log, out, self.config_dict) as sinks:
            recorder = DirectoryRecorder.open(out, self.config_dict, resume, plots=write_report if plots else None)
            return self.record(recorder, sinks)

    def record(self, recorder: RunRecorder | None = None, callbacks: Sequence[Callback] = ()) -> dict[str, Any]:
        """Train all rounds (those after ``recorder``'s last checkpoint), handing ``recorder``
        what a run keeps (default: a :class:`MemoryRecorder`); returns the summary.
        ``callbacks`` watch this call only, after :attr:`callbacks`. Torch's CPU threads and
        the garbage collector are set by :meth:`training_settings` meanwhile."""
        with self.training_settings():
            return self._record(recorder, callbacks)

    @contextmanager
    def training_settings(self) -> Iterator[int]:
        """Inside the block: torch's CPU threads set to :func:`run_threads`'s count for this run
        (yielded), and every object built so far (data, model, imported modules) left out of
        Python's garbage collection (``gc.freeze``: a full collection walking them paused an
        MLP x100 round by 0.18 s); after it, the caller's threads and the collector as they
        were. glibc's malloc keeps freed blocks for reuse from the first call on
        (:mod:`~fedveil.runtime.malloc_tuning`). What :meth:`record` trains with, and what
        the benchmark times :meth:`train_round` with."""
        keep_freed_memory_for_reuse()
        before = torch.get_num_threads()
        threads = run_threads(self.config.threads, self.step_macs, before)
        torch.set_num_threads(threads)
        frozen = gc.get_freeze_count()
        gc.freeze()
        try:
            yield threads
        finally:
            if not frozen:  # frozen by the caller before: theirs to undo
                gc.unfreeze()
            torch.set_num_threads(before)

    @property
    def step_macs(self) -> int:
        """Multiply-accumulates one local step's kernels compute: :func:`example_work` of the
        model (on two training rows) x the batch size (full batch: the largest client's rows)
        x :attr:`stacked_copies`."""
        train = max((c.train for c in self.data.clients), key=len)
        batch = self.config.client.batch_size or len(train)
        return example_work(self.model, train.x[:2]) * batch * self.stacked_copies

    def _record(self, recorder: RunRecorder | None, callbacks: Sequence[Callback]) -> dict[str, Any]:
        recorder = MemoryRecorder() if recorder is None else recorder
        fingerprint = config_fingerprint(self.config_dict)
        checkpoint = recorder.load_checkpoint(self.device)
        if checkpoint is not None and checkpoint.get("fingerprint") != fingerprint:
            raise RunDirError(f"checkpoint in {recorder.where} belongs to another config; start a new run")
        saved_on = None if checkpoint is None else checkpoint.pop("device", None)
        if saved_on is not None and saved_on != str(self.device):
            warnings.warn(
                f"resuming on {self.device} a run checkpointed on {saved_on}: it continues, but its numbers will "
                f"not be bit-identical to an uninterrupted run (set device = \"{saved_on}\" to keep them)",
                stacklevel=2,
            )
        clients = self.client_store(recorder, checkpoint)
        state = self.fresh_state(clients) if checkpoint is None else {**checkpoint, "clients": clients}
        if self.privacy is not None and "privacy" in state:
            self.privacy.load_state_dict(state["privacy"], self.schedule, state["round"])
        facts = self.partition_facts()
        if "partition_counts" in self.withheld:
            facts = {"pooled_test_size": facts["pooled_test_size"]}
        recorder.record_partition(facts)
        rows = recorder.rows_through(state["round"])
        pending = state.pop("row", None)  # a secure run's last row, checkpointed before it was written
        if pending is not None and (not rows or rows[-1]["round"] < pending["round"]):
            recorder.record_row(pending)
            rows.append(pending)
        return self._loop(recorder, state, rows, fingerprint, [*self.callbacks, *callbacks])

    @property
    def withheld(self) -> tuple[str, ...]:
        """What a DP run leaves out of its outputs by default: values computed from the private
        rows without noise, which its epsilon does not cover (``privacy.keep_unnoised``
        keeps them): the training loss of the private batches, per-client row counts and
        scores (``client_metrics``), the partition's per-client counts, the algorithm's
        extra client metrics but its public ones (``Algorithm.public_metrics``), and at
        client level the realised cohort size, which must stay secret for the sampling
        amplification."""
        privacy = self.config.privacy
        if privacy.level == "none" or privacy.keep_unnoised:
            return ()
        withheld = ("train_loss", "client_metrics", "partition_counts", "client_extra_metrics")
        return withheld + (("cohort_size",) if privacy.level == "client" else ())

    @property
    def checkpoints_every_round(self) -> bool:
        """A run with secure noise checkpoints every round, before the round's row leaves the
        process: a resume never re-executes a round whose output was seen (fresh secure noise
        on the same rows would be a release the ledger never counted)."""
        return self.privacy is not None and self.privacy.noise.secure

    def _loop(
        self, recorder: RunRecorder, state: dict[str, Any], rows: list[dict], fingerprint: str, callbacks: list[Callback],
    ) -> dict[str, Any]:
        rounds, every = self.config.federation.rounds, self.config.checkpoint.every
        evaluator, client_rows = self.evaluator(), None
        for cb in callbacks:
            cb.on_run_start(rounds, state["round"])
        started = time.perf_counter() - state["elapsed_s"]
        for r in range(state["round"], rounds):
            row = self.train_round(state, r)
            last = r + 1 == rounds
            if (r + 1) % self.config.eval.every == 0 or last:
                metrics, client_rows = evaluator(state["server"], state["clients"], r)
                row.update(metrics)
            state["elapsed_s"] = row["elapsed_s"] = time.perf_counter() - started
            if self.checkpoints_every_round:
                self._save_checkpoint(recorder, {**state, "row": row}, fingerprint)
            recorder.record_row(row)
            rows.append(row)
            for cb in callbacks:
                cb.on_round_end(row)
            if not self.checkpoints_every_round and (last or (every and (r + 1) % every == 0)):
                self._save_checkpoint(recorder, state, fingerprint)
        if client_rows is None:  # resumed a finished run: score the final state again
            _, client_rows = evaluator(state["server"], state["clients"], rounds - 1)
        privacy_facts = self.privacy.summary() if self.privacy is not None else {}
        summary = build_summary(self.config, self.model_name, self.data, privacy_facts, rows, state["elapsed_s"])
        summary["device"] = str(self.device)
        summary["executor"] = getattr(self.executor, "name", type(self.executor).__name__)
        summary["torch_threads"] = torch.get_num_threads()
        if self.withheld:
            summary["withheld_unnoised"] = list(self.withheld)
            client_rows = [{"client": row["client"]} for row in client_rows]
        if self.algorithm.has_global_model:  # local / MOCHA / IFCA: no one model to save
            recorder.save_model(self.algorithm.global_params(state["server"]))
        recorder.finish(summary, client_rows)
        for cb in callbacks:
            cb.on_run_end(summary)
        return summary

    def _save_checkpoint(self, recorder: RunRecorder, state: dict[str, Any], fingerprint: str) -> None:
        """Hand the recorder the checkpoint (the client store gives what it needs saved), then
        let the store drop client-state versions only older checkpoints needed."""
        clients = state["clients"]
        extra = {
            "clients": clients.to_checkpoint(), **self._privacy_state(), "fingerprint": fingerprint,
            "device": str(self.device),
        }
        recorder.save_checkpoint({**state, **extra})
        clients.checkpoint_saved(state["round"])

    def _privacy_state(self) -> dict[str, Any]:
        """The ledger (and adaptive clip) for a checkpoint; serialised only when saving."""
        return {} if self.privacy is None else {"privacy": self.privacy.state_dict()}

    def partition_facts(self) -> dict[str, Any]:
        """Client sizes (and label counts) of the partition, for ``partition.json``."""
        facts: dict[str, Any] = {
            "train_sizes": self.data.train_sizes().tolist(),
            "test_sizes": [len(c.test) for c in self.data.clients],
            "val_sizes": [0 if c.val is None else len(c.val) for c in self.data.clients],
            "pooled_test_size": len(self.data.test),
        }
        if self.data.task == "classification":  # counted where the labels are (on the run's device)
            k = self.data.num_classes
            facts["label_counts"] = [torch.bincount(c.train.y, minlength=k)[:k].tolist() for c in self.data.clients]
        return facts
