"""Distributed DP's plan for one run: the Skellam variance every round's sum must carry,
calibrated to the budget before round 1, and each silo's share of it (the mechanism itself:
:mod:`fedveil.runtime.distributed_dp`).

No sampling amplification is claimed: the server picks and sees each cohort. A silo's share
is the round's variance over (threshold - colluders) silos, so every round that completes
carries at least the planned noise; a simulation, the deployed server and every silo compute
the same plan from the config, so a server cannot ask a silo for less noise.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import nn

from ..config import PrivacyConfig
from ..errors import ConfigError
from ..params import Params
from ..privacy.calibration import calibrate_skellam, skellam_releases
from ..privacy.composition import Accountant
from ..privacy.events import Release
from ..privacy.ledger import PrivacyLedger
from ..privacy.randomness import NoiseSource
from .distributed_dp import DistributedDP, DistributedDPError, silo_streams
from .secure_sum import SecureSumSettings, modular_sum


@dataclass(frozen=True)
class DistributedPlan:
    """The mechanism for the run's model size, the secure aggregation it shares the noise
    over, and per round the noise multiplier z_r of the summed Skellam noise (std / D2)."""

    mechanism: DistributedDP
    secure: SecureSumSettings
    noise_multipliers: tuple[float, ...]
    planned_epsilon: float

    @classmethod
    def calibrate(
        cls, cfg: PrivacyConfig, model: nn.Module, schedule: list[np.ndarray], cohort: int, secure: SecureSumSettings,
        shape: np.ndarray, orders: tuple[float, ...],
    ) -> "DistributedPlan":
        """The plan for ``cfg`` (epsilon or noise_multiplier, scaled by the noise schedule's
        ``shape`` per round); ConfigError, in one line, for what cannot run or be accounted."""
        if cfg.adaptive_clip:
            raise ConfigError(
                "privacy.adaptive_clip: under secure aggregation the clipped-count release would need distributed "
                "noise too, which is not built; use a fixed privacy.clip"
            )
        if cfg.accountant != "rdp":
            raise ConfigError("privacy.accountant: distributed DP's Skellam releases have an RDP bound only; use \"rdp\"")
        if cfg.records_per_person > 1:
            raise ConfigError("privacy.records_per_person: distributed DP has no person-level accounting yet; use 1")
        dimension = sum(t.numel() for t in (*model.parameters(), *model.buffers()))
        mechanism = DistributedDP(cfg.clip, secure.bits, dimension, float(cohort), secure.colluders)
        try:
            mechanism.check_bits()
        except DistributedDPError as err:
            raise ConfigError(str(err)) from None
        d2, d1 = mechanism.l2_sensitivity, mechanism.l1_sensitivity
        if cfg.noise_multiplier is not None:
            zs = cfg.noise_multiplier * shape
        else:
            try:
                zs = calibrate_skellam(shape, cfg.epsilon, cfg.delta, d2, d1, orders=orders)
            except ValueError as err:
                raise ConfigError(f"privacy: the population: {err}") from None
        planned = PrivacyLedger(Accountant("rdp", orders)).epsilon_of(skellam_releases(zs, d2, d1), cfg.delta)
        if cfg.epsilon is not None and planned > cfg.epsilon * (1 + 1e-9):
            raise ConfigError(
                f"privacy: the distributed plan ({len(zs)} rounds at noise_multiplier={zs[0]:.4g}) spends "
                f"epsilon={planned:.4g} > budget {cfg.epsilon:.4g}; raise noise_multiplier or drop it"
            )
        plan = cls(mechanism, secure, tuple(float(z) for z in zs), planned)
        try:
            for r, members in enumerate(schedule):
                if len(members) >= 2:
                    mechanism.check_room(len(members), plan.share(r, len(members)))
        except DistributedDPError as err:
            raise ConfigError(str(err)) from None
        return plan

    def variance(self, round_idx: int) -> float:
        """The Skellam variance round ``round_idx``'s sum must carry (integer units)."""
        return (self.noise_multipliers[round_idx] * self.mechanism.l2_sensitivity) ** 2

    def share(self, round_idx: int, cohort_size: int) -> float:
        """Each silo's Skellam variance in round ``round_idx`` of a cohort of ``cohort_size``."""
        return self.mechanism.share(self.variance(round_idx), self.secure.threshold(cohort_size))

    def planned_release(self, round_idx: int) -> Release:
        """The release the plan calibrated for round ``round_idx``."""
        return self.mechanism.planned_release(self.variance(round_idx))

    def simulated_sum(
        self, updates: list[tuple[int, Params]], round_idx: int, cohort_size: int, seed: int, noise: NoiseSource,
    ) -> np.ndarray | None:
        """What the server would unmask in a simulation: the sum of every silo's noised share;
        None below the threshold (the round releases nothing)."""
        if len(updates) < self.secure.threshold(cohort_size):
            return None
        share = self.share(round_idx, cohort_size)
        return modular_sum([self.mechanism.encode(u, share, *silo_streams(noise, seed, round_idx, cid)) for cid, u in updates])
