"""Where DP noise and the sampling the accountant relies on come from.

Two sources, one interface:

* a seeded ``torch.Generator`` (default, ``privacy.secure_rng = false``): reproducible
  research runs; anyone holding the run's seed can regenerate the noise and the batches;
* :data:`SECURE` (``privacy.secure_rng = true``): the operating system's cryptographically
  secure generator (``os.urandom``, i.e. ``getrandom``), with no seed and no state, so
  nothing written to a run directory lets anyone regenerate (and subtract) the noise.

Secure Gaussian noise follows the floating-point hardening of Holohan & Braghin 2021
("Secure Random Sampling in Differential Privacy", arXiv 2107.10138), as Opacus'
secure mode does: each coordinate is the sum of four standard normals divided by two
(variance 1), drawn in double precision by the Box-Muller transform from 53-bit uniforms.
Secure draws are several times slower than torch's generator (measured in docs/privacy.md).

A run holds one :class:`NoiseSource` (seeded, secure or zero) and every DP mechanism
asks it for its stream, naming itself (:data:`MECHANISMS`): ``noise.stream("dp-sgd",
generator)`` gives the mechanism's seeded ``generator`` back, :data:`SECURE`, or a
:class:`ZeroNoiseStream` (noise exactly zero, sampling still from ``generator``: the
audit's self-test of a run whose noise is silently off). Secure mode and the audit thus
reach every mechanism by construction, and the source counts which mechanisms asked.

Every DP mechanism of fedveil draws through :func:`standard_normal`,
:func:`fill_standard_normal_`, :func:`gumbel`, :func:`uniform` and :func:`permutation`,
which accept a torch or numpy generator or a stream. Draws are made where the source lives
(the CPU for a seeded CPU generator and for :data:`SECURE`) and then moved to the device of
the tensor they are for, so a run's noise is the same numbers on the CPU and on a GPU.
"""
from __future__ import annotations

import math
import os
from collections import Counter
from typing import Union

import numpy as np
import torch

SECURE_NORMAL_TERMS = 4  # secure noise: (n_1 + ... + n_4) / 2 (Holohan & Braghin 2021)


class SecureRandom:
    """Randomness from ``os.urandom``: no seed, nothing to save, nothing to replay."""

    def uniform(self, n: int) -> torch.Tensor:
        """``n`` float64 uniforms in [0, 1) with 53 random bits each."""
        words = np.frombuffer(os.urandom(8 * n), dtype=np.uint64) >> np.uint64(11)
        return torch.from_numpy(words.astype(np.float64) * 2.0**-53)

    def standard_normal(self, numel: int) -> torch.Tensor:
        """``numel`` float64 standard normals, each the mean-preserving sum of four Box-Muller
        draws divided by two."""
        pairs = (SECURE_NORMAL_TERMS * numel + 1) // 2
        u = self.uniform(2 * pairs).view(2, pairs)
        radius = torch.sqrt(-2.0 * torch.log1p(-u[0]))  # 1 - u in (0, 1]: log is finite
        angle = (2.0 * math.pi) * u[1]
        draws = torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)])[: SECURE_NORMAL_TERMS * numel]
        return draws.view(SECURE_NORMAL_TERMS, numel).sum(0) / math.sqrt(SECURE_NORMAL_TERMS)

    def permutation(self, n: int) -> torch.Tensor:
        """A uniformly random permutation of ``range(n)``: argsort of 64-bit random keys
        (ties, with probability below n^2 / 2^64, only bias the order of the tied pair)."""
        keys = torch.from_numpy(np.frombuffer(os.urandom(8 * n), dtype=np.int64).copy())
        return torch.argsort(keys, stable=True)

    def poisson(self, lam: float, n: int) -> np.ndarray:
        """``n`` Poisson(``lam``) draws (int64): inversion for ``lam`` < 10, else Hoermann's
        transformed rejection with squeeze (PTRS, "The transformed rejection method for
        generating Poisson random variables", 1993), from secure uniforms."""
        if lam < 10:
            return self._poisson_by_inversion(lam, n)
        slam, loglam = math.sqrt(lam), math.log(lam)
        b = 0.931 + 2.53 * slam
        a = -0.059 + 0.02483 * b
        log_invalpha = math.log(1.1239 + 1.1328 / (b - 3.4))
        vr = 0.9277 - 3.6224 / (b - 2)
        out = np.empty(n, dtype=np.int64)
        todo = np.arange(n)
        while todo.size:
            u = self.uniform(todo.size).numpy() - 0.5
            v = self.uniform(todo.size).numpy()
            us = 0.5 - np.abs(u)
            with np.errstate(divide="ignore", invalid="ignore"):
                k = np.floor((2 * a / us + b) * u + lam + 0.43)
                fast = (us >= 0.07) & (v <= vr)
                candidate = ~fast & (us > 0) & (k >= 0) & ~((us < 0.013) & (v > us))
                kk = np.where(candidate, k, 0.0)
                lhs = np.log(v) + log_invalpha - np.log(a / (us * us) + b)
                rhs = -lam + kk * loglam - torch.lgamma(torch.from_numpy(kk + 1.0)).numpy()
            accept = fast | (candidate & (lhs <= rhs))
            out[todo[accept]] = k[accept].astype(np.int64)
            todo = todo[~accept]
        return out

    def _poisson_by_inversion(self, lam: float, n: int) -> np.ndarray:
        """Poisson(``lam``) by sequential search of the CDF (small ``lam`` only)."""
        u = self.uniform(n).numpy()
        k = np.zeros(n, dtype=np.int64)
        p = math.exp(-lam)
        cdf = np.full(n, p)
        pk = np.full(n, p)
        below = u >= cdf
        while below.any():
            k[below] += 1
            pk = np.where(below, pk * lam / np.maximum(k, 1), pk)
            cdf = np.where(below, cdf + pk, cdf)
            below = u >= cdf
            if k.max() > 10 * lam + 100:  # floating-point tail: the CDF cannot reach u
                break
        return k

    def __repr__(self) -> str:
        return "SecureRandom(os.urandom)"


