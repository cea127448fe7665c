"""The round loop: one federated simulation from a validated :class:`RunConfig`.

Everything that can fail on bad input (data loading, partitioning, model building,
hyper-parameters) happens in :meth:`Simulation.from_config`, before any file is written.
:meth:`Simulation.run` then trains round by round, appends one metrics row per round,
checkpoints every ``checkpoint.every`` rounds and resumes bit-for-bit from a checkpoint:
all randomness is drawn from streams derived from ``(seed, purpose, round, client)``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from ..algorithms import ALGORITHMS, Algorithm, ClientTask, RunContext
from ..errors import ConfigError
from ..config import RunConfig
from .dataset import build_dataset
from ..data.federated import FederatedDataset
from ..models import build_model
from ..params import Params
from ..privacy.randomness import SECURE
from .callbacks import Callback
from .client_store import ClientStateStore, MemoryClientStore, make_client_store
from .executor import make_executor
from ..training.local import LocalTrainer, task_loss
from .privacy_plan import RunPrivacy
from .report import PARTITION_FILE, write_report
from .round_metrics import RoundEvaluator
from .run_dir import (
    CLIENT_METRICS_FILE, CLIENT_STATES_DIR, SUMMARY_FILE, RunDirectory, RunDirError, config_fingerprint,
)
from .sampling import client_schedule, secure_cohort
from ..seeding import derive_seed, torch_generator
from .summary import build_summary


def auto_model_name(data: FederatedDataset) -> str:
    """``model.name = "auto"``: LeNet for images, char-LSTM for token sequences, an MLP
    for tabular classification and a linear model for tabular regression."""
    if len(data.input_shape) == 3:
        return "lenet"
    if not data.test.x.is_floating_point():
        return "char_lstm"
    return "mlp" if data.task == "classification" else "linear"


def initial_params(model: nn.Module) -> Params:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


@dataclass
class Simulation:
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

    def __post_init__(self) -> None:
        if self.executor is None:
            self.executor = make_executor(self.config.executor, self.config.ray)

    @classmethod
    def from_config(cls, config: RunConfig, callbacks: Sequence[Callback] = ()) -> "Simulation":
        """Load data, build the model and the algorithm; raises before anything is written."""
        data = build_dataset(config.data, config.seed)
        model_name = auto_model_name(data) if config.model.name == "auto" else config.model.name
        with torch.random.fork_rng():
            torch.manual_seed(derive_seed(config.seed, "init"))
            try:
                model = build_model(model_name, data.input_shape, data.num_classes, **config.model.options)
            except (ValueError, TypeError) as err:
                raise ConfigError(f"model: {err}") from None
        try:
            loss_fn = task_loss(data.task, config.client.loss)
        except ValueError as err:
            raise ConfigError(f"client.loss: {err}") from None
        trainer = LocalTrainer(model, loss_fn, config.client, config.federation.rounds)
        alg_cls = ALGORITHMS.get(config.algorithm.name)
        ctx = RunContext(model=model, trainer=trainer, data=data, seed=config.seed, rounds=config.federation.rounds)
        algorithm = alg_cls(config.algorithm.typed_params(), ctx)
        fed = config.federation
        schedule = client_schedule(data.num_clients, fed.clients_per_round, fed.rounds, fed.sampling, config.seed)
        privacy = RunPrivacy.from_config(
            config.privacy, data, trainer, model, algorithm, schedule, fed.sampling, fed.clients_per_round
        )
        return cls(config, data, model, model_name, initial_params(model), algorithm, trainer, schedule, privacy, list(callbacks))

    # ------------------------------------------------------------------ state
    def fresh_state(self, clients: ClientStateStore | None = None) -> dict[str, Any]:
        """Round-0 state; client states go to ``clients`` (default: an empty in-memory store)."""
        clients = MemoryClientStore() if clients is None else clients
        return {"round": 0, "server": self.algorithm.init_server(self.init), "clients": clients, "elapsed_s": 0.0}

    def client_state(self, state: dict[str, Any], cid: int):
        stored = state["clients"].get(cid)
        return self.algorithm.init_client(cid, state["server"]) if stored is None else stored

    def client_store(self, run_dir: RunDirectory, checkpoint: dict[str, Any] | None) -> ClientStateStore:
        """The configured store of ``run_dir``'s client states, as of ``checkpoint`` (None: no state yet)."""
        store = make_client_store(self.config.federation.client_state, run_dir.file(CLIENT_STATES_DIR))
        if checkpoint is None:
            store.restore({}, 0)  # a run killed before its first checkpoint may have left states
        else:
            store.restore(checkpoint["clients"], checkpoint["round"])
        return store

    def task(self, cid: int, round_idx: int) -> ClientTask:
        return ClientTask(
            client_id=cid,
            round=round_idx,
            data=self.data.clients[cid],
            generator=torch_generator(self.config.seed, "train", round_idx, cid),
            trainer=self.trainer,
            dp=None if self.privacy is None else self.privacy.task_dp(cid, round_idx),
            privacy_budget=None if self.privacy is None else self.privacy.budget_of(cid),
        )

    # ------------------------------------------------------------------- loop
    @property
    def secure_cohorts(self) -> bool:
        """Client-level DP with ``secure_rng``: the accountant's client sampling is drawn from the
        secure source each round instead of the seeded schedule."""
        return self.privacy is not None and self.privacy.server is not None and self.config.privacy.secure_rng

    def cohort(self, round_idx: int) -> list[int]:
        fed = self.config.federation
        if self.secure_cohorts:
            drawn = secure_cohort(self.data.num_clients, fed.clients_per_round, fed.sampling)
        else:
            drawn = self.schedule[round_idx]
        return [int(c) for c in drawn]

    def train_round(self, state: dict[str, Any], round_idx: int) -> dict[str, Any]:
        """Run round ``round_idx`` (0-based) in place on ``state``; return its training stats.
        Raises :class:`~fedveil.privacy.ledger_check.PrivacyCheckError` (nothing of the round
        kept) if a ledger spent more than the privacy plan calibrated through this round."""
        cohort = self.cohort(round_idx)
        jobs = [(self.task(cid, round_idx), self.client_state(state, cid)) for cid in cohort]
        results = self.executor.run_cohort(self.algorithm, state["server"], jobs)
        for cid, result in zip(cohort, results):
            if result.state is not None:
                state["clients"].put(cid, result.state, round_idx + 1)
        for (task, _), result in zip(jobs, results):
            if task.dp is not None:
                self.privacy.record_client(task.client_id, task.data.num_train, task.dp)
            if result.releases:
                if self.privacy is None:
                    raise RuntimeError(f"{type(self.algorithm).__name__} returned noisy releases in a run without privacy")
                self.privacy.record_releases(task.client_id, result.releases)
        messages = [(c, r.message) for c, r in zip(cohort, results)]
        facts = {}
        if self.privacy is not None and self.privacy.server is not None:
            server, facts = self._client_level_update(state["server"], messages, round_idx)
        else:
            server = self.algorithm.aggregate(state["server"], messages, round_idx)
        if self.privacy is not None:
            self.privacy.check_round(round_idx, cohort)
        state["server"], state["round"] = server, round_idx + 1
        losses = [r.stats.loss for r in results if r.stats is not None and not np.isnan(r.stats.loss)]
        row: dict[str, Any] = {"round": round_idx + 1, "cohort_size": len(cohort), "lr": self.trainer.lr_at(round_idx)}
        if losses:
            row["train_loss"] = float(np.mean(losses))
        if self.privacy is not None:
            row.update(facts)
            row.update(self.privacy.metrics())
        extra: dict[str, list[float]] = {}
        for r in results:
            for key, value in r.extra_metrics.items():
                extra.setdefault(key, []).append(value)
        # average the clients' extra metrics only: epsilon_per_client is a list and stays one
        row.update({k: float(np.mean(v)) for k, v in extra.items()})
        return row

    def _client_level_update(self, server_state, messages, round_idx: int):
        """DP-FedAvg: the server sees only the clipped, noised, uniform mean of the updates."""
        template = self.algorithm.global_params(server_state)
        generator = SECURE if self.config.privacy.secure_rng else torch_generator(self.config.seed, "client-dp", round_idx)
        mean, facts = self.privacy.private_mean_update([m["delta"] for _, m in messages], template, generator, round_idx)
        return self.algorithm.server_update(server_state, mean), facts

    def evaluator(self) -> RoundEvaluator:
        ev = self.config.eval
        return RoundEvaluator(self.algorithm, self.data, self.trainer, self.config.seed, ev.batch_size, ev.personal)

    def run(self, out: str | Path, resume: bool = False) -> dict[str, Any]:
        """Train all rounds, writing into run directory ``out``; returns the summary."""
        config_dict = self.config.model_dump(mode="json")
        run_dir = RunDirectory.open_for_resume(out, config_dict) if resume else RunDirectory.create(out, config_dict)
        checkpoint = run_dir.load_checkpoint() if resume else None
        if checkpoint is not None and checkpoint.get("fingerprint") != config_fingerprint(config_dict):
            raise RunDirError(f"checkpoint in '{out}' belongs to another config; start a new run")
        clients = self.client_store(run_dir, checkpoint)
        state = self.fresh_state(clients) if checkpoint is None else {**checkpoint, "clients": clients}
        if self.privacy is not None and "privacy" in state:
            self.privacy.load_state_dict(state["privacy"], self.schedule, state["round"])
        run_dir.write_json(PARTITION_FILE, self.partition_facts())
        rows = run_dir.keep_metrics_through(state["round"])
        return self._loop(run_dir, state, rows, config_dict)

    def _loop(self, run_dir: RunDirectory, state: dict[str, Any], rows: list[dict], config_dict: dict) -> dict[str, Any]:
        rounds, every = self.config.federation.rounds, self.config.checkpoint.every
        evaluator, client_rows = self.evaluator(), None
        for cb in self.callbacks:
            cb.on_run_start(rounds, state["round"])
        started = time.perf_counter() - state["elapsed_s"]
        for r in range(state["round"], rounds):
            row = self.train_round(state, r)
            last = r + 1 == rounds
            if (r + 1) % self.config.eval.every == 0 or last:
                metrics, client_rows = evaluator(state["server"], state["clients"], r)
                row.update(metrics)
            state["elapsed_s"] = row["elapsed_s"] = time.perf_counter() - started
            run_dir.append_metrics(row)
            rows.append(row)
            for cb in self.callbacks:
                cb.on_round_end(row)
            if last or (every and (r + 1) % every == 0):
                self._save_checkpoint(run_dir, state, config_dict)
        if client_rows is None:  # resumed a finished run: score the final state again
            _, client_rows = evaluator(state["server"], state["clients"], rounds - 1)
        privacy_facts = self.privacy.summary() if self.privacy is not None else {}
        summary = build_summary(self.config, self.model_name, self.data, privacy_facts, rows, state["elapsed_s"])
        run_dir.write_json(CLIENT_METRICS_FILE, client_rows)
        run_dir.write_json(SUMMARY_FILE, summary)
        write_report(run_dir.path)
        for cb in self.callbacks:
            cb.on_run_end(summary)
        return summary

    def _save_checkpoint(self, run_dir: RunDirectory, state: dict[str, Any], config_dict: dict) -> None:
        """Write the checkpoint (the client store gives what it needs saved), then let the
        store drop client-state versions only older checkpoints needed."""
        clients = state["clients"]
        extra = {"clients": clients.to_checkpoint(), **self._privacy_state(), "fingerprint": config_fingerprint(config_dict)}
        run_dir.save_checkpoint({**state, **extra})
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
        if self.data.task == "classification":
            facts["label_counts"] = self.data.label_counts().tolist()
        return facts
