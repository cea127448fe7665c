"""Distributed DP under secure aggregation: every silo adds its share of Skellam noise.

Client-level DP-FedAvg (McMahan et al. 2018) without a trusted server, following the
distributed Skellam mechanism of Agarwal, Kairouz & Liu 2021 (Alg. 1, without its random
rotation: fedveil's 32-bit sum has room for every coordinate, :meth:`DistributedDP.check_room`).
In round r silo k

1. clips its update to L2 norm C (``privacy.clip``);
2. scales it by gamma = L / C, L = 2^(bits-1) - 1, so its norm is at most L integer units;
3. rounds every coordinate stochastically to an integer, again until the rounded vector's
   L2 norm is within D2 (conditional rounding, Kairouz, Liu & Steinke 2021, "The
   Distributed Discrete Gaussian Mechanism", sec. 4.1); after :data:`ROUNDING_TRIES`
   misses it rounds towards zero, whose norm never exceeds L, so the bound always holds;
4. adds Skellam noise of variance ``share = mu_r / (t_r - colluders)`` per coordinate,
   t_r the round's secure-aggregation threshold;
5. reduces the vector mod 2^32: what secure aggregation masks and sums.

The server unmasks only the sum over the survivors, reads it as centred integers and
divides by gamma and by the expected cohort m: DP-FedAvg's mean, with noise
``Sk(survivors * share) / (gamma m)``. A round completes only with at least t_r survivors, so
the noise no colluding silo can subtract is ``(survivors - colluders) * share >= mu_r``: the
release recorded (:class:`~fedveil.privacy.skellam.SkellamDpEvent`, L2 sensitivity D2, L1
sensitivity min(D2^2, sqrt(d) D2), since an integer vector's L1 norm is at most its
squared L2 norm). The server never sees an un-noised sum, nor any silo's update.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..params import Params
from ..privacy.client_dp import clip_update
from ..privacy.events import Release
from ..privacy.randomness import NoiseSource, RandomSource, skellam
from ..privacy.skellam import SKELLAM_RELATIONS, skellam_event
from .secure_sum import MODULUS_BITS, Layout, flatten, unflatten

ROUNDING_TRIES = 20  # conditional rounding's draws before it rounds towards zero
ROUNDING_SLACK = 2.0  # sqrt(2 ln(1/beta)) of the rounding bound: beta = e^-2 misses per draw at most
TAIL_SIGMAS = 12.0  # noise room kept in the 32-bit sum, in standard deviations of the summed noise
MAX_ROUNDING_OVERHEAD = 1.05  # D2 / L above this: too few bits for the model's size
LABEL = "skellam/secure-sum"


class DistributedDPError(ValueError):
    """Settings under which the distributed mechanism cannot run or cannot be accounted."""


@dataclass(frozen=True)
class DistributedDP:
    """The silos' and the server's halves of the mechanism for one model size."""

    clip: float  # C, privacy.clip
    bits: int  # secure_aggregation.bits: L = 2^(bits-1) - 1 integer units for norm C
    dimension: int  # d, the most numbers one update holds (the model's parameters and buffers)
    expected_cohort: float  # m, the fixed denominator of the mean
    colluders: int = 0  # silos whose noise shares the accounting does not count

    @property
    def norm_units(self) -> int:
        """L: the integer norm of an update whose L2 norm is C."""
        return (1 << (self.bits - 1)) - 1

    @property
    def scale(self) -> float:
        """gamma = L / C."""
        return self.norm_units / self.clip

    @property
    def l2_sensitivity(self) -> float:
        """D2 of conditional rounding: sqrt(L^2 + d/4 + s (L + sqrt(d)/2)), the bound Kairouz et
        al. 2021 give for a stochastically rounded vector of norm L (exceeded with probability at
        most beta, s = sqrt(2 ln(1/beta))); :meth:`round` enforces it."""
        L, d = self.norm_units, self.dimension
        return math.sqrt(L * L + d / 4 + ROUNDING_SLACK * (L + math.sqrt(d) / 2))

    @property
    def l1_sensitivity(self) -> float:
        """D1 = min(D2^2, sqrt(d) D2): an integer vector's L1 norm is at most its squared L2 norm."""
        d2 = self.l2_sensitivity
        return min(d2 * d2, math.sqrt(self.dimension) * d2)

    def check_bits(self) -> None:
        """Refuse a ``bits`` so small that rounding adds more than 5% to the sensitivity."""
        if self.bits < 2 or self.l2_sensitivity > MAX_ROUNDING_OVERHEAD * self.norm_units:
            raise DistributedDPError(
                f"secure_aggregation.bits = {self.bits}: rounding {self.dimension} numbers to integers adds "
                f"{self.l2_sensitivity / max(self.norm_units, 1) - 1:.0%} to the sensitivity; raise bits"
            )

    def check_room(self, cohort_size: int, share: float) -> None:
        """The summed vectors and ``TAIL_SIGMAS`` of their noise must fit the signed 32-bit sum."""
        need = cohort_size * self.norm_units + TAIL_SIGMAS * math.sqrt(cohort_size * share)
        if need >= 2 ** (MODULUS_BITS - 1):
            raise DistributedDPError(
                f"secure_aggregation.bits = {self.bits}: {cohort_size} silos' updates and their noise can overflow "
                f"the {MODULUS_BITS}-bit sum; lower bits"
            )

    def share(self, variance: float, threshold: int) -> float:
        """Each silo's noise variance so that any ``threshold`` survivors, less the colluders,
        carry ``variance`` together."""
        honest = threshold - self.colluders
        if honest < 1:
            raise DistributedDPError(
                f"secure_aggregation.colluders = {self.colluders}: a round of threshold {threshold} silos could then "
                "hold no honest noise share; lower colluders or raise threshold"
            )
        return variance / honest

    def encode(self, update: Params, share: float, noise: RandomSource, rounding: np.random.Generator) -> np.ndarray:
        """One silo's clipped, scaled, conditionally rounded and noised update, mod 2^32."""
        clipped, _ = clip_update({k: v.detach().double() for k, v in update.items()}, self.clip)
        scaled = flatten(clipped) * self.scale
        if scaled.size > self.dimension:  # the plan's d bounds the update's size (D2 and D1 grow with d)
            raise DistributedDPError(f"an update of {scaled.size} numbers for a plan of at most {self.dimension}")
        rounded = self.round(scaled, rounding)
        noisy = rounded + skellam(rounded.size, share, noise)
        return (noisy % (1 << MODULUS_BITS)).astype(np.uint32)

    def round(self, scaled: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Conditional stochastic rounding to an integer vector of L2 norm at most D2."""
        low = np.floor(scaled)
        bound = self.l2_sensitivity**2
        for _ in range(ROUNDING_TRIES):
            rounded = low + (rng.random(scaled.shape) < scaled - low)
            if float(np.dot(rounded, rounded)) <= bound:
                return rounded.astype(np.int64)
        return np.trunc(scaled).astype(np.int64)

    def decode(self, total: np.ndarray, layout: Layout, dtype: torch.dtype, device: torch.device) -> Params:
        """The noisy mean update from the unmasked sum: centred integers / (gamma m)."""
        total = total.astype(np.int64) % (1 << MODULUS_BITS)
        centred = np.where(total >= 1 << (MODULUS_BITS - 1), total - (1 << MODULUS_BITS), total)
        return unflatten(centred.astype(np.float64) / (self.scale * self.expected_cohort), layout, dtype, device)

    def release(self, survivors: int, share: float) -> Release:
        """What the server learned from ``survivors`` silos' noised sum: Skellam of the
        variance no colluder can subtract."""
        return self.planned_release(max(survivors - self.colluders, 0) * share)

    def planned_release(self, variance: float) -> Release:
        """The Skellam release of a sum carrying ``variance``, at this mechanism's sensitivities."""
        event = skellam_event(variance, self.l2_sensitivity, self.l1_sensitivity)
        return Release(event, 1, SKELLAM_RELATIONS, label=LABEL)


NOISE_STREAM, ROUNDING_STREAM = 0x5CE1, 0x5CE2  # (seed, tag, round, silo) of the seeded streams


def silo_streams(source: NoiseSource, seed: int, round_idx: int, client: int) -> tuple[RandomSource, np.random.Generator]:
    """Silo ``client``'s noise stream from the run's source (seeded, secure or zero) and its
    rounding generator: a deployed silo and its simulation draw the same numbers when seeded."""
    noise = source.stream("distributed-dp", np.random.default_rng([seed, NOISE_STREAM, round_idx, client]))
    return noise, np.random.default_rng([seed, ROUNDING_STREAM, round_idx, client])
