"""Client-level DP-FedAvg: clip every client update, average uniformly, add Gaussian noise.

McMahan et al. 2018 ("Learning Differentially Private Recurrent Language Models"):
``Delta = (sum_i clip(Delta_i, C) + N(0, (z C)^2 I)) / m`` with a *fixed* denominator
``m`` (the expected cohort size), so one client changes the sum by at most ``C`` and the
noise multiplier ``z`` is what the accountant sees. Adaptive clipping follows Andrew et
al. 2021 ("Differentially Private Learning with Adaptive Clipping"), Alg. 1: the clip
moves geometrically towards the ``target_quantile`` of update norms, estimated from a
noisy count of unclipped updates; the update noise is raised so the pair of releases
costs exactly one Gaussian with multiplier ``z`` (their Thm 1).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..params import Params

CLIP_EPS = 1e-15


def clip_update(update: Params, clip: float) -> tuple[Params, float]:
    """Scale ``update`` to global L2 norm at most ``clip``; returns it and its norm before."""
    norm = math.sqrt(sum(float(v.double().pow(2).sum()) for v in update.values()))
    factor = min(1.0, clip / (norm + CLIP_EPS))
    return {k: v * factor for k, v in update.items()}, norm


def update_noise_multiplier(noise_multiplier: float, count_noise_std: float) -> float:
    """z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2) (Andrew et al. Thm 1): the update and the
    clipped-count release together cost one Gaussian with multiplier ``z``."""
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

    def noisy_mean(self, updates: list[Params], template: Params, generator: torch.Generator) -> tuple[Params, dict]:
        """The privatised mean update and facts to log (clip used, unclipped share)."""
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
            k: (v + std * torch.randn(v.shape, generator=generator, dtype=v.dtype)) / self.expected_cohort
            for k, v in total.items()
        }
        facts = {"clip": self.clip}
        if self.adaptive:
            self.clip = self._next_clip(unclipped, generator)
        return noisy, facts

    def _next_clip(self, unclipped: int, generator: torch.Generator) -> float:
        """C <- C exp(-eta (b - gamma)), b = (#unclipped + N(0, sigma_b^2)) / m (Andrew et al. Alg. 1)."""
        noise = self.count_noise_std * float(torch.randn((), generator=generator, dtype=torch.float64))
        share = (unclipped + noise) / self.expected_cohort
        return self.clip * math.exp(-self.clip_lr * (share - self.target_quantile))

    def state_dict(self) -> dict:
        return {"clip": self.clip}

    def load_state_dict(self, state: dict) -> None:
        self.clip = float(state["clip"])
