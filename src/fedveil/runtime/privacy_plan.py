"""The privacy side of a run: plan the noise before training, record every release.

The client schedule is generated from the seed before round 1, so the number of noisy
steps each client (example level) or the population (client level) will take is known
in advance. The plan calibrates the noise to spend the budget exactly by the last
round, or, with a fixed ``noise_multiplier``, refuses to start when the plan would spend
more than the configured ``epsilon``. A ``noise_schedule`` (chapter 2) shapes the noise
multiplier over rounds: round ``r`` uses ``z * shape[r]`` (``min(shape) = 1``), and ``z``
is calibrated with the accountant composing the rounds' different Gaussians.

During the run every release is recorded in a :class:`PrivacyLedger` from what the
mechanism actually did (its noise, its sampling, one release per local training), the
epsilon spent so far goes into every metrics row, and after every round a
:class:`~fedveil.privacy.ledger_check.LedgerCheck` stops the run if any ledger has spent
more than the plan calibrated through that round.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from ..algorithms.base import Algorithm
from ..errors import ConfigError
from ..config import PrivacyConfig
from ..params import Params
from ..privacy.calibration import calibrate_noise, calibrate_noise_schedule
from ..privacy.composition import epsilon, schedule_epsilon
from ..privacy.events import Release, gaussian_steps_release
from ..privacy.ledger import PrivacyLedger
from ..privacy.client_dp import COUNT_SENSITIVITY, ClientLevelDP, update_noise_multiplier
from ..privacy.dp_sgd import ExampleDP, check_model_for_dp
from ..privacy.ledger_check import LedgerCheck
from ..privacy.person_level import person_epsilon, person_summary
from ..privacy.randomness import NoiseSource, RandomSource
from ..privacy.schedules import quantise_shape
from ..training.local import LocalTrainer
from .distributed_plan import DistributedPlan
from .secure_sum import Layout, SecureSumSettings, layout_of

POPULATION = PrivacyLedger.POPULATION
PER_CLIENT_METRICS_LIMIT = 100  # metrics rows list per-client epsilons up to this many clients
SCHEDULE_LEVELS = 8  # distinct noise multipliers a schedule is quantised to (accounting cost is per level)
SCHEDULE_RTOL = 1e-3  # calibration tolerance of a scheduled noise scale


@dataclass(frozen=True)
class ClientPlan:
    """One client's planned DP-SGD: batch size, sampling rate, steps, noise, epsilon."""

    num_train: int
    batch_size: int
    sample_rate: float
    steps_per_training: int  # steps of one local training
    trainings_per_round: int  # local trainings per round it takes part in (Ditto: 2)
    rounds: tuple[int, ...]  # the rounds it takes part in
    total_steps: int  # accounted steps over the whole run (whole epochs when shuffled)
    noise_multiplier: float  # at shape 1 (every round without a noise schedule)
    planned_epsilon: float
    budget: float | None