SECURE = SecureRandom()


class ZeroNoiseStream:
    """A mechanism's stream with its noise off: every normal and Gumbel draw is exactly zero,
    while uniforms and permutations (batch and cohort sampling) still come from the seeded
    ``sampling`` generator, so the run samples as planned and only the noise is missing."""

    def __init__(self, sampling: "torch.Generator | np.random.Generator") -> None:
        self.sampling = sampling

    def __repr__(self) -> str:
        return f"ZeroNoiseStream({self.sampling!r})"


RandomSource = Union[torch.Generator, np.random.Generator, SecureRandom, ZeroNoiseStream]

# Every mechanism that draws DP randomness, by the name it asks a NoiseSource with, and
# the ledger labels of the releases it makes (tests check that every label recorded in a
# ledger belongs to a mechanism that drew from the run's source).
MECHANISMS: dict[str, tuple[str, ...]] = {
    "dp-sgd": ("gaussian/poisson", "gaussian/shuffle", "gaussian/fixed", "gaussian/full"),  # batches + noise, both executors
    "dp-fedavg": ("gaussian/poisson", "gaussian/fixed"),  # client-level noise, adaptive clipping's count
    "distributed-dp": ("skellam/secure-sum",),  # each silo's Skellam share under secure aggregation
    "client-sampling": (),  # client-level DP's secure cohorts (the seeded ones are pre-generated)
    "ifca-selection": ("report_noisy_max",),
    "fedfed-release": ("shared features",),
    "ecos-coverage": ("ecos/coverage",),
    "ecos-knn": ("ecos/private-knn",),
}


class NoiseSource:
    """Where a run's DP randomness comes from; hand one to every mechanism.

    ``kind``: ``"seeded"`` (reproducible research runs: a mechanism's stream is its own
    seeded generator), ``"secure"`` (:data:`SECURE` for every mechanism: nothing in a run
    directory regenerates the noise) or ``"zero"`` (noise exactly zero, sampling seeded).
    ``requests`` counts the streams each mechanism asked for."""

    KINDS = ("seeded", "secure", "zero")

    def __init__(self, kind: str = "seeded") -> None:
        if kind not in self.KINDS:
            raise ValueError(f"noise source kind must be one of {', '.join(self.KINDS)}; got {kind!r}")
        self.kind = kind
        self.requests: Counter[str] = Counter()

    @classmethod
    def for_config(cls, secure_rng: bool) -> "NoiseSource":
        """The source ``privacy.secure_rng`` asks for."""
        return cls("secure" if secure_rng else "seeded")

    @property
    def secure(self) -> bool:
        """Whether every mechanism draws from :data:`SECURE` (``kind == "secure"``)."""
        return self.kind == "secure"

    def stream(self, mechanism: str, seeded: "torch.Generator | np.random.Generator") -> RandomSource:
        """``mechanism``'s stream (a name of :data:`MECHANISMS`): ``seeded`` itself, :data:`SECURE`,
        or ``seeded`` with its noise zeroed."""
        if mechanism not in MECHANISMS:
            raise ValueError(f"unknown DP mechanism {mechanism!r}; register it in MECHANISMS")
        self.requests[mechanism] += 1
        if self.kind == "secure":
            return SECURE
        return seeded if self.kind == "seeded" else ZeroNoiseStream(seeded)

    def __repr__(self) -> str:
        return f"NoiseSource({self.kind!r})"


