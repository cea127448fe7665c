"""A run's privacy plan, made before round 1: pure calibration, frozen, testable alone.

The client schedule is generated from the seed before round 1, so the number of noisy
steps each client (example level) or the population (client level) will take is known
in advance. The plan calibrates the noise to spend the budget exactly by the last
round, or, with a fixed ``noise_multiplier``, refuses to start when the plan would spend
more than the configured ``epsilon``. A ``noise_schedule`` (chapter 2) shapes the noise
multiplier over rounds: round ``r`` uses ``z * shape[r]`` (``min(shape) = 1``), and ``z``
is calibrated with the accountant composing the rounds' different Gaussians.

What happens during the run (the ledger, the check of it against this plan after every
round, the server's adaptive clip) is :class:`~fedveil.runtime.run_privacy.RunPrivacy`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
from torch import nn

from ..algorithms.base import Algorithm
from ..config import PrivacyConfig
from ..errors import ConfigError
from ..privacy.calibration import calibrate_noise, calibrate_noise_schedule
from ..privacy.client_dp import update_noise_multiplier
from ..privacy.composition import Accountant, epsilon, schedule_epsilon
from ..privacy.dp_sgd import ExampleDP, check_model_for_dp
from ..privacy.events import Release, gaussian_steps_release
from ..privacy.ledger import PrivacyLedger
from ..privacy.randomness import NoiseSource
from ..privacy.relations import Sampling
from ..privacy.schedules import quantise_shape
from ..training.local import LocalTrainer
from .distributed_plan import DistributedPlan
from .secure_sum import SecureSumSettings

POPULATION = PrivacyLedger.POPULATION
SCHEDULE_LEVELS = 8  # distinct noise multipliers a schedule is quantised to (accounting cost is per level)
SCHEDULE_RTOL = 1e-3  # calibration tolerance of a scheduled noise scale
CLIENT_LEVEL_ALGORITHMS = "fedavg, fedprox, fedavgm, fedadam, fedyogi"


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


@dataclass(frozen=True)
class PopulationPlan:
    """Client level noised by the server (DP-FedAvg): one Gaussian release per round about
    the population, at cohort sampling rate m / N."""

    noise_multiplier: float  # at shape 1
    cohort: int  # m, the expected cohort size
    sample_rate: float  # m / N
    sampling: str  # "poisson" or "fixed" (fixed-size cohorts)
    count_noise_std: float  # adaptive clipping's noise on the clipped count
    planned_epsilon: float


@dataclass(frozen=True)
class PrivacyPlan:
    """What the run will release and at what noise: each client's DP-SGD (example level),
    the population's Gaussian (client level) or the silos' shared Skellam noise (client level
    under secure aggregation), the algorithm's other releases and its setup's. Build it with
    :meth:`calibrate`."""

    config: PrivacyConfig
    num_clients: int
    shape: np.ndarray  # noise multiplier of round r is z * shape[r]; all ones without a schedule
    clients: Mapping[int, ClientPlan] = field(default_factory=dict)  # example level
    population: PopulationPlan | None = None  # client level, noised by the server
    distributed: DistributedPlan | None = None  # client level under secure aggregation, noised by the silos
    extras: Mapping[int, Mapping[int, list[Release]]] = field(default_factory=dict)  # client -> round -> releases
    setup: Mapping[int, list[Release]] = field(default_factory=dict)  # client -> releases of the setup phase

    @classmethod
    def calibrate(
        cls, cfg: PrivacyConfig, num_clients: int, train_sizes: Mapping[int, int], trainer: LocalTrainer,
        model: nn.Module, algorithm: Algorithm, schedule: list[np.ndarray], fed_sampling: str, clients_per_round: int,
        weighted_sampling: bool = False, secure: SecureSumSettings | None = None,
    ) -> "PrivacyPlan | None":
        """Plan the run's privacy; raises :class:`ConfigError` for anything unaccountable.
        ``train_sizes`` maps the clients to plan (all of them in a simulation, a deployed silo
        its own) to their training rows. At level "none" there is a plan only when the
        algorithm's setup releases data (FedFed's shared features), with no DP-SGD. Client
        level with ``secure`` (secure aggregation) is distributed DP: the silos share the
        noise (:mod:`fedveil.runtime.distributed_dp`)."""
        setup = {}
        if algorithm.has_setup:
            setup = {cid: algorithm.planned_setup_releases(cid, n) for cid, n in train_sizes.items()}
            setup = {cid: releases for cid, releases in setup.items() if releases}
        if cfg.level == "none" and not setup:
            return None
        if cfg.level == "client" and setup:
            raise ConfigError(
                f"privacy.level: {type(algorithm).__name__} releases features of each client's records in its setup, "
                "which client-level DP does not account; use privacy.level = \"example\" or \"none\""
            )
        shape = cfg.noise_schedule.shape(len(schedule))
        if cfg.noise_schedule.name != "constant":
            shape = quantise_shape(shape, SCHEDULE_LEVELS)
        plan = cls(cfg, num_clients, shape / shape.min(), setup=setup)
        if cfg.level == "example":
            clients, extras = plan._example_level(train_sizes, trainer, model, algorithm, schedule)
            plan = cls(cfg, num_clients, plan.shape, clients=clients, extras=extras, setup=setup)
        elif cfg.level == "client" and secure is not None:
            _client_level_algorithm(algorithm)
            distributed = DistributedPlan.calibrate(
                cfg, model, schedule, clients_per_round, secure, plan.shape[: len(schedule)],
                Accountant(cfg.accountant).orders,
            )
            plan = cls(cfg, num_clients, plan.shape, distributed=distributed)
        elif cfg.level == "client":
            population = plan._population(algorithm, len(schedule), fed_sampling, clients_per_round, weighted_sampling)
            plan = cls(cfg, num_clients, plan.shape, population=population)
        if cfg.records_per_person > 1 and plan.population is not None and plan.population.sampling == "fixed":
            raise ConfigError(
                "privacy.records_per_person: fixed-size cohorts have no k-record accounting here; "
                "use federation.sampling = \"poisson\""
            )
        return plan

    # ------------------------------------------------------------ calibration
    def _example_level(
        self, train_sizes: Mapping[int, int], trainer: LocalTrainer, model: nn.Module, algorithm: Algorithm,
        schedule: list[np.ndarray],
    ) -> tuple[dict[int, ClientPlan], dict[int, dict[int, list[Release]]]]:
        """Each client's DP-SGD calibrated to its budget over the rounds it is scheduled for."""
        cfg = self.config
        if not algorithm.supports_example_dp:
            raise ConfigError(
                f"privacy.level: algorithm {type(algorithm).__name__} does not support example-level DP with these "
                "settings (its loss couples the examples of a batch, or it sends more than DP-SGD protects)"
            )
        try:
            check_model_for_dp(model)
        except ValueError as err:
            raise ConfigError(f"privacy.level: {err}") from None
        rounds_of: list[list[int]] = [[] for _ in range(self.num_clients)]
        for r, cohort in enumerate(schedule):
            for cid in np.asarray(cohort, dtype=int):
                rounds_of[cid].append(r)
        clients, extras_of = {}, {}
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
            extras_of[cid] = algorithm.planned_releases(cid, n, budget, rounds_of[cid])
            extras = [release for releases in extras_of[cid].values() for release in releases]
            extras += self.setup.get(cid, [])
            z, planned = self._noise_for(
                budget, batch / n, steps_round_accounted, rounds_of[cid], n, f"client {cid}", extras
            )
            clients[cid] = ClientPlan(
                n, batch, batch / n, steps_round, algorithm.trainings_per_round, tuple(rounds_of[cid]), total, z, planned,
                budget,
            )
        return clients, extras_of

    def _population(
        self, algorithm: Algorithm, rounds: int, sampling: str, cohort: int, weighted: bool,
    ) -> PopulationPlan:
        """DP-FedAvg's Gaussian on the mean update, calibrated over the rounds at rate m / N."""
        cfg = self.config
        _client_level_algorithm(algorithm)
        if weighted:
            raise ConfigError(
                "federation.client_probabilities: client-level DP accounts uniform cohort sampling; "
                "drop the probabilities or use privacy.level = \"example\""
            )
        rate = cohort / self.num_clients
        sampling = "poisson" if sampling == "poisson" else "fixed"
        z, planned = self._noise_for(
            cfg.epsilon, rate, 1, list(range(rounds)), self.num_clients, "the population", scheme=sampling
        )
        count_noise = cfg.clip_count_noise if cfg.clip_count_noise is not None else cohort / 20
        if cfg.adaptive_clip:
            try:  # every round: a noise schedule raises z above its shape-1 value in some rounds
                update_noise_multiplier(z * float(self.shape.max()), count_noise)
            except ValueError as err:
                raise ConfigError(f"privacy: {err}") from None
        return PopulationPlan(z, cohort, rate, sampling, count_noise, planned)

    def _noise_for(
        self, budget: float | None, rate: float, steps_per_round: int, rounds: list[int], population: int, who: str,
        extras: list | None = None, scheme: str | None = None,
    ) -> tuple[float, float]:
        """Noise multiplier (at shape 1) and planned epsilon for ``steps_per_round`` releases
        at sampling ``rate`` in each of ``rounds`` (plus the algorithm's ``extras``)."""
        cfg = self.config
        sampling = self.sampling(population, scheme)
        steps = steps_per_round * len(rounds)
        if steps == 0:  # a client never sampled: only its extra releases, if any
            planned = PrivacyLedger(cfg.accountant).epsilon_of(extras or [], cfg.delta)
            if budget is not None and planned > budget * (1 + 1e-9):
                raise ConfigError(f"privacy: {who}'s other releases alone spend epsilon={planned:.4g} > budget {budget:.4g}")
            return cfg.noise_multiplier or 1.0, planned
        try:
            if extras:
                return self._noise_with_extras(budget, rate, steps, who, extras, sampling)
            if cfg.noise_schedule.name != "constant":
                shape = self.shape[rounds]
                zs = calibrate_noise_schedule(
                    shape, budget, cfg.delta, rate, steps_per_round, sampling, cfg.accountant, rtol=SCHEDULE_RTOL
                )
                z = float(zs[0] / shape[0])
                planned = schedule_epsilon(zs, rate, cfg.delta, steps_per_round, sampling, cfg.accountant)
            else:
                z = cfg.noise_multiplier
                if z is None:
                    z = calibrate_noise(budget, cfg.delta, rate, steps, sampling, cfg.accountant)
                planned = epsilon(z, rate, steps, cfg.delta, sampling, cfg.accountant)
        except ValueError as err:
            raise ConfigError(f"privacy: {who}: {err}") from None
        if budget is not None and planned > budget * (1 + 1e-9):
            raise ConfigError(
                f"privacy: the plan for {who} ({steps} noisy steps at sampling rate {rate:.4g}, "
                f"noise_multiplier={z:.4g}) spends epsilon={planned:.4g} > budget {budget:.4g}; "
                f"raise noise_multiplier, lower rounds/epochs, or drop noise_multiplier to calibrate it"
            )
        return z, planned

    def _noise_with_extras(self, budget, rate, steps, who, extras, sampling) -> tuple[float, float]:
        """Constant noise calibrated so that the DP-SGD steps (drawn by ``sampling``) and ``extras``
        together spend ``budget``."""
        cfg = self.config
        if cfg.noise_schedule.name != "constant":
            raise ConfigError(f"privacy.noise_schedule: {who} makes releases besides DP-SGD steps; use a constant schedule")
        if cfg.noise_multiplier is not None:
            z = cfg.noise_multiplier
        elif budget is None:
            raise ConfigError(f"privacy: {who} needs privacy.epsilon to size its extra releases")
        else:
            z = calibrate_noise(budget, cfg.delta, rate, steps, sampling, cfg.accountant, extra_events=extras)
        probe = PrivacyLedger(cfg.accountant)
        probe.record_gaussian_steps(who, z, rate, steps, sampling)
        for release in extras:
            probe.record(who, release)
        planned = probe.epsilons(cfg.delta)[who]
        if budget is not None and planned > budget * (1 + 1e-9):
            raise ConfigError(
                f"privacy: the plan for {who} ({steps} noisy steps at noise_multiplier={z:.4g} plus "
                f"{sum(r.count for r in extras)} other releases) spends epsilon={planned:.4g} > budget {budget:.4g}"
            )
        return z, planned

    # ---------------------------------------------------------------- queries
    def sampling(self, population: int, scheme: str | None = None) -> Sampling:
        """Sampling ``scheme`` (default: the configured one) from ``population`` examples or clients."""
        if scheme is None:
            if self.config.level == "example":
                scheme = self.config.batch_sampling
            else:
                scheme = self.population.sampling if self.population is not None else "poisson"
        return Sampling(scheme, population)

    @property
    def scheduled(self) -> bool:
        """Whether a noise schedule shapes the noise over the rounds."""
        return self.config.noise_schedule.name != "constant"

    @property
    def population_noise(self) -> float:
        """Client level: the population's noise multiplier at shape 1 (0 at example level)."""
        if self.distributed is not None:
            return self.distributed.noise_multipliers[0] / float(self.shape[0])
        return 0.0 if self.population is None else self.population.noise_multiplier

    @property
    def planned_epsilon(self) -> float:
        """Client level: the epsilon the plan spends by the last round (0 at example level)."""
        if self.distributed is not None:
            return self.distributed.planned_epsilon
        return 0.0 if self.population is None else self.population.planned_epsilon

    def budget_of(self, cid: int) -> float | None:
        """Client ``cid``'s epsilon target (example level), if one is set."""
        plan = self.clients.get(cid)
        return None if plan is None else plan.budget

    def example_dp(self, cid: int, round_idx: int, noise: NoiseSource) -> ExampleDP | None:
        """Client ``cid``'s DP-SGD settings for round ``round_idx``, drawing from ``noise``
        (None without example-level DP)."""
        plan = self.clients.get(cid)
        if plan is None:
            return None
        z = plan.noise_multiplier * float(self.shape[round_idx])
        return ExampleDP(self.config.clip, z, self.config.batch_sampling, plan.batch_size, noise=noise)

    def planned_round(self, round_idx: int, cohort: list[int]) -> dict[Any, list[Release]]:
        """The releases calibrated for round ``round_idx``, per subject (none for distributed
        DP: its release is expected as each round's sum is unmasked)."""
        if self.config.level == "none" or self.distributed is not None:
            return {}
        if self.population is not None:
            z = self.population.noise_multiplier * float(self.shape[round_idx])
            sampling = self.sampling(self.num_clients)
            return {POPULATION: [gaussian_steps_release(z, self.population.sample_rate, 1, sampling)]}
        out = {}
        for cid in cohort:
            plan = self.clients[cid]
            z = plan.noise_multiplier * float(self.shape[round_idx])
            one = gaussian_steps_release(z, plan.sample_rate, plan.steps_per_training, self.sampling(plan.num_train))
            out[cid] = [one] * plan.trainings_per_round + self.extras.get(cid, {}).get(round_idx, [])
        return out


def _client_level_algorithm(algorithm: Algorithm) -> None:
    if not algorithm.supports_client_dp:
        raise ConfigError(
            f"privacy.level: client-level DP needs an algorithm whose message is only a model update "
            f"({CLIENT_LEVEL_ALGORITHMS}); {type(algorithm).__name__} sends more"
        )
