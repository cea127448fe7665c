"""One intra-op thread for the calling thread only (torch has no per-thread setting).

The vectorized executor runs each client's ``client_update`` in a thread of its own while
the stacked kernels run on the executor's thread. A client thread's tensors are one
client's (a delta, a message): too small to split across cores. Yet each thread that
runs a parallel kernel keeps an OpenMP team of its own, so a cohort of 100 client threads
wakes 100 teams of workers that contend with the stacked kernels for the cores. The
threads executor trains one client per worker thread, each on one core.
``torch.set_num_threads`` would also change the count of every thread started later; the
OpenMP runtime's ``omp_set_num_threads`` sets it for the calling thread alone.
"""
from __future__ import annotations

import ctypes
import re
from functools import lru_cache
from pathlib import Path

import torch

_RUNTIME_NAME = re.compile(r"lib(gomp|iomp5|omp)[-.\w]*\.(so[.\d]*|dylib)$")


@lru_cache(maxsize=1)
def _openmp_runtime() -> ctypes.CDLL | None:
    """The OpenMP runtime shipped with torch (in its ``lib`` folder, or ``torch.libs`` beside
    it); None without one (torch built without OpenMP, or linked to the system's). Never
    another package's copy: its thread counts would not be torch's."""
    if not torch.backends.openmp.is_available():
        return None
    package = Path(torch.__file__).parent
    folders = [package / "lib", package.parent / "torch.libs"]
    for path in (p for folder in folders if folder.is_dir() for p in sorted(folder.iterdir())):
        if not _RUNTIME_NAME.search(path.name):
            continue
        try:
            runtime = ctypes.CDLL(str(path))
            runtime.omp_set_num_threads.argtypes = [ctypes.c_int]
            return runtime
        except (OSError, AttributeError):
            continue
    return None


def use_one_intra_op_thread() -> bool:
    """Make the calling thread's torch kernels single-threaded (other threads keep their
    count); False where torch has no OpenMP runtime to ask (then nothing changes)."""
    runtime = _openmp_runtime()
    if runtime is None:
        return False
    torch.get_num_threads()  # torch sets a thread's count on its first use: let it happen before ours
    runtime.omp_set_num_threads(1)
    return True


__all__ = ["use_one_intra_op_thread"]
