"""Tiny MNIST files in the real IDX format, for the loaders' and reproductions' tests (no ../shared data)."""
from __future__ import annotations

import struct

import numpy as np


def idx(array: np.ndarray, magic_type: int = 0x08) -> bytes:
    """``array`` (uint8) as an IDX file: 0x0000, the type byte (0x08: ubyte), ndim, big-endian dims, data."""
    header = bytes([0, 0, magic_type, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(np.uint8).tobytes()


def strokes(n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, 28, 28) uint8 "digits": a vertical and a horizontal bar at random places inside
    rows / columns 6..21 (away from the frame, as MNIST's digits are)."""
    images = np.zeros((n, 28, 28), dtype=np.uint8)
    for k in range(n):
        col, row, length = rng.integers(8, 18), rng.integers(7, 19), rng.integers(5, 12)
        images[k, 6:22, col : col + 3] = 255
        images[k, row : row + 3, 6 : 6 + length] = 200
    return images
