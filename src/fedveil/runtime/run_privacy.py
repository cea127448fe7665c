"""The privacy side of a run while it trains: every release recorded, checked against the plan.

Every release is recorded in a :class:`PrivacyLedger` from what the mechanism actually did
(its noise, its sampling, one release per local training), the epsilon spent so far goes
into every metrics row, and after every round a
:class:`~fedveil.privacy.ledger_check.LedgerCheck` stops the run if any ledger has spent
more than the plan (:class:`~fedveil.runtime.privacy_plan.PrivacyPlan`) calibrated through
that round.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from ..algorithms.base import Algorithm
from ..config import PrivacyConfig
from ..params import Params
from ..privacy.client_dp import COUNT_SENSITIVITY, ClientLevelDP, update_noise_multiplier
from ..privacy.dp_sgd import ExampleDP
from ..privacy.ledger import PrivacyLedger
from ..privacy.ledger_check import LedgerCheck
from ..privacy.person_level import person_epsilon, person_summary
from ..privacy.randomness import NoiseSource, RandomSource
from ..training.local import LocalTrainer
from .privacy_plan import POPULATION, PrivacyPlan
from .secure_sum import Layout, SecureSumSettings, layout_of

PER_CLIENT_METRICS_LIMIT = 100  # metrics rows list per-client epsilons up to this many clients


@dataclass
class RunPrivacy:
    """The privacy of one run: its frozen :class:`PrivacyPlan`, the ledger every release is
    recorded in, the check of that ledger against the plan after every round, and the
    server's DP-FedAvg mechanism (whose adaptive clip changes over the run). Build it with
    :meth:`from_config` (None for a run without privacy) or :meth:`start`."""

    plan: PrivacyPlan
    ledger: PrivacyLedger
    check: LedgerCheck
    noise: NoiseSource = field(default_factory=NoiseSource)  # the run's (algorithm context's) noise source
    server: ClientLevelDP | None = None  # client level, noised by the server
    released_rounds: list[int] = field(default_factory=list)  # distributed: the rounds whose sum was unmasked

    @classmethod
    def from_config(
        cls, cfg: PrivacyConfig, num_clients: int, train_sizes: Mapping[int, int], trainer: LocalTrainer,
        model: nn.Module, algorithm: Algorithm, schedule: list[np.ndarray], fed_sampling: str, clients_per_round: int,
        weighted_sampling: bool = False, secure: SecureSumSettings | None = None,
    ) -> "RunPrivacy | None":
        """Calibrate the plan (:meth:`PrivacyPlan.calibrate`, same arguments) and start
        recording against it; None when the run releases nothing."""
        plan = PrivacyPlan.calibrate(
            cfg, num_clients, train_sizes, trainer, model, algorithm, schedule, fed_sampling, clients_per_round,
            weighted_sampling, secure,
        )
        return None if plan is None else cls.start(plan, algorithm.ctx.noise)

    @classmethod
    def start(cls, plan: PrivacyPlan, noise: NoiseSource) -> "RunPrivacy":
        """An empty ledger for ``plan``, its setup releases expected; noise drawn from ``noise``."""
        ledger = PrivacyLedger(plan.config.accountant)
        server = None
        if plan.population is not None:
            cfg, population = plan.config, plan.population
            server = ClientLevelDP(
                noise_multiplier=population.noise_multiplier, clip=cfg.clip,
                expected_cohort=float(population.cohort), adaptive=cfg.adaptive_clip,
                target_quantile=cfg.target_quantile, clip_lr=cfg.clip_lr, count_noise_std=population.count_noise_std,
                sampling=population.sampling,
            )
        run = cls(plan, ledger, LedgerCheck(ledger, plan.config.delta, _describe), noise, server)
        run._expect_setup()
        return run

    @property
    def config(self) -> PrivacyConfig:
        """The run's ``[privacy]`` section."""
        return self.plan.config

    def _expect_setup(self) -> None:
        for cid, releases in self.plan.setup.items():
            self.check.expect(cid, releases)

    # -------------------------------------------------------------- recording
    def record_releases(self, cid: int, releases: list) -> None:
        """Account the algorithm's other releases about client ``cid``'s data (e.g. IFCA selections)."""
        for release in releases:
            self.ledger.record(cid, release)

    def task_dp(self, cid: int, round_idx: int) -> ExampleDP | None:
        """Client ``cid``'s DP-SGD settings for round ``round_idx`` (None without example-level DP)."""
        return self.plan.example_dp(cid, round_idx, self.noise)

    def record_client(self, cid: int, n: int, dp: ExampleDP, trainings: Sequence[int]) -> None:
        """Account the DP-SGD client ``cid`` just ran under ``dp``, as it ran: one release per
        local training (each shuffled training draws its own permutations) of the steps it
        took, ``trainings`` (``ClientResult.dp_trainings``), at the noise it used."""
        for steps in trainings:
            if steps:
                self.ledger.record_gaussian_steps(
                    cid, dp.noise_multiplier, dp.batch_size / n, steps, self.plan.sampling(n, dp.sampling)
                )

    def private_mean_update(
        self, updates: list[Params], template: Params, generator: RandomSource, round_idx: int
    ) -> tuple[Params, dict]:
        """Client level: the clipped, noised, uniformly averaged update; accounts the round
        from the noise the mechanism reports it added (update and, if adaptive, clip count)."""
        assert self.server is not None and self.plan.population is not None
        self.server.noise_multiplier = self.plan.population.noise_multiplier * float(self.plan.shape[round_idx])
        mean, released = self.server.noisy_mean(updates, template, generator)
        self.ledger.record_gaussian_steps(
            POPULATION, released["noise_multiplier"], self.plan.population.sample_rate, 1,
            self.plan.sampling(self.plan.num_clients),
        )
        facts = {"clip": released["clip"]}
        if self.plan.scheduled:
            facts["noise_multiplier"] = self.server.noise_multiplier
        return mean, facts

    def distributed_mean_update(
        self, updates: list[tuple[int, Params]], round_idx: int, cohort_size: int, seed: int,
    ) -> Params | None:
        """Distributed DP in a simulation: the noisy mean the server would unmask, accounted;
        None (and no release) below the threshold."""
        assert self.plan.distributed is not None
        total = self.plan.distributed.simulated_sum(updates, round_idx, cohort_size, seed, self.noise)
        if total is None:
            return None
        first = next(iter(updates[0][1].values()))
        return self.unmasked_mean(total, layout_of(updates[0][1]), round_idx, cohort_size, len(updates), first.dtype,
                                  first.device)

    def unmasked_mean(
        self, total: np.ndarray, layout: Layout, round_idx: int, cohort_size: int, survivors: int, dtype: torch.dtype,
        device: torch.device,
    ) -> Params:
        """The noisy mean update (``dtype`` on ``device``) from the sum unmasked in round
        ``round_idx``, a simulation's or a deployed server's; its release is accounted: the
        plan's release expected, the noise the ``survivors`` actually carried recorded."""
        distributed = self.plan.distributed
        assert distributed is not None
        mean = distributed.mechanism.decode(total, layout, dtype, device)
        share = distributed.share(round_idx, cohort_size)
        self.check.expect(POPULATION, [distributed.planned_release(round_idx)])
        self.ledger.record(POPULATION, distributed.mechanism.release(survivors, share))
        self.released_rounds.append(round_idx)
        return mean

    # --------------------------------------------------------------- checking
    def check_round(self, round_idx: int, cohort: list[int]) -> None:
        """After round ``round_idx``: raise :class:`~fedveil.privacy.ledger_check.PrivacyCheckError`
        if any ledger disagrees with what the plan calibrated through this round."""
        self._expect_round(round_idx, cohort)
        self.check.check()

    def _expect_round(self, round_idx: int, cohort: list[int]) -> None:
        for subject, releases in self.plan.planned_round(round_idx, cohort).items():
            self.check.expect(subject, releases)

    # -------------------------------------------------------------- reporting
    def spent(self) -> dict[Any, float]:
        """Epsilon spent so far, per ledger subject (each client, or the population)."""
        return self.ledger.epsilons(self.config.delta)

    def metrics(self) -> dict[str, Any]:
        """``epsilon`` (the largest spent by any client, or the population's) and, for
        example level with few clients, ``epsilon_per_client``."""
        spent = self.spent()
        row: dict[str, Any] = {"epsilon": max(spent.values(), default=0.0)}
        if self.config.level != "client" and self.plan.num_clients <= PER_CLIENT_METRICS_LIMIT:
            row["epsilon_per_client"] = [spent.get(c, 0.0) for c in range(self.plan.num_clients)]
        return row

    def summary(self) -> dict[str, Any]:
        """The run summary's privacy facts: level, delta, epsilon spent and what was planned."""
        plan, cfg, spent = self.plan, self.config, self.spent()
        out: dict[str, Any] = {
            "privacy_level": cfg.level,
            "delta": cfg.delta,
            "epsilon": max(spent.values(), default=0.0),
            "secure_rng": cfg.secure_rng,
        }
        if cfg.level != "client":
            out["epsilon_per_client"] = [spent.get(c, 0.0) for c in range(plan.num_clients)]
        if plan.setup:
            out["setup_releases"] = sorted({r.label or "setup" for releases in plan.setup.values() for r in releases})
        if cfg.level == "example":
            out["noise_multiplier_per_client"] = [plan.clients[c].noise_multiplier for c in range(plan.num_clients)]
            out["planned_epsilon_per_client"] = [plan.clients[c].planned_epsilon for c in range(plan.num_clients)]
        elif plan.distributed is not None:
            dd = plan.distributed.mechanism
            out["noise_multiplier"] = plan.population_noise
            out["planned_epsilon"] = plan.planned_epsilon
            out["distributed_dp"] = {
                "mechanism": "skellam", "bits": dd.bits, "colluders": dd.colluders, "l2_sensitivity": dd.l2_sensitivity,
                "l1_sensitivity": dd.l1_sensitivity, "rounds_released": len(self.released_rounds),
            }
        elif cfg.level == "client":
            assert self.server is not None and plan.population is not None
            out["noise_multiplier"] = plan.population_noise
            out["planned_epsilon"] = plan.planned_epsilon
            out["final_clip"] = self.server.clip
            if self.server.adaptive:
                out["update_noise_multiplier"] = update_noise_multiplier(plan.population_noise, self.server.count_noise_std)
                out["clip_count_noise"] = self.server.count_noise_std
                out["clip_count_sensitivity"] = COUNT_SENSITIVITY[plan.population.sampling]
        if plan.scheduled:
            out["noise_schedule"] = cfg.noise_schedule.name
            out["noise_shape"] = plan.shape.tolist()
        out.update(self._person_level_summary())
        return out

    def _person_level_summary(self) -> dict[str, Any]:
        """Person-level epsilon, and how it was accounted, when a person may own
        ``records_per_person`` > 1 records (:mod:`fedveil.privacy.person_level`)."""
        k = self.config.records_per_person
        if k == 1:
            return {}
        per_subject = {s: person_epsilon(self.ledger, s, k, self.config.delta) for s in self.ledger.subjects}
        out = person_summary(k, per_subject)
        if self.config.level != "client":
            out["person_epsilon_per_client"] = [
                per_subject[c].epsilon if c in per_subject else 0.0 for c in range(self.plan.num_clients)
            ]
        return out

    # ------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps: the ledger, the adaptive clip, the rounds whose sum was unmasked."""
        return {
            "ledger": self.ledger.state_dict(), "server": None if self.server is None else self.server.state_dict(),
            "released_rounds": list(self.released_rounds),
        }

    def load_state_dict(self, state: dict[str, Any], schedule: list[np.ndarray], rounds_done: int) -> None:
        """Restore the ledger (and adaptive clip) of a checkpoint after ``rounds_done`` rounds,
        and check the restored ledger against the plan of those rounds."""
        self.ledger = PrivacyLedger.from_state_dict(state["ledger"])
        if self.server is not None:
            self.server.load_state_dict(state["server"])
        self.check = LedgerCheck(self.ledger, self.config.delta, _describe)
        self._expect_setup()
        for r in range(rounds_done):
            self._expect_round(r, [int(c) for c in schedule[r]])
        self.released_rounds = [int(r) for r in state.get("released_rounds", [])]
        if self.plan.distributed is not None:
            for r in self.released_rounds:
                self.check.expect(POPULATION, [self.plan.distributed.planned_release(r)])
        self.check.check()


def _describe(subject) -> str:
    return "the client population" if subject == POPULATION else f"client {subject}"
