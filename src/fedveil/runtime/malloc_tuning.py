"""glibc's malloc set for a training loop: freed blocks kept for the next step, not refaulted.

Torch's CPU tensors come from ``malloc``. glibc serves a block above an adaptive threshold
(128 KiB at first, raised to the size of each mmap'd block freed, at most 32 MiB) with
fresh mmap'd pages, and gives back to the system the free top of a heap above twice that
threshold. A training step frees and reallocates activations and gradients of a few MiB,
and threads get heaps of their own: every step then page-faults memory it had a moment
ago. Here blocks up to 32 MiB (the adaptive threshold's own ceiling) always come from the
heaps and up to 16 MiB of free memory stays at a heap's top (ResNet-8 trained 13% faster,
measured in docs/executors.md).

Set once per process and not undone: after ``mallopt`` glibc has no way back to its
adaptive threshold. Nothing is set where the C library is not glibc or where the
environment already configures malloc (``MALLOC_*`` variables, ``GLIBC_TUNABLES``, a
preloaded allocator): set any of those to keep your own.
"""
from __future__ import annotations

import ctypes
import os
from functools import lru_cache

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 16 << 20


def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


def configured_by_environment(environ: dict[str, str] | None = None) -> bool:
    """True when the environment already sets malloc up (then it is left alone)."""
    env = os.environ if environ is None else environ
    if any(k.startswith("MALLOC_") for k in env):
        return True
    return "malloc" in env.get("GLIBC_TUNABLES", "") or "malloc" in env.get("LD_PRELOAD", "")


@lru_cache(maxsize=1)
def keep_freed_memory_for_reuse() -> bool:
    """Set the thresholds above (once per process); True when they are set, now or before."""
    libc = None if configured_by_environment() else _glibc()
    return libc is not None and all(
        libc.mallopt(option, value) == 1
        for option, value in ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    )


__all__ = ["keep_freed_memory_for_reuse", "configured_by_environment", "MMAP_THRESHOLD", "TRIM_THRESHOLD"]
