"""The privacy side of a run: plan the noise before training, record every release.

The client schedule is generated from the seed before round 1, so the number of noisy
steps each client (example level) or the population (client level) will take is known
in advance. The plan calibrates the noise to spend the budget exactly by the last
round, or, with a fixed ``noise_multiplier``, refuses to start when the plan would spend
more than the configured ``epsilon``. During the run every release is recorded in a
:class:`PrivacyLedger` with the sampling scheme actually used, and the epsilon spent so
far goes into every metrics row.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from ..algorithms.base import Algorithm
from ..config import ConfigError, PrivacyConfig
from ..data.federated import FederatedDataset
from ..params import Params
from ..privacy.accounting import PrivacyLedger, calibrate_noise, epsilon
from ..privacy.client_dp import ClientLevelDP, update_noise_multiplier
from ..privacy.dp_sgd import ExampleDP, check_model_for_dp
from .local import LocalTrainer

POPULATION = PrivacyLedger.POPULATION
PER_CLIENT_METRICS_LIMIT = 100  # metrics rows list per-client epsilons up to this many clients


@dataclass(frozen=True)
class ClientPlan:
    """One client's planned DP-SGD: batch size, sampling rate, steps, noise, epsilon."""

    batch_size: int
    sample_rate: float
    steps_per_round: int
    total_steps: int  # accounted steps over the whole run
    noise_multiplier: float
    planned_epsilon: float
    budget: float | None


