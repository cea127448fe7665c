"""Fixtures shared by the reproduction tests."""
from __future__ import annotations

import struct

import numpy as np
import pytest


def idx_bytes(array: np.ndarray) -> bytes:
    """``array`` as an IDX file (MNIST's format): 0x0000, 0x08 (ubyte), ndim, big-endian dims, data."""
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(np.uint8).tobytes()


@pytest.fixture(scope="session")
def mnist_data_root(tmp_path_factory):
    """A data root whose ``mnist-10k`` holds 300 + 100 random 28x28 "digits" in the IDX format."""
    root, rng = tmp_path_factory.mktemp("data"), np.random.default_rng(0)
    mnist = root / "mnist-10k"
    mnist.mkdir()
    for split, n in (("train", 300), ("t10k", 100)):
        (mnist / f"{split}-images-idx3-ubyte").write_bytes(idx_bytes(rng.integers(0, 256, (n, 28, 28))))
        (mnist / f"{split}-labels-idx1-ubyte").write_bytes(idx_bytes(rng.integers(0, 10, n)))
    return root
