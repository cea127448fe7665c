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

Every DP mechanism of fedveil draws through :func:`standard_normal`,
:func:`fill_standard_normal_`, :func:`uniform` and :func:`permutation`, which accept
either source. Draws are made where the source lives (the CPU for a seeded CPU generator
and for :data:`SECURE`) and then moved to the device of the tensor they are for, so a run's
noise is the same numbers on the CPU and on a GPU.
"""
from __future__ import annotations

import math
import os
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

    def __repr__(self) -> str:
        return "SecureRandom(os.urandom)"


SECURE = SecureRandom()
RandomSource = Union[torch.Generator, SecureRandom]


def _on(tensor: torch.Tensor, device: torch.device | str | None) -> torch.Tensor:
    return tensor if device is None else tensor.to(device)


def standard_normal(
    shape: tuple[int, ...] | torch.Size, source: RandomSource, dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """A tensor of standard normals of ``shape`` drawn from ``source``, on ``device`` (default:
    the generator's device, the CPU for :data:`SECURE`). The draws do not depend on
    ``device``: they are made where ``source`` lives and moved, so a CPU generator gives the
    same numbers for a CPU and a CUDA tensor."""
    if isinstance(source, SecureRandom):
        return _on(source.standard_normal(math.prod(shape)).to(dtype).view(shape), device)
    return _on(torch.randn(shape, generator=source, dtype=dtype, device=source.device), device)


def fill_standard_normal_(tensor: torch.Tensor, source: RandomSource) -> torch.Tensor:
    """Fill ``tensor`` (on any device) in place with standard normals from ``source``: the
    same draws as :func:`standard_normal` of its shape, made where ``source`` lives."""
    if isinstance(source, SecureRandom):
        return tensor.copy_(source.standard_normal(tensor.numel()).view(tensor.shape))
    if tensor.device != source.device:
        return tensor.copy_(torch.empty(tensor.shape, dtype=tensor.dtype, device=source.device).normal_(generator=source))
    return tensor.normal_(generator=source)


def uniform(
    n: int, source: RandomSource, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
) -> torch.Tensor:
    """``n`` uniforms in [0, 1) of ``dtype`` (``torch.rand`` for a generator), drawn where
    ``source`` lives and moved to ``device`` (default: left there)."""
    if isinstance(source, SecureRandom):
        return _on(source.uniform(n).to(dtype), device)
    return _on(torch.rand(n, generator=source, dtype=dtype, device=source.device), device)


def permutation(n: int, source: RandomSource, device: torch.device | str | None = None) -> torch.Tensor:
    """A random permutation of ``range(n)`` (``torch.randperm`` for a generator), drawn where
    ``source`` lives and moved to ``device`` (default: left there)."""
    if isinstance(source, SecureRandom):
        return _on(source.permutation(n), device)
    return _on(torch.randperm(n, generator=source, device=source.device), device)
