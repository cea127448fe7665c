"""Client-level DP-FedAvg: clip every client update, average uniformly, add Gaussian noise.

McMahan et al. 2018 ("Learning Differentially Private Recurrent Language Models"):
``Delta = (sum_i clip(Delta_i, C) + N(0, (z C)^2 I)) / m`` with a *fixed* denominator
``m`` (the expected cohort size), so one client changes the sum by at most ``C`` and the
noise multiplier ``z`` is what the accountant sees. Adaptive clipping follows Andrew et
al. 2021 ("Differentially Private Learning with Adaptive Clipping"), Alg. 1: the clip
moves geometrically towards the ``target_quantile`` of update norms, estimated from a
noisy count of unclipped updates; the update noise is raised so the pair of releases
costs exactly one Gaussian with multiplier ``z`` (their Thm 1).

The count sums *shifted* bits ``b_i - 1/2`` (``b_i = 1`` when client i's update is not
clipped), as Andrew et al.'s implementation does, so that adding or removing one client
(Poisson cohorts) moves it by at most 1/2; under fixed-size cohorts (replace one client)
it moves by at most 1 while the clipped sum moves by ``2C``. Either way the count's
sensitivity is half the update's in the update's units, which is what the
``(2 sigma_b)^-2`` term of :func:`update_noise_multiplier` assumes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..params import Params, global_norm
from .randomness import RandomSource, standard_normal

CLIP_EPS = 1e-15


def clip_update(update: Params, clip: float) -> tuple[Params, float]:
    """Scale ``update`` to global L2 norm at most ``clip``; returns it and its norm before."""
    norm = float(global_norm(update))
    factor = min(1.0, clip / (norm + CLIP_EPS))
    return {k: v * factor for k, v in update.items()}, norm


COUNT_SENSITIVITY = {"poisson": 0.5, "fixed": 1.0}  # of the shifted count, under add/remove resp. replace-one
UPDATE_SENSITIVITY = {"poisson": 1.0, "fixed": 2.0}  # of the clipped sum, in units of the clip C


def combined_noise_multiplier(update_noise: float, count_noise_std: float, count_sensitivity: float, sampling: str) -> float:
    """The one Gaussian the update (noise multiplier ``update_noise``, std / C) and the count
    (std ``count_noise_std``, sensitivity ``count_sensitivity``) together amount to, in the
    accountant's convention for ``sampling`` (std / C of the update): two Gaussians with
    sensitivity-to-std ratios r_1, r_2 are one with ratio sqrt(r_1^2 + r_2^2)."""
    units = UPDATE_SENSITIVITY[sampling]
    ratio_sq = (units / update_noise) ** 2 + (count_sensitivity / count_noise_std) ** 2
    return units / ratio_sq**0.5


def update_noise_multiplier(noise_multiplier: float, count_noise_std: float) -> float:
    """z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2) (Andrew et al. Thm 1): the update and the
    shifted clipped-count release together cost one Gaussian with multiplier ``z``."""
    rest = noise_multiplier**-2 - (2.0 * count_noise_std) ** -2
    if rest <= 0:
        raise ValueError(
            f"privacy.clip_count_noise={count_noise_std} is too small for noise_multiplier={noise_multiplier:.4g}: "
            f"it must exceed z/2 = {noise_multiplier / 2:.4g}"
        )
    return rest**-0.5


@dataclass
class ClientLevelDP:
    """The server side of DP-FedAvg for one run (state: the current clip)."""

    noise_multiplier: float  # z of the accounted Gaussian (std / sensitivity)
    clip: float
    expected_cohort: float  # m, the fixed denominator
    adaptive: bool = False
    target_quantile: float = 0.5
    clip_lr: float = 0.2
    count_noise_std: float = 1.0  # sigma_b of the clipped-count release (adaptive only)
    sampling: str = "poisson"  # how cohorts are drawn: "poisson" (add/remove) or "fixed" (replace one)

    def noisy_mean(self, updates: list[Params], template: Params, generator: RandomSource) -> tuple[Params, dict]:
        """The privatised mean update and what was released: ``clip`` and
        ``noise_multiplier`` (the one Gaussian the round's releases amount to, from the noise
        actually added) and, when adaptive, ``update_noise_multiplier``, ``clip_count_noise``
        and ``clip_count_sensitivity``."""
        z_update = update_noise_multiplier(self.noise_multiplier, self.count_noise_std) if self.adaptive else self.noise_multiplier
        total = {k: torch.zeros_like(v) for k, v in template.items()}
        unclipped = 0
        for update in updates:
            clipped, norm = clip_update(update, self.clip)
            unclipped += norm <= self.clip
            for k in total:
                total[k] += clipped[k]
        std = z_update * self.clip
        noisy = {
            k: (v + std * standard_normal(v.shape, generator, v.dtype, device=v.device)) / self.expected_cohort
            for k, v in total.items()
        }
        facts: dict = {"clip": self.clip, "noise_multiplier": z_update}
        if self.adaptive:
            shifted_count = unclipped - 0.5 * len(updates)
            self.clip = self._next_clip(shifted_count, generator)
            sensitivity = COUNT_SENSITIVITY[self.sampling]
            facts.update(
                update_noise_multiplier=z_update, clip_count_noise=self.count_noise_std, clip_count_sensitivity=sensitivity,
                noise_multiplier=combined_noise_multiplier(z_update, self.count_noise_std, sensitivity, self.sampling),
            )
        return noisy, facts

    def _next_clip(self, shifted_count: float, generator: RandomSource) -> float:
        """C <- C exp(-eta (b - gamma)), b = (sum_i (b_i - 1/2) + N(0, sigma_b^2)) / m + 1/2
        (Andrew et al. Alg. 1 with the shifted count; unbiased when the cohort has m clients)."""
        noise = self.count_noise_std * float(standard_normal((), generator, torch.float64))
        share = (shifted_count + noise) / self.expected_cohort + 0.5
        return self.clip * math.exp(-self.clip_lr * (share - self.target_quantile))

    def state_dict(self) -> dict:
        """The state to checkpoint: the current (possibly adapted) ``clip``."""
        return {"clip": self.clip}

    def load_state_dict(self, state: dict) -> None:
        """Restore the ``clip`` saved by :meth:`state_dict`."""
        self.clip = float(state["clip"])
