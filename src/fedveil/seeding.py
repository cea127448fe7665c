"""Deterministic random streams: one seed fixes everything, independently of order.

Each (purpose, round, client) gets its own stream derived from the run seed, so the
same client in the same round draws the same batches whichever executor runs it and
whether or not the run was resumed in between (DESIGN idea 6).
"""
from __future__ import annotations

import zlib

import numpy as np
import torch


def _key(part: int | str) -> int:
    return zlib.crc32(part.encode()) if isinstance(part, str) else int(part)


def derive_seed(seed: int, *parts: int | str) -> int:
    """A 63-bit seed for the stream named by ``parts`` under run seed ``seed``."""
    state = np.random.SeedSequence([_key(seed)] + [_key(p) for p in parts]).generate_state(2, dtype=np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1])) & ((1 << 63) - 1)


def torch_generator(seed: int, *parts: int | str) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded for the stream ``parts`` under run seed ``seed`` (:func:`derive_seed`)."""
    return torch.Generator().manual_seed(derive_seed(seed, *parts))


def numpy_generator(seed: int, *parts: int | str) -> np.random.Generator:
    """A NumPy ``Generator`` seeded for the stream ``parts`` under run seed ``seed`` (:func:`derive_seed`)."""
    return np.random.default_rng(derive_seed(seed, *parts))