def check_source(source: object) -> None:
    """A ValueError unless ``source`` is something the draw functions below accept."""
    if not isinstance(source, (torch.Generator, np.random.Generator, SecureRandom, ZeroNoiseStream)):
        raise ValueError(
            f"a DP random source must be a torch or numpy Generator or a NoiseSource stream; got {type(source).__name__}."
        )


def _on(tensor: torch.Tensor, device: torch.device | str | None) -> torch.Tensor:
    return tensor if device is None else tensor.to(device)


def standard_normal(
    shape: tuple[int, ...] | torch.Size, source: RandomSource, dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """A tensor of standard normals of ``shape`` drawn from ``source``, on ``device`` (default:
    the generator's device, the CPU otherwise). The draws do not depend on ``device``: they
    are made where ``source`` lives and moved, so a CPU generator gives the same numbers for a
    CPU and a CUDA tensor. A numpy generator draws ``standard_normal`` in float64."""
    shape = tuple(shape)
    if isinstance(source, ZeroNoiseStream):
        return torch.zeros(shape, dtype=dtype, device=device)
    if isinstance(source, SecureRandom):
        return _on(source.standard_normal(math.prod(shape)).to(dtype).view(shape), device)
    if isinstance(source, np.random.Generator):
        return _on(torch.from_numpy(source.standard_normal(shape)).to(dtype), device)
    return _on(torch.randn(shape, generator=source, dtype=dtype, device=source.device), device)


def fill_standard_normal_(tensor: torch.Tensor, source: RandomSource) -> torch.Tensor:
    """Fill ``tensor`` (on any device) in place with standard normals from ``source``: the
    same draws as :func:`standard_normal` of its shape, made where ``source`` lives."""
    if isinstance(source, ZeroNoiseStream):
        return tensor.zero_()
    if isinstance(source, SecureRandom):
        return tensor.copy_(source.standard_normal(tensor.numel()).view(tensor.shape))
    if tensor.device != source.device:
        return tensor.copy_(torch.empty(tensor.shape, dtype=tensor.dtype, device=source.device).normal_(generator=source))
    return tensor.normal_(generator=source)


def gumbel(n: int, source: RandomSource, device: torch.device | str | None = None) -> torch.Tensor:
    """``n`` float64 standard Gumbel draws ``-log(-log(u))`` from uniforms of ``source``."""
    if isinstance(source, ZeroNoiseStream):
        return torch.zeros(n, dtype=torch.float64, device=device)
    return -torch.log(-torch.log(uniform(n, source, torch.float64, device).clamp(min=1e-300)))


def uniform(
    n: int | tuple[int, ...], source: RandomSource, dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Uniforms in [0, 1) of ``dtype`` (``n`` of them, or of shape ``n``; ``torch.rand`` for a
    torch generator, ``random`` for a numpy one), drawn where ``source`` lives and moved to
    ``device`` (default: left there). A zero-noise stream draws them from its sampling generator."""
    if isinstance(source, ZeroNoiseStream):
        source = source.sampling
    shape = (n,) if isinstance(n, int) else tuple(n)
    if isinstance(source, SecureRandom):
        return _on(source.uniform(math.prod(shape)).view(shape).to(dtype), device)
    if isinstance(source, np.random.Generator):
        return _on(torch.from_numpy(source.random(shape)).to(dtype), device)
    return _on(torch.rand(shape, generator=source, dtype=dtype, device=source.device), device)


def skellam(n: int, variance: float, source: RandomSource) -> np.ndarray:
    """``n`` int64 draws of the symmetric Skellam noise of ``variance`` mu:
    ``Poisson(mu/2) - Poisson(mu/2)`` (:mod:`fedveil.privacy.skellam`), from ``source``
    (``poisson`` for a numpy generator, PTRS on secure uniforms for :data:`SECURE`; zeros for
    a zero-noise stream). The shares are added on the host, to what secure aggregation masks."""
    if isinstance(source, ZeroNoiseStream):
        return np.zeros(n, dtype=np.int64)
    half = variance / 2.0
    if isinstance(source, (SecureRandom, np.random.Generator)):  # both draw Poisson counts alike
        return source.poisson(half, n) - source.poisson(half, n)
    raise ValueError(f"Skellam noise is drawn on the host from a numpy generator or the secure source; got {source!r}")


def permutation(n: int, source: RandomSource, device: torch.device | str | None = None) -> torch.Tensor:
    """A random permutation of ``range(n)`` (``torch.randperm`` for a generator), drawn where
    ``source`` lives and moved to ``device`` (default: left there). A zero-noise stream draws
    it from its sampling generator."""
    if isinstance(source, ZeroNoiseStream):
        source = source.sampling
    if isinstance(source, SecureRandom):
        return _on(source.permutation(n), device)
    if isinstance(source, np.random.Generator):
        return _on(torch.from_numpy(source.permutation(n)), device)
    return _on(torch.randperm(n, generator=source, device=source.device), device)
