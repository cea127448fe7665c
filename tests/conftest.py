"""Fixtures shared across test folders (the reproductions, the ECOS jobs)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "data"))
from mnist_idx_files import idx  # noqa: E402  (tests/data helper: tiny IDX files)


@pytest.fixture(scope="session")
def mnist_data_root(tmp_path_factory):
    """A data root whose ``mnist-10k`` holds 300 + 100 random 28x28 "digits" in the IDX format."""
    root, rng = tmp_path_factory.mktemp("data"), np.random.default_rng(0)
    mnist = root / "mnist-10k"
    mnist.mkdir()
    for split, n in (("train", 300), ("t10k", 100)):
        (mnist / f"{split}-images-idx3-ubyte").write_bytes(idx(rng.integers(0, 256, (n, 28, 28))))
        (mnist / f"{split}-labels-idx1-ubyte").write_bytes(idx(rng.integers(0, 10, n)))
    return root


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models train far faster on one thread, and pytest -n 2 already fills two cores
    (intra-op threads only contend on a busy 2-core machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
