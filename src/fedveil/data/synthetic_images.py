"""Synthetic Gaussian images labelled by a random linear teacher (for benchmarks and tests).

Nothing here is real data: pixels are i.i.d. N(0, 1) and the label of an image is the
arg-max of a fixed random linear map of its pixels, so the task is learnable but says
nothing about accuracy on natural images. Generated in memory from ``seed``; ``root``
and ``download`` are unused.
"""
from __future__ import annotations

import os

import torch

from .arrays import ArrayDataset
from .errors import DataError
from .source import DATASETS, DataSource

CHUNK_ROWS = 8192  # rows generated (and labelled) at a time


def teacher_labels(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``argmax(x_flat @ weight.T)``: the class the linear teacher gives each image."""
    return (x.flatten(1) @ weight.T).argmax(dim=1)


def gaussian_images(
    rows: int, shape: tuple[int, int, int], weight: torch.Tensor, generator: torch.Generator
) -> ArrayDataset:
    """``rows`` float32 N(0, 1) images of ``shape`` and their teacher labels."""
    x = torch.empty((rows, *shape), dtype=torch.float32)
    for start in range(0, rows, CHUNK_ROWS):
        stop = min(rows, start + CHUNK_ROWS)
        x[start:stop] = torch.randn((stop - start, *shape), generator=generator)
    return ArrayDataset(x, teacher_labels(x, weight), info={"classes": [str(c) for c in range(len(weight))]})


@DATASETS.register(
    "synthetic_images", "synthetic Gaussian images (any C x H x W) labelled by a random linear teacher"
)
def load_synthetic_images(
    root: str | os.PathLike | None = None,
    *,
    download: bool = True,
    seed: int = 0,
    channels: int = 1,
    height: int = 28,
    width: int = 28,
    rows: int = 10000,
    num_classes: int = 10,
    test_rows: int = 0,
    groups: int = 0,
) -> DataSource:
    """``rows`` training images of shape ``(channels, height, width)``, pixels i.i.d.
    N(0, 1), label ``argmax(W x)`` for a fixed teacher ``W ~ N(0, 1)`` of shape
    ``(num_classes, C*H*W)``. ``test_rows`` > 0 adds a separate test set from the same
    distribution (then ``data.test_fraction = 0`` leaves every row to training).
    ``groups`` > 0 adds ``groups["group"] = row index mod groups`` (a group label for
    methods that need one, e.g. FADE's benchmark round).
    """
    for name, value in (("channels", channels), ("height", height), ("width", width), ("rows", rows)):
        if not isinstance(value, int) or value < 1:
            raise DataError(f"{name} must be an int >= 1, got {value!r}")
    if not isinstance(num_classes, int) or num_classes < 2:
        raise DataError(f"num_classes must be an int >= 2, got {num_classes!r}")
    if not isinstance(test_rows, int) or test_rows < 0:
        raise DataError(f"test_rows must be an int >= 0, got {test_rows!r}")
    if not isinstance(groups, int) or groups < 0:
        raise DataError(f"groups must be an int >= 0, got {groups!r}")
    generator = torch.Generator().manual_seed(seed)
    shape = (channels, height, width)
    weight = torch.randn((num_classes, channels * height * width), generator=generator, dtype=torch.float32)
    train = gaussian_images(rows, shape, weight, generator)
    train.info["teacher"] = weight
    test = gaussian_images(test_rows, shape, weight, generator) if test_rows else None
    if groups:
        for part in (p for p in (train, test) if p is not None):
            part.groups["group"] = torch.arange(len(part)) % groups
    return DataSource(train=train, test=test, task="classification", num_classes=num_classes, synthetic=True)