@dataclass
class RunPrivacy:
    config: PrivacyConfig
    ledger: PrivacyLedger
    num_clients: int
    clients: dict[int, ClientPlan] = field(default_factory=dict)  # example level
    server: ClientLevelDP | None = None  # client level
    population_rate: float = 0.0
    population_sampling: str = "poisson"
    planned_epsilon: float = 0.0

    # ------------------------------------------------------------------ plan
    @classmethod
    def from_config(
        cls, cfg: PrivacyConfig, data: FederatedDataset, trainer: LocalTrainer, model: nn.Module,
        algorithm: Algorithm, schedule: list[np.ndarray], fed_sampling: str, clients_per_round: int,
    ) -> "RunPrivacy | None":
        """Plan the run's privacy; raises :class:`ConfigError` for anything unaccountable."""
        if cfg.level == "none":
            return None
        run = cls(cfg, PrivacyLedger(cfg.accountant), data.num_clients)
        if cfg.level == "example":
            run._plan_example_level(data, trainer, model, algorithm, schedule)
        else:
            run._plan_client_level(algorithm, len(schedule), fed_sampling, clients_per_round, data.num_clients)
        return run

    def _plan_example_level(self, data, trainer, model, algorithm, schedule) -> None:
        cfg = self.config
        name = type(algorithm).__name__
        if not algorithm.supports_example_dp:
            raise ConfigError(f"privacy.level: algorithm {name} does not support example-level DP")
        try:
            check_model_for_dp(model)
        except ValueError as err:
            raise ConfigError(f"privacy.level: {err}") from None
        participations = np.zeros(data.num_clients, dtype=int)
        for cohort in schedule:
            participations[np.asarray(cohort, dtype=int)] += 1
        for cid, client in enumerate(data.clients):
            n = client.num_train
            batch = n if trainer.config.batch_size == 0 else min(trainer.config.batch_size, n)
            probe = ExampleDP(cfg.clip, 1.0, cfg.batch_sampling, batch)
            steps_round = trainer.num_steps(n, probe)
            if steps_round == 0:
                raise ConfigError(f"privacy.batch_sampling: client {cid} has {n} rows, fewer than one batch")
            if cfg.batch_sampling == "shuffle":  # every round starts a new permutation: whole epochs
                per_epoch = n // batch
                steps_round_accounted = math.ceil(steps_round / per_epoch) * per_epoch
            else:
                steps_round_accounted = steps_round
            total = int(participations[cid]) * steps_round_accounted
            budget = cfg.client_epsilons[cid] if cfg.client_epsilons is not None else cfg.epsilon
            z, planned = self._noise_for(budget, batch / n, total, n, f"client {cid}")
            self.clients[cid] = ClientPlan(batch, batch / n, steps_round, total, z, planned, budget)

    def _plan_client_level(self, algorithm, rounds: int, sampling: str, cohort: int, num_clients: int) -> None:
        cfg = self.config
        if not algorithm.supports_client_dp:
            raise ConfigError(
                f"privacy.level: client-level DP needs an algorithm whose message is only a model update "
                f"(fedavg, fedprox, fedavgm, fedadam, fedyogi); {type(algorithm).__name__} sends more"
            )
        self.population_rate = cohort / num_clients
        self.population_sampling = "poisson" if sampling == "poisson" else "fixed"
        z, self.planned_epsilon = self._noise_for(cfg.epsilon, self.population_rate, rounds, num_clients, "the population")
        count_noise = cfg.clip_count_noise if cfg.clip_count_noise is not None else cohort / 20
        self.server = ClientLevelDP(
            noise_multiplier=z, clip=cfg.clip, expected_cohort=float(cohort), adaptive=cfg.adaptive_clip,
            target_quantile=cfg.target_quantile, clip_lr=cfg.clip_lr, count_noise_std=count_noise,
        )
        if cfg.adaptive_clip:
            try:
                update_noise_multiplier(z, count_noise)
            except ValueError as err:
                raise ConfigError(f"privacy: {err}") from None

    def _sampling_args(self, population: int) -> dict[str, Any]:
        """The sampling scheme in use, as the accountant and the ledger take it."""
        sampling = self.config.batch_sampling if self.config.level == "example" else self.population_sampling
        args: dict[str, Any] = {"sampling": sampling}
        if sampling in ("fixed", "shuffle"):
            args["population_size"] = population
        return args

    def _noise_for(self, budget: float | None, rate: float, steps: int, population: int, who: str) -> tuple[float, float]:
        """Noise multiplier and planned epsilon for ``steps`` releases at sampling ``rate``."""
        cfg = self.config
        args = {**self._sampling_args(population), "accountant": cfg.accountant}
        if steps == 0:
            return cfg.noise_multiplier or 1.0, 0.0
        try:
            if cfg.noise_multiplier is None:
                z = calibrate_noise(budget, cfg.delta, rate, steps, **args)
            else:
                z = cfg.noise_multiplier
            planned = epsilon(z, rate, steps, cfg.delta, **args)
        except ValueError as err:
            raise ConfigError(f"privacy: {who}: {err}") from None
        if budget is not None and planned > budget * (1 + 1e-9):
            raise ConfigError(
                f"privacy: the plan for {who} ({steps} noisy steps at sampling rate {rate:.4g}, "
                f"noise_multiplier={z:.4g}) spends epsilon={planned:.4g} > budget {budget:.4g}; "
                f"raise noise_multiplier, lower rounds/epochs, or drop noise_multiplier to calibrate it"
            )
        return z, planned

    # -------------------------------------------------------------- during the run
    def task_dp(self, cid: int) -> ExampleDP | None:
        plan = self.clients.get(cid)
        if plan is None:
            return None
        return ExampleDP(self.config.clip, plan.noise_multiplier, self.config.batch_sampling, plan.batch_size)

    def record_client(self, cid: int, n: int, dp: ExampleDP) -> None:
        """Account the DP-SGD steps client ``cid`` just took."""
        if dp.steps_taken == 0:
            return
        plan = self.clients[cid]
        self.ledger.record_gaussian_steps(
            cid, plan.noise_multiplier, plan.sample_rate, dp.steps_taken, **self._sampling_args(n)
        )

    def private_mean_update(self, updates: list[Params], template: Params, generator: torch.Generator) -> tuple[Params, dict]:
        """Client level: the clipped, noised, uniformly averaged update; accounts the round."""
        assert self.server is not None
        mean, facts = self.server.noisy_mean(updates, template, generator)
        self.ledger.record_gaussian_steps(
            POPULATION, self.server.noise_multiplier, self.population_rate, 1, **self._sampling_args(self.num_clients)
        )
        return mean, facts

    def spent(self) -> dict[Any, float]:
        return self.ledger.epsilons(self.config.delta)

    def metrics(self) -> dict[str, Any]:
        """``epsilon`` (the largest spent by any client, or the population's) and, for
        example level with few clients, ``epsilon_per_client``."""
        spent = self.spent()
        row: dict[str, Any] = {"epsilon": max(spent.values(), default=0.0)}
        if self.config.level == "example" and self.num_clients <= PER_CLIENT_METRICS_LIMIT:
            row["epsilon_per_client"] = [spent.get(c, 0.0) for c in range(self.num_clients)]
        return row

    def summary(self) -> dict[str, Any]:
        spent = self.spent()
        out: dict[str, Any] = {
            "privacy_level": self.config.level,
            "delta": self.config.delta,
            "epsilon": max(spent.values(), default=0.0),
        }
        if self.config.level == "example":
            out["epsilon_per_client"] = [spent.get(c, 0.0) for c in range(self.num_clients)]
            out["noise_multiplier_per_client"] = [self.clients[c].noise_multiplier for c in range(self.num_clients)]
            out["planned_epsilon_per_client"] = [self.clients[c].planned_epsilon for c in range(self.num_clients)]
        else:
            assert self.server is not None
            out["noise_multiplier"] = self.server.noise_multiplier
            out["planned_epsilon"] = self.planned_epsilon
            out["final_clip"] = self.server.clip
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"ledger": self.ledger.state_dict(), "server": None if self.server is None else self.server.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ledger = PrivacyLedger.from_state_dict(state["ledger"])
        if self.server is not None:
            self.server.load_state_dict(state["server"])
