"""What secure aggregation sums, in the simulation and in a deployment alike.

A FedAvg-family message (``delta`` and the algorithm's weight w_k) is encoded as the
vector x_k = [p_k * delta_k, p_k] with p_k = w_k / ``weight_scale`` (a public scale), each
coordinate clipped to [-clip_range, clip_range] and quantised to ``bits`` bits by unbiased
stochastic rounding. The server learns only the sum of the quantised vectors (in a
deployment the masks of :mod:`fedveil.deploy.secagg` cancel in it; the simulation sums in
the clear) and recovers the weighted mean sum_k p_k delta_k / sum_k p_k: FedAvg's
aggregate over the survivors, within ``quantization_bound`` per coordinate of each sum.

The rounding draws come from a stream seeded by (seed, round, client), so a deployed run
and its simulation sum the very same integers. (They are not a privacy mechanism: the
server learns only their sum either way.)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .device import to_cpu

STREAM = 0x5EC5  # the rounding stream's tag, (seed, STREAM, round, client)
MODULUS_BITS = 32


class SecureSumError(ValueError):
    """Messages secure aggregation cannot sum (another layout, an algorithm that needs each message)."""


@dataclass(frozen=True)
class SecureSumSettings:
    """``secure_aggregation`` of a run config, with the threshold as a silo count."""

    clip: float
    bits: int
    weight_scale: float
    threshold_fraction: float
    colluders: int = 0  # distributed DP: silos whose noise shares are not counted

    @classmethod
    def from_config(cls, section) -> "SecureSumSettings":
        """The settings of a config's ``secure_aggregation`` section."""
        return cls(section.clip_range, section.bits, section.weight_scale, section.threshold, section.colluders)

    def threshold(self, cohort_size: int) -> int:
        """Silos that must answer every stage: the fraction of the cohort, at least 2."""
        return max(2, math.ceil(self.threshold_fraction * cohort_size - 1e-9))

    def check(self, cohort_size: int) -> None:
        """Raise :class:`SecureSumError` if the sum of ``cohort_size`` messages can overflow the modulus."""
        if self.bits + math.ceil(math.log2(max(cohort_size, 2))) > MODULUS_BITS:
            raise SecureSumError(
                f"secure_aggregation.bits = {self.bits}: the sum of {cohort_size} silos can overflow {MODULUS_BITS} bits"
            )


def quantize(x: np.ndarray, clip: float, bits: int, rng: np.random.Generator) -> np.ndarray:
    """x clipped to [-clip, clip] and mapped to {0, ..., 2^bits - 1} by unbiased stochastic
    rounding (E[dequantised] = clipped x; each coordinate moves by less than one step)."""
    levels = (1 << bits) - 1
    scaled = (np.clip(x.astype(np.float64), -clip, clip) + clip) * (levels / (2 * clip))
    low = np.floor(scaled)
    up = rng.random(scaled.shape) < (scaled - low)
    return np.minimum(low + up, levels).astype(np.uint32)


def dequantize_sum(total: np.ndarray, count: int, clip: float, bits: int) -> np.ndarray:
    """The sum of ``count`` clipped vectors from the sum of their quantisations."""
    step = 2 * clip / ((1 << bits) - 1)
    return total.astype(np.float64) * step - count * clip


def quantization_bound(count: int, clip: float, bits: int) -> float:
    """Largest error of one coordinate of the dequantised sum of ``count`` vectors within
    [-clip, clip]: each stochastic rounding moves a coordinate by less than one step."""
    return count * 2 * clip / ((1 << bits) - 1)


Layout = list[tuple[str, tuple[int, ...]]]


def layout_of(delta: dict[str, torch.Tensor]) -> Layout:
    """``(key, shape)`` of every tensor of ``delta``, keys sorted: how a summed vector is cut back up."""
    return [(key, tuple(delta[key].shape)) for key in sorted(delta)]


def flatten(delta: dict[str, torch.Tensor]) -> np.ndarray:
    """``delta``'s tensors, keys sorted (:func:`layout_of`), as one float64 vector on the host
    (where the masks and the noise shares are added)."""
    return np.concatenate([to_cpu(delta[key].detach()).double().reshape(-1).numpy() for key in sorted(delta)])


def unflatten(values: np.ndarray, layout: Layout, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """The inverse of :func:`flatten`: ``values`` cut by ``layout`` into tensors of ``dtype`` on ``device``."""
    expected = sum(math.prod(shape) for _, shape in layout)
    if values.size != expected:
        raise SecureSumError(f"a summed vector of {values.size} numbers does not fit the layout of {expected}")
    out, at = {}, 0
    for key, shape in layout:
        size = math.prod(shape)
        out[key] = torch.from_numpy(np.ascontiguousarray(values[at:at + size])).reshape(shape).to(dtype=dtype, device=device)
        at += size
    return out


def modular_sum(vectors: list[np.ndarray]) -> np.ndarray:
    """The sum mod 2^32 that secure aggregation reveals (a simulation computes it in the clear)."""
    total = np.zeros_like(vectors[0], dtype=np.uint64)
    for vector in vectors:
        total = (total + vector) % (1 << MODULUS_BITS)
    return total


def encode(delta: dict[str, torch.Tensor], weight: float, settings: SecureSumSettings, seed: int, round_idx: int, client: int) -> np.ndarray:
    """The quantised x_k = [p_k * delta_k (keys sorted), p_k] of one message."""
    p = weight / settings.weight_scale
    vector = np.concatenate([flatten(delta) * p, np.array([p])])
    rng = np.random.default_rng([seed, STREAM, round_idx, client])
    return quantize(vector, settings.clip, settings.bits, rng)


def decode(
    total: np.ndarray, count: int, layout: Layout, settings: SecureSumSettings, dtype: torch.dtype, device: torch.device,
) -> dict[str, Any] | None:
    """The combined message of ``count`` silos from the sum of their quantised vectors:
    ``delta`` the weighted mean, ``num_examples`` the summed weight; None when the summed
    weight is not positive (nothing to average)."""
    summed = dequantize_sum(total.astype(np.uint64) % (1 << MODULUS_BITS), count, settings.clip, settings.bits)
    weight = float(summed[-1])
    if weight <= 0:
        return None
    delta = unflatten(summed[:-1] / weight, layout, dtype, device)
    return {"delta": delta, "num_examples": weight * settings.weight_scale, "steps": 0}


def summed_in_the_clear(
    results: list[tuple[int, dict[str, Any]]], weights: list[float], settings: SecureSumSettings, seed: int, round_idx: int,
) -> list[tuple[int, dict[str, Any]]]:
    """The simulation's secure aggregation: what the server unmasks, as one message."""
    if not results:
        return results
    deltas = [m["delta"] for _, m in results]
    layout = layout_of(deltas[0])
    if any(layout_of(d) != layout for d in deltas):
        raise SecureSumError("the cohort's updates do not share one layout")
    total = modular_sum([encode(m["delta"], w, settings, seed, round_idx, cid) for (cid, m), w in zip(results, weights)])
    first = deltas[0][layout[0][0]]
    combined = decode(total, len(results), layout, settings, first.dtype, first.device)
    return [] if combined is None else [(-1, combined)]
