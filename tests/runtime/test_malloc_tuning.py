"""glibc's malloc set for training: a block below 32 MiB comes from the heap (no fresh mmap
to page-fault each step); untouched when the environment configures malloc itself."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest

from fedveil.runtime.malloc_tuning import configured_by_environment


def _glibc_with_mallinfo2() -> bool:
    try:
        libc = ctypes.CDLL(None)
        return hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallinfo2")
    except OSError:
        return False


# Counts the blocks malloc serves by mmap around one 24 MiB tensor (a size no import freed
# before, so glibc's adaptive threshold has not risen to it by itself).
PROBE = """
import ctypes, sys, torch
from fedveil.runtime.malloc_tuning import keep_freed_memory_for_reuse
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
tuned = keep_freed_memory_for_reuse() if sys.argv[1] == "tune" else None
before = libc.mallinfo2().hblks
block = torch.empty(24 << 20, dtype=torch.uint8)
print(tuned, libc.mallinfo2().hblks - before)
"""


def _probe(mode: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not configured_by_environment({k: v})}
    done = subprocess.run([sys.executable, "-c", PROBE, mode], env={**clean, **env}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


@pytest.mark.skipif(not _glibc_with_mallinfo2(), reason="glibc >= 2.33 only")
def test_a_24_mib_block_comes_from_the_heap_once_tuned_and_from_mmap_before():
    assert _probe("leave") == "None 1"
    assert _probe("tune") == "True 0"
    # the environment's own malloc settings win: nothing is set
    assert _probe("tune", MALLOC_MMAP_THRESHOLD_="1048576").startswith("False")


def test_environment_settings_are_recognised():
    assert configured_by_environment({"MALLOC_ARENA_MAX": "2"}) is True
    assert configured_by_environment({"MALLOC_TRIM_THRESHOLD_": "0"}) is True
    assert configured_by_environment({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}) is True
    assert configured_by_environment({"LD_PRELOAD": "/usr/lib/libjemalloc.so"}) is True
    assert configured_by_environment({"PATH": "/bin"}) is False