@dataclass
class RunPrivacy:
    """The privacy of one run (module docstring): the plan made before round 1 (each client's
    DP-SGD at example level; the population's noise at client level, by the server or, under
    secure aggregation, shared by the silos) and, during the run, the ledger every release is
    recorded in and the check of it against the plan after every round. Build it with
    :meth:`from_config`; it is None for a run without privacy."""

    config: PrivacyConfig
    ledger: PrivacyLedger
    num_clients: int
    shape: np.ndarray  # noise multiplier of round r is z * shape[r]; all ones without a schedule
    clients: dict[int, ClientPlan] = field(default_factory=dict)  # example level
    server: ClientLevelDP | None = None  # client level, noised by the server
    distributed: DistributedPlan | None = None  # client level under secure aggregation, noised by the silos
    released_rounds: list[int] = field(default_factory=list)  # distributed: the rounds whose sum was unmasked
    population_noise: float = 0.0  # client level: z at shape 1
    population_rate: float = 0.0
    population_sampling: str = "poisson"
    planned_epsilon: float = 0.0
    extras: dict[int, dict[int, list[Release]]] = field(default_factory=dict)  # client -> round -> other releases
    setup: dict[int, list[Release]] = field(default_factory=dict)  # client -> releases of the setup phase
    check: LedgerCheck | None = None
    noise: NoiseSource = field(default_factory=NoiseSource)  # the run's (algorithm context's) noise source

    # ------------------------------------------------------------------ plan
    @classmethod
    def from_config(
        cls, cfg: PrivacyConfig, num_clients: int, train_sizes: Mapping[int, int], trainer: LocalTrainer,
        model: nn.Module, algorithm: Algorithm, schedule: list[np.ndarray], fed_sampling: str, clients_per_round: int,
        weighted_sampling: bool = False, secure: SecureSumSettings | None = None,
    ) -> "RunPrivacy | None":
        """Plan the run's privacy; raises :class:`ConfigError` for anything unaccountable.
        ``train_sizes`` maps the clients to plan (all of them in a simulation, a deployed silo
        its own) to their training rows. At level "none" there is a plan only when the
        algorithm's setup releases data (FedFed's shared features): its ledger records and
        reports them, with no DP-SGD. Client level with ``secure`` (secure aggregation) is
        distributed DP: the silos share the noise (:mod:`fedveil.runtime.distributed_dp`)."""
        setup = {}
        if algorithm.has_setup:
            setup = {cid: algorithm.planned_setup_releases(cid, n) for cid, n in train_sizes.items()}
            setup = {cid: releases for cid, releases in setup.items() if releases}
        if cfg.level == "none" and not setup:
            return None
        shape = cfg.noise_schedule.shape(len(schedule))
        if cfg.noise_schedule.name != "constant":
            shape = quantise_shape(shape, SCHEDULE_LEVELS)
        run = cls(cfg, PrivacyLedger(cfg.accountant), num_clients, shape / shape.min(), setup=setup, noise=algorithm.ctx.noise)
        if cfg.level == "client" and setup:
            raise ConfigError(
                f"privacy.level: {type(algorithm).__name__} releases features of each client's records in its setup, "
                "which client-level DP does not account; use privacy.level = \"example\" or \"none\""
            )
        if cfg.level == "example":
            run._plan_example_level(train_sizes, trainer, model, algorithm, schedule)
        elif cfg.level == "client" and secure is not None:
            run._plan_distributed(algorithm, model, schedule, clients_per_round, secure)
        elif cfg.level == "client":
            run._plan_client_level(
                algorithm, len(schedule), fed_sampling, clients_per_round, num_clients, weighted_sampling
            )
        run._check_person_level()
        run.check = LedgerCheck(run.ledger, cfg.delta, run._describe)
        run._expect_setup()
        return run

    def _expect_setup(self) -> None:
        for cid, releases in self.setup.items():
            self.check.expect(cid, releases)

    def _check_person_level(self) -> None:
        k = self.config.records_per_person
        if k > 1 and self.config.level == "client" and self.population_sampling == "fixed":
            raise ConfigError(
                "privacy.records_per_person: fixed-size cohorts have no k-record accounting here; "
                "use federation.sampling = \"poisson\""
            )

    def _describe(self, subject) -> str:
        return "the client population" if subject == POPULATION else f"client {subject}"

    def _plan_example_level(self, train_sizes: Mapping[int, int], trainer, model, algorithm, schedule) -> None:
        cfg = self.config
        name = type(algorithm).__name__
        if not algorithm.supports_example_dp:
            raise ConfigError(
                f"privacy.level: algorithm {name} does not support example-level DP with these settings "
                "(its loss couples the examples of a batch, or it sends more than DP-SGD protects)"
            )
        try:
            check_model_for_dp(model)
        except ValueError as err:
            raise ConfigError(f"privacy.level: {err}") from None
        rounds_of: list[list[int]] = [[] for _ in range(self.num_clients)]
        for r, cohort in enumerate(schedule):
            for cid in np.asarray(cohort, dtype=int):
                rounds_of[cid].append(r)
        for cid, n in train_sizes.items():
            batch = n if trainer.config.batch_size == 0 else min(trainer.config.batch_size, n)
            probe = ExampleDP(cfg.clip, 1.0, cfg.batch_sampling, batch)
            steps_round = trainer.num_steps(n, probe)
            if steps_round == 0:
                raise ConfigError(f"privacy.batch_sampling: client {cid} has {n} rows, fewer than one batch")
            if cfg.batch_sampling == "shuffle":  # every training starts a new permutation: whole epochs
                per_epoch = n // batch
                steps_round_accounted = math.ceil(steps_round / per_epoch) * per_epoch
            else:
                steps_round_accounted = steps_round
            steps_round_accounted *= algorithm.trainings_per_round
            total = len(rounds_of[cid]) * steps_round_accounted
            budget = cfg.client_epsilons[cid] if cfg.client_epsilons is not None else cfg.epsilon
            self.extras[cid] = algorithm.planned_releases(cid, n, budget, rounds_of[cid])
            extras = [release for releases in self.extras[cid].values() for release in releases]
            extras += self.setup.get(cid, [])
            z, planned = self._noise_for(
                budget, batch / n, steps_round_accounted, rounds_of[cid], n, f"client {cid}", extras
            )
            self.clients[cid] = ClientPlan(
                n, batch, batch / n, steps_round, algorithm.trainings_per_round, tuple(rounds_of[cid]), total, z, planned, budget
            )

    def _plan_client_level(
        self, algorithm, rounds: int, sampling: str, cohort: int, num_clients: int, weighted: bool = False
    ) -> None:
        cfg = self.config
        if not algorithm.supports_client_dp:
            raise ConfigError(
                f"privacy.level: client-level DP needs an algorithm whose message is only a model update "
                f"(fedavg, fedprox, fedavgm, fedadam, fedyogi); {type(algorithm).__name__} sends more"
            )
        if weighted:
            raise ConfigError(
                "federation.client_probabilities: client-level DP accounts uniform cohort sampling; "
                "drop the probabilities or use privacy.level = \"example\""
            )
        self.population_rate = cohort / num_clients
        self.population_sampling = "poisson" if sampling == "poisson" else "fixed"
        z, self.planned_epsilon = self._noise_for(cfg.epsilon, self.population_rate, 1, list(range(rounds)), num_clients, "the population")
        self.population_noise = z
        count_noise = cfg.clip_count_noise if cfg.clip_count_noise is not None else cohort / 20
        self.server = ClientLevelDP(
            noise_multiplier=z, clip=cfg.clip, expected_cohort=float(cohort), adaptive=cfg.adaptive_clip,
            target_quantile=cfg.target_quantile, clip_lr=cfg.clip_lr, count_noise_std=count_noise,
            sampling=self.population_sampling,
        )
        if cfg.adaptive_clip:
            try:  # every round: a noise schedule raises z above its shape-1 value in some rounds
                update_noise_multiplier(z * float(self.shape.max()), count_noise)
            except ValueError as err:
                raise ConfigError(f"privacy: {err}") from None

    def _plan_distributed(self, algorithm, model: nn.Module, schedule, cohort: int, secure: SecureSumSettings) -> None:
        """Distributed DP: the silos share the noise (:mod:`.distributed_plan`)."""
        if not algorithm.supports_client_dp:
            raise ConfigError(
                f"privacy.level: client-level DP needs an algorithm whose message is only a model update "
                f"(fedavg, fedprox, fedavgm, fedadam, fedyogi); {type(algorithm).__name__} sends more"
            )
        shape = self.shape[: len(schedule)]
        plan = DistributedPlan.calibrate(self.config, model, schedule, cohort, secure, shape, self.ledger.orders)
        self.distributed, self.planned_epsilon = plan, plan.planned_epsilon
        self.population_noise = plan.noise_multipliers[0] / float(shape[0])

    def distributed_mean_update(
        self, updates: list[tuple[int, Params]], round_idx: int, cohort_size: int, seed: int,
    ) -> Params | None:
        """Distributed DP in a simulation: the noisy mean the server would unmask, accounted;
        None (and no release) below the threshold."""
        assert self.distributed is not None
        total = self.distributed.simulated_sum(updates, round_idx, cohort_size, seed, self.noise)
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
        assert self.distributed is not None
        mean = self.distributed.mechanism.decode(total, layout, dtype, device)
        share = self.distributed.share(round_idx, cohort_size)
        self.check.expect(POPULATION, [self.distributed.planned_release(round_idx)])
        self.ledger.record(POPULATION, self.distributed.mechanism.release(survivors, share))
        self.released_rounds.append(round_idx)
        return mean

    def _sampling_args(self, population: int, sampling: str | None = None) -> dict[str, Any]:
        """A sampling scheme (default: the configured one) as the accountant and the ledger take it."""
        if sampling is None:
            sampling = self.config.batch_sampling if self.config.level == "example" else self.population_sampling
        args: dict[str, Any] = {"sampling": sampling}
        if sampling in ("fixed", "shuffle"):
            args["population_size"] = population
        return args

    def _noise_for(
        self, budget: float | None, rate: float, steps_per_round: int, rounds: list[int], population: int, who: str,
        extras: list | None = None,
    ) -> tuple[float, float]:
        """Noise multiplier (at shape 1) and planned epsilon for ``steps_per_round`` releases
        at sampling ``rate`` in each of ``rounds`` (plus the algorithm's ``extras``)."""
        cfg = self.config
        args = {**self._sampling_args(population), "accountant": cfg.accountant}
        steps = steps_per_round * len(rounds)
        if steps == 0:  # a client never sampled: only its extra releases, if any
            planned = self.ledger.epsilon_of(extras or [], cfg.delta)
            if budget is not None and planned > budget * (1 + 1e-9):
                raise ConfigError(f"privacy: {who}'s other releases alone spend epsilon={planned:.4g} > budget {budget:.4g}")
            return cfg.noise_multiplier or 1.0, planned
        try:
            if extras:
                return self._noise_with_extras(budget, rate, steps, population, who, extras, args)
            if cfg.noise_schedule.name != "constant":
                shape = self.shape[rounds]
                zs = calibrate_noise_schedule(shape, budget, cfg.delta, rate, steps_per_round, rtol=SCHEDULE_RTOL, **args)
                z = float(zs[0] / shape[0])
                planned = schedule_epsilon(zs, rate, cfg.delta, steps_per_round, **args)
            else:
                z = cfg.noise_multiplier if cfg.noise_multiplier is not None else calibrate_noise(budget, cfg.delta, rate, steps, **args)
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

    def _noise_with_extras(self, budget, rate, steps, population, who, extras, args) -> tuple[float, float]:
        """Constant noise calibrated so that the DP-SGD steps and ``extras`` together spend ``budget``."""
        cfg = self.config
        if cfg.noise_schedule.name != "constant":
            raise ConfigError(f"privacy.noise_schedule: {who} makes releases besides DP-SGD steps; use a constant schedule")
        if cfg.noise_multiplier is not None:
            z = cfg.noise_multiplier
        elif budget is None:
            raise ConfigError(f"privacy: {who} needs privacy.epsilon to size its extra releases")
        else:
            z = calibrate_noise(budget, cfg.delta, rate, steps, extra_events=extras, **args)
        probe = PrivacyLedger(cfg.accountant)
        probe.record_gaussian_steps(who, z, rate, steps, **self._sampling_args(population))
        for release in extras:
            probe.record(who, release)
        planned = probe.epsilons(cfg.delta)[who]
        if budget is not None and planned > budget * (1 + 1e-9):
            raise ConfigError(
                f"privacy: the plan for {who} ({steps} noisy steps at noise_multiplier={z:.4g} plus "
                f"{sum(r.count for r in extras)} other releases) spends epsilon={planned:.4g} > budget {budget:.4g}"
            )
        return z, planned

    def budget_of(self, cid: int) -> float | None:
        """Client ``cid``'s epsilon target (example level), if one is set."""
        plan = self.clients.get(cid)
        return None if plan is None else plan.budget

    def record_releases(self, cid: int, releases: list) -> None:
        """Account the algorithm's other releases about client ``cid``'s data (e.g. IFCA selections)."""
        for release in releases:
            self.ledger.record(cid, release)

    # -------------------------------------------------------------- during the run
    def task_dp(self, cid: int, round_idx: int) -> ExampleDP | None:
        """Client ``cid``'s DP-SGD settings for round ``round_idx`` (None without example-level DP)."""
        plan = self.clients.get(cid)
        if plan is None:
            return None
        z = plan.noise_multiplier * float(self.shape[round_idx])
        return ExampleDP(self.config.clip, z, self.config.batch_sampling, plan.batch_size, noise=self.noise)

    def record_client(self, cid: int, n: int, dp: ExampleDP, trainings: Sequence[int]) -> None:
        """Account the DP-SGD client ``cid`` just ran under ``dp``, as it ran: one release per
        local training (each shuffled training draws its own permutations) of the steps it
        took, ``trainings`` (``ClientResult.dp_trainings``), at the noise it used."""
        for steps in trainings:
            if steps:
                self.ledger.record_gaussian_steps(
                    cid, dp.noise_multiplier, dp.batch_size / n, steps, **self._sampling_args(n, dp.sampling)
                )

    def private_mean_update(
        self, updates: list[Params], template: Params, generator: RandomSource, round_idx: int
    ) -> tuple[Params, dict]:
        """Client level: the clipped, noised, uniformly averaged update; accounts the round
        from the noise the mechanism reports it added (update and, if adaptive, clip count)."""
        assert self.server is not None
        self.server.noise_multiplier = self.population_noise * float(self.shape[round_idx])
        mean, released = self.server.noisy_mean(updates, template, generator)
        self.ledger.record_gaussian_steps(
            POPULATION, released["noise_multiplier"], self.population_rate, 1, **self._sampling_args(self.num_clients)
        )
        facts = {"clip": released["clip"]}
        if self.scheduled:
            facts["noise_multiplier"] = self.server.noise_multiplier
        return mean, facts

    def planned_round(self, round_idx: int, cohort: list[int]) -> dict[Any, list[Release]]:
        """The releases the plan calibrated for round ``round_idx``, per subject."""
        if self.config.level == "none":  # only the setup's releases, expected before round 0
            return {}
        if self.distributed is not None:  # expected as each round's sum is unmasked (unmasked_mean)
            return {}
        if self.config.level == "client":
            z = self.population_noise * float(self.shape[round_idx])
            args = self._sampling_args(self.num_clients)
            return {POPULATION: [gaussian_steps_release(z, self.population_rate, 1, **args)]}
        out = {}
        for cid in cohort:
            plan = self.clients[cid]
            z = plan.noise_multiplier * float(self.shape[round_idx])
            one = gaussian_steps_release(z, plan.sample_rate, plan.steps_per_training, **self._sampling_args(plan.num_train))
            out[cid] = [one] * plan.trainings_per_round + self.extras.get(cid, {}).get(round_idx, [])
        return out

    def check_round(self, round_idx: int, cohort: list[int]) -> None:
        """After round ``round_idx``: raise :class:`~fedveil.privacy.ledger_check.PrivacyCheckError`
        if any ledger disagrees with what the plan calibrated through this round."""
        self._expect_round(round_idx, cohort)
        self.check.check()

    def _expect_round(self, round_idx: int, cohort: list[int]) -> None:
        for subject, releases in self.planned_round(round_idx, cohort).items():
            self.check.expect(subject, releases)

    @property
    def scheduled(self) -> bool:
        """Whether a noise schedule shapes the noise over the rounds."""
        return self.config.noise_schedule.name != "constant"

    def spent(self) -> dict[Any, float]:
        """Epsilon spent so far, per ledger subject (each client, or the population)."""
        return self.ledger.epsilons(self.config.delta)

    def metrics(self) -> dict[str, Any]:
        """``epsilon`` (the largest spent by any client, or the population's) and, for
        example level with few clients, ``epsilon_per_client``."""
        spent = self.spent()
        row: dict[str, Any] = {"epsilon": max(spent.values(), default=0.0)}
        if self.config.level != "client" and self.num_clients <= PER_CLIENT_METRICS_LIMIT:
            row["epsilon_per_client"] = [spent.get(c, 0.0) for c in range(self.num_clients)]
        return row

    def summary(self) -> dict[str, Any]:
        """The run summary's privacy facts: level, delta, epsilon spent and what was planned."""
        spent = self.spent()
        out: dict[str, Any] = {
            "privacy_level": self.config.level,
            "delta": self.config.delta,
            "epsilon": max(spent.values(), default=0.0),
            "secure_rng": self.config.secure_rng,
        }
        if self.config.level != "client":
            out["epsilon_per_client"] = [spent.get(c, 0.0) for c in range(self.num_clients)]
        if self.setup:
            out["setup_releases"] = sorted({r.label or "setup" for releases in self.setup.values() for r in releases})
        if self.config.level == "example":
            out["noise_multiplier_per_client"] = [self.clients[c].noise_multiplier for c in range(self.num_clients)]
            out["planned_epsilon_per_client"] = [self.clients[c].planned_epsilon for c in range(self.num_clients)]
        elif self.distributed is not None:
            dd = self.distributed.mechanism
            out["noise_multiplier"] = self.population_noise
            out["planned_epsilon"] = self.planned_epsilon
            out["distributed_dp"] = {
                "mechanism": "skellam", "bits": dd.bits, "colluders": dd.colluders, "l2_sensitivity": dd.l2_sensitivity,
                "l1_sensitivity": dd.l1_sensitivity, "rounds_released": len(self.released_rounds),
            }
        elif self.config.level == "client":
            assert self.server is not None
            out["noise_multiplier"] = self.population_noise
            out["planned_epsilon"] = self.planned_epsilon
            out["final_clip"] = self.server.clip
            if self.server.adaptive:
                out["update_noise_multiplier"] = update_noise_multiplier(self.population_noise, self.server.count_noise_std)
                out["clip_count_noise"] = self.server.count_noise_std
                out["clip_count_sensitivity"] = COUNT_SENSITIVITY[self.population_sampling]
        if self.scheduled:
            out["noise_schedule"] = self.config.noise_schedule.name
            out["noise_shape"] = self.shape.tolist()
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
                per_subject[c].epsilon if c in per_subject else 0.0 for c in range(self.num_clients)
            ]
        return out

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
        self.check = LedgerCheck(self.ledger, self.config.delta, self._describe)
        self._expect_setup()
        for r in range(rounds_done):
            self._expect_round(r, [int(c) for c in schedule[r]])
        self.released_rounds = [int(r) for r in state.get("released_rounds", [])]
        if self.distributed is not None:
            for r in self.released_rounds:
                self.check.expect(POPULATION, [self.distributed.planned_release(r)])
        self.check.check()
