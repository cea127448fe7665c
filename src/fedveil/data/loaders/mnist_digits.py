"""Two real digit domains for unsupervised domain adaptation: MNIST and scikit-learn's digits.

The MNIST-USPS pair of FADE's digits experiment (Hong et al. 2021 §5.1) cannot be had
offline; MNIST (IDX files) and scikit-learn's bundled optdigits are a real pair with the
same ten classes and a genuine shift (other writers, binarised 32x32 scans vs grey
anti-aliased ones, stroke widths). Both are brought to optdigits' format, in which a digit
fills its frame: MNIST's digits are size-normalised into the central 20x20 box of the
28x28 image, so that box is cut out and shrunk to 8x8 by adaptive average pooling (torch's
"area" interpolation: 3x3 windows, overlapping by one pixel since 20 / 8 is not whole;
optdigits' 8x8 pixels count the set pixels of 4x4 blocks of a 32x32 bitmap, divided by 16
here). Values lie in [0, 1].
"""
from __future__ import annotations

import os

import numpy as np
import torch
import torch.nn.functional as F

from ..arrays import ArrayDataset
from ..errors import DataError
from ..source import DATASETS, DataSource
from .digits import load_digits
from .mnist import load_mnist

DOMAINS = ("mnist", "digits")  # domain ids 0 and 1
BOX = 4  # MNIST's margin around its 20x20 digit box
SIDE = 8  # optdigits' side


def mnist_as_optdigits(x: torch.Tensor) -> torch.Tensor:
    """(N, 28, 28) or (N, 1, 28, 28) MNIST pixels (0-255 or 0-1) -> (N, 1, 8, 8): the central
    20x20 box, adaptive-average-pooled to 8x8, in [0, 1]."""
    if tuple(x.shape[-2:]) != (28, 28):
        raise DataError(f"MNIST images must be 28x28, got {tuple(x.shape[-2:])}")
    x = x.float().reshape(len(x), 1, 28, 28)
    if x.max() > 1:
        x = x / 255.0
    box = x[..., BOX:-BOX, BOX:-BOX]
    return F.interpolate(box, size=(SIDE, SIDE), mode="area")


@DATASETS.register("mnist_digits", "real UDA pair: MNIST (domain 0) and scikit-learn digits (domain 1), both 8x8")
def load_mnist_digits(
    root: str | os.PathLike | None = None, *, download: bool = True, mnist_rows: int | None = None, seed: int = 0,
) -> DataSource:
    """MNIST rows (train and test files pooled; ``mnist_rows`` keeps a random subset) then
    the 1,797 scikit-learn digits, all (N, 1, 8, 8); ``groups["domain"]`` is 0 for MNIST and
    1 for digits. ``root`` is MNIST's data directory."""
    mnist = load_mnist(root, download=download)
    parts = [mnist.train] + ([mnist.test] if mnist.test is not None else [])
    x_m = mnist_as_optdigits(torch.cat([p.x for p in parts]))
    y_m = torch.cat([p.y for p in parts]).long()
    if mnist_rows is not None:
        if not 1 <= mnist_rows <= len(x_m):
            raise DataError(f"mnist_rows must be in 1..{len(x_m)}, got {mnist_rows}")
        keep = torch.from_numpy(np.sort(np.random.default_rng(seed).choice(len(x_m), mnist_rows, replace=False)))
        x_m, y_m = x_m[keep], y_m[keep]
    digits = load_digits().train
    x = torch.cat([x_m, digits.x.float()])
    y = torch.cat([y_m, digits.y.long()])
    domain = torch.cat([torch.zeros(len(x_m), dtype=torch.long), torch.ones(len(digits), dtype=torch.long)])
    info = {"classes": [str(c) for c in range(10)], "domain_names": list(DOMAINS)}
    return DataSource(ArrayDataset(x, y, {"domain": domain}, info), None, "classification", 10, natural_groups="domain")
