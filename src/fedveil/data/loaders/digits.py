"""scikit-learn's bundled 8x8 handwritten digits (UCI optdigits test set, 1,797 images).

Needs no download, so it is the default data set and a real (not synthetic) domain-shift
partner for MNIST: other writers, other resolution.
"""
from __future__ import annotations

import os

import numpy as np
import torch
from sklearn.datasets import load_digits as _sklearn_digits

from ..arrays import ArrayDataset
from ..source import DATASETS, DataSource

GREY_LEVELS = 16  # optdigits pixels count set bits in 4x4 blocks: 0..16


@DATASETS.register("digits", "scikit-learn's 1,797 8x8 handwritten digits, bundled (no download)")
def load_digits(root: str | os.PathLike | None = None, *, download: bool = True) -> DataSource:
    """All 1,797 digits as one train split: x (N, 1, 8, 8) float32 = pixel / 16, y int64.

    ``root`` and ``download`` are accepted like every loader's and unused: the data ship
    with scikit-learn.
    """
    bunch = _sklearn_digits()
    x = torch.from_numpy((bunch.images / GREY_LEVELS).astype(np.float32)).unsqueeze(1)
    y = torch.from_numpy(bunch.target.astype(np.int64))
    train = ArrayDataset(x, y, info={"classes": [str(c) for c in bunch.target_names]})
    return DataSource(train, None, "classification", len(bunch.target_names))
