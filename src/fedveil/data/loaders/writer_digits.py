"""Synthetic "writers" made from real MNIST digits: a FEMNIST-like stand-in (not FEMNIST).

FEMNIST (LEAF) splits EMNIST's handwritten characters by their 3,500 writers: every client
is one person, with their own handwriting and their own skewed mix of characters and
amount of data. EMNIST is not available offline, so ``writer_digits_synthetic`` imitates
that structure on MNIST's 10 digits (not FEMNIST's 62 classes, and no real writer ids):

* **disjoint rows**: every writer gets its own MNIST rows (train and test files pooled),
  no row goes to two writers;
* **quantity skew**: writer sizes are log-normal around ``rows_per_writer`` (spread
  ``rows_spread``, the log-normal sigma), at least ``min_rows_per_writer``;
* **label skew**: every writer's class proportions are drawn from Dir(``label_alpha``)
  over all 10 classes, or, with ``classes_per_writer = [lo, hi]``, over ``k`` classes
  drawn at random with ``k`` uniform in ``lo..hi``;
* **handwriting style**: every writer draws one style from its own seed and all its
  digits are rendered with it, in this order: stroke thickness (``stroke`` > 0 blends
  towards a 3x3 max-pool, i.e. dilation, < 0 towards a 3x3 min-pool, erosion), an affine
  transform about the image centre (``scale``, ``shear`` = horizontal slant factor,
  ``rotation`` in degrees, ``shift`` (x, y) in pixels), ink contrast and brightness
  (``x * contrast + brightness``) and Gaussian pixel noise of std ``noise``, clipped to
  [0, 1]. Ranges at ``style_strength = 1``: rotation +-15 degrees, scale 1 +- 0.1, shear
  +-0.3, shift +-2 px, stroke +-0.7, contrast 1 +- 0.3, brightness +-0.1, noise 0..0.08;
  ``style_strength`` multiplies every range (0: plain MNIST digits).

``include_sklearn_digits`` adds scikit-learn's 1,797 real 8x8 optdigits (other writers),
upsampled into MNIST's central 20x20 box, to the pool the writers draw from.

The result is one training set (no test split: clients' test rows come from
``data.test_fraction``) of (1, size, size) grey images in [0, 1] with
``groups["writer"]`` the writer id, ``groups["source"]`` 0 = MNIST / 1 = scikit-learn
digits and ``groups["source_row"]`` the row in that source (MNIST train rows first, then
t10k). ``natural_groups`` is ``"writer"``, so ``[data.partition] name = "natural"``,
``key = "writer"`` with ``data.num_clients = num_writers`` gives one client per writer.
"""
from __future__ import annotations

import math
import os

import numpy as np
import torch
import torch.nn.functional as F

from ..arrays import ArrayDataset
from ..errors import DataError
from ..source import DATASETS, DataSource
from .digit_domains import mnist_rows, sample
from .digits import load_digits

NAME = "writer_digits_synthetic"
SIDE = 28
NUM_CLASSES = 10
SOURCES = ("mnist", "sklearn_digits")
# Style ranges at style_strength = 1: a parameter is centre + half_width * u, u ~ U(-1, 1)
# (noise: half_width * (u + 1) / 2, i.e. U(0, 0.08)).
STYLE_RANGES = {
    "rotation": (0.0, 15.0),
    "scale": (1.0, 0.1),
    "shear": (0.0, 0.3),
    "shift_x": (0.0, 2.0),
    "shift_y": (0.0, 2.0),
    "stroke": (0.0, 0.7),
    "contrast": (1.0, 0.3),
    "brightness": (0.0, 0.1),
    "noise": (0.0, 0.08),
}
MAX_STYLE_STRENGTH = 2.0


# --- one writer's style -------------------------------------------------------------------


def draw_style(rng: np.random.Generator, strength: float) -> dict:
    """A writer's style: one U(-1, 1) draw per parameter of ``STYLE_RANGES`` (in that
    order), scaled by ``strength``; stroke is clipped to [-1, 1], scale and contrast kept > 0."""
    u = dict(zip(STYLE_RANGES, rng.uniform(-1.0, 1.0, len(STYLE_RANGES))))
    value = {k: centre + strength * half * u[k] for k, (centre, half) in STYLE_RANGES.items()}
    value["noise"] = strength * STYLE_RANGES["noise"][1] * (u["noise"] + 1) / 2
    value["stroke"] = float(np.clip(value["stroke"], -1.0, 1.0))
    value["scale"] = max(value["scale"], 0.5)
    value["contrast"] = max(value["contrast"], 0.1)
    shift = [float(value.pop("shift_x")), float(value.pop("shift_y"))]
    return {**{k: float(v) for k, v in value.items()}, "shift": shift}


def stroke_width(x: torch.Tensor, stroke: float) -> torch.Tensor:
    """Thicker (``stroke`` > 0: towards a 3x3 max-pool, dilation) or thinner (< 0: towards
    a 3x3 min-pool, erosion) strokes; ``|stroke|`` <= 1 is the blend weight."""
    if stroke > 0:
        return x + stroke * (F.max_pool2d(x, 3, stride=1, padding=1) - x)
    if stroke < 0:
        return x - stroke * (-F.max_pool2d(-x, 3, stride=1, padding=1) - x)
    return x


def style_theta(style: dict, side: int = SIDE) -> torch.Tensor:
    """(2, 3) ``affine_grid`` matrix (output -> input, normalised coordinates) of the forward
    map p -> R(rotation) Shear(shear) Scale(scale) p + shift about the image centre."""
    a = math.radians(style["rotation"])
    rotate = np.array([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]])
    forward = rotate @ np.array([[1.0, style["shear"]], [0.0, 1.0]]) * style["scale"]
    inverse = np.linalg.inv(forward)
    move = np.asarray(style["shift"], dtype=np.float64) * 2 / side
    return torch.from_numpy(np.concatenate([inverse, -(inverse @ move)[:, None]], 1)).float()


def render(x: torch.Tensor, style: dict, rng: np.random.Generator | None) -> torch.Tensor:
    """(N, 1, 28, 28) digits in [0, 1] written in ``style``; the pixel noise is drawn from
    ``rng`` (``None``: no noise)."""
    if len(x) == 0:
        return x
    x = stroke_width(x, style["stroke"])
    x = sample(x, style_theta(style, x.shape[-1]).expand(len(x), 2, 3))
    x = x * style["contrast"] + style["brightness"]
    if rng is not None and style["noise"] > 0:
        x = x + torch.from_numpy(rng.normal(0.0, style["noise"], tuple(x.shape)).astype(np.float32))
    return x.clamp(0, 1)


# --- who writes what ----------------------------------------------------------------------


def writer_sizes(num_writers: int, mean: int, spread: float, minimum: int, rng: np.random.Generator) -> np.ndarray:
    """Log-normal sizes with mean ``mean`` (sigma ``spread``), rounded, at least ``minimum``."""
    z = rng.standard_normal(num_writers)
    return np.maximum(minimum, np.rint(mean * np.exp(spread * z - spread**2 / 2))).astype(np.int64)


def class_weights(
    num_writers: int, alpha: float, classes: tuple[int, int] | None, rng: np.random.Generator
) -> tuple[np.ndarray, list[list[int]]]:
    """(W, 10) class proportions: Dir(alpha) over all classes, or over ``k`` random classes
    with ``k`` uniform in ``classes = (lo, hi)``; and each writer's allowed classes."""
    weights = np.zeros((num_writers, NUM_CLASSES))
    allowed = []
    for w in range(num_writers):
        if classes is None:
            own = np.arange(NUM_CLASSES)
        else:
            own = np.sort(rng.choice(NUM_CLASSES, int(rng.integers(classes[0], classes[1] + 1)), replace=False))
        weights[w, own] = rng.dirichlet(np.full(len(own), alpha)) + 1e-12  # Dir may underflow to 0
        allowed.append(own.tolist())
    return weights, allowed


def label_counts(sizes: np.ndarray, weights: np.ndarray, available: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """(W, 10) rows of each class per writer, writer by writer: a multinomial draw of the
    writer's size with its class weights; where a class has run out of rows, the shortfall
    is drawn again over the writer's classes that still have rows."""
    left = available.astype(np.int64).copy()
    counts = np.zeros_like(weights, dtype=np.int64)
    for w, need in enumerate(sizes):
        need = int(need)
        while need:
            p = weights[w] * (left > 0)
            if p.sum() == 0:
                gone = np.flatnonzero(weights[w]).tolist()
                raise DataError(
                    f"{NAME}: writer {w}'s classes {gone} ran out of rows ({int(counts[w].sum())} of its "
                    f"{int(sizes[w])} rows found); widen classes_per_writer or lower rows_per_writer / num_writers"
                )
            take = np.minimum(rng.multinomial(need, p / p.sum()), left)
            counts[w] += take
            left -= take
            need -= int(take.sum())
    return counts


def pick_rows(counts: np.ndarray, labels: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Every writer's pool rows: per class a random order of the class's rows, dealt out
    writer by writer (so no row goes to two writers), each writer's rows then shuffled."""
    order = [rng.permutation(np.flatnonzero(labels == c)) for c in range(NUM_CLASSES)]
    start = np.zeros(NUM_CLASSES, dtype=np.int64)
    rows = []
    for writer in counts:
        own = np.concatenate([order[c][start[c] : start[c] + writer[c]] for c in range(NUM_CLASSES)])
        start += writer
        rows.append(rng.permutation(own))
    return rows


# --- the pool of real digits --------------------------------------------------------------


def optdigits_as_mnist(x: torch.Tensor) -> torch.Tensor:
    """(N, 1, 8, 8) optdigits in [0, 1] -> (N, 1, 28, 28), upsampled into the central 20x20 box."""
    box = F.interpolate(x.float(), size=(20, 20), mode="bilinear", align_corners=False)
    return F.pad(box, (4, 4, 4, 4)).clamp(0, 1)


def digit_pool(root, download: bool, with_sklearn: bool) -> tuple[torch.Tensor, torch.Tensor, np.ndarray, np.ndarray]:
    """Images (N, 1, 28, 28), labels, source id and row in that source of every usable digit."""
    try:
        x, y = mnist_rows(root, download)
    except DataError as err:
        raise DataError(f"{NAME} draws its writers' digits from MNIST (data.root = MNIST's folder): {err}") from err
    source, row = np.zeros(len(x), np.int64), np.arange(len(x))
    if with_sklearn:
        digits = load_digits().train
        x, y = torch.cat([x, optdigits_as_mnist(digits.x)]), torch.cat([y, digits.y.long()])
        source = np.concatenate([source, np.ones(len(digits), np.int64)])
        row = np.concatenate([row, np.arange(len(digits))])
    return x, y, source, row


# --- options ------------------------------------------------------------------------------


def whole(name: str, value, low: int) -> int:
    """Option ``name``'s ``value`` if it is an int >= ``low``, else a DataError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise DataError(f"{NAME}: {name} must be an int >= {low}, got {value!r}")
    return value


def real(name: str, value, low: float, high: float, low_open: bool = False) -> float:
    """Option ``name``'s ``value`` as a float if it is a finite number
    in [low, high] ((low, high] with ``low_open``), else a DataError."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value > high or value < low or (low_open and value == low):
        bound = f"in ({low}, {high}]" if low_open else f"in [{low}, {high}]"
        raise DataError(f"{NAME}: {name} must be a number {bound}, got {value!r}")
    return float(value)


def class_range(value) -> tuple[int, int] | None:
    """``classes_per_writer``: None, an int k (exactly k classes) or [lo, hi] in 1..10."""
    if value is None:
        return None
    pair = [value, value] if isinstance(value, int) and not isinstance(value, bool) else value
    if (
        not isinstance(pair, (list, tuple)) or len(pair) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair)
        or not 1 <= pair[0] <= pair[1] <= NUM_CLASSES
    ):
        raise DataError(
            f"{NAME}: classes_per_writer must be an int or a pair [lo, hi] with 1 <= lo <= hi <= {NUM_CLASSES}, "
            f"got {value!r}"
        )
    return int(pair[0]), int(pair[1])


# --- the loader ---------------------------------------------------------------------------


@DATASETS.register(
    NAME,
    "FEMNIST stand-in: synthetic writers (own style, label and size skew) from disjoint real MNIST digits, 1x28x28",
)
def load_writer_digits_synthetic(
    root: str | os.PathLike | None = None,
    *,
    download: bool = True,
    seed: int = 0,
    num_writers: int = 100,
    rows_per_writer: int = 100,
    rows_spread: float = 0.5,
    min_rows_per_writer: int = 10,
    label_alpha: float = 0.5,
    classes_per_writer: int | list[int] | None = None,
    style_strength: float = 1.0,
    include_sklearn_digits: bool = False,
    size: int = 28,
) -> DataSource:
    """``num_writers`` synthetic writers (module docstring) from disjoint rows of MNIST
    (``root`` is MNIST's data directory; train and test files are pooled), as one training
    set ordered writer by writer. ``rows_spread`` 0 gives every writer exactly
    ``rows_per_writer`` rows. ``size`` < 28 area-averages every image to ``size x size``.
    ``info["writer_style"][w]`` is writer ``w``'s style, a function of ``seed`` and ``w`` only.
    """
    whole("num_writers", num_writers, 1)
    whole("min_rows_per_writer", min_rows_per_writer, 1)
    whole("rows_per_writer", rows_per_writer, min_rows_per_writer)
    spread = real("rows_spread", rows_spread, 0.0, 3.0)
    alpha = real("label_alpha", label_alpha, 0.0, 1e6, low_open=True)
    strength = real("style_strength", style_strength, 0.0, MAX_STYLE_STRENGTH)
    classes = class_range(classes_per_writer)
    if isinstance(size, bool) or not isinstance(size, int) or not 4 <= size <= SIDE:
        raise DataError(f"{NAME}: size must be an int in 4..{SIDE} (the images' side), got {size!r}")
    if not isinstance(include_sklearn_digits, bool):
        raise DataError(f"{NAME}: include_sklearn_digits must be true or false, got {include_sklearn_digits!r}")

    x, y, source, source_row = digit_pool(root, download, include_sklearn_digits)
    pool = "MNIST" + (" + scikit-learn's digits" if include_sklearn_digits else "")
    plan_seed, rows_seed, style_seed = np.random.SeedSequence(seed).spawn(3)
    plan = np.random.default_rng(plan_seed)
    sizes = writer_sizes(num_writers, rows_per_writer, spread, min_rows_per_writer, plan)
    if sizes.sum() > len(x):
        raise DataError(
            f"{NAME}: {num_writers} writers x about {rows_per_writer} rows (sizes drawn with rows_spread={spread}, "
            f"min_rows_per_writer={min_rows_per_writer}) need {int(sizes.sum())} rows but {pool} has {len(x)} "
            f"available; lower num_writers or rows_per_writer"
        )
    labels = y.numpy()
    weights, allowed = class_weights(num_writers, alpha, classes, plan)
    counts = label_counts(sizes, weights, np.bincount(labels, minlength=NUM_CLASSES)[:NUM_CLASSES], plan)
    rows = pick_rows(counts, labels, np.random.default_rng(rows_seed))

    images, styles = [], []
    for w, (own, child) in enumerate(zip(rows, style_seed.spawn(num_writers))):
        rng = np.random.default_rng(child)
        styles.append(draw_style(rng, strength))
        images.append(render(x[torch.from_numpy(own)], styles[-1], rng))
    chosen = np.concatenate(rows)
    images = torch.cat(images)
    if size != SIDE:
        images = F.interpolate(images, size=(size, size), mode="area")
    groups = {
        "writer": torch.from_numpy(np.repeat(np.arange(num_writers), sizes)).long(),
        "source": torch.from_numpy(source[chosen]).long(),
        "source_row": torch.from_numpy(source_row[chosen]).long(),
    }
    info = {
        "classes": [str(c) for c in range(NUM_CLASSES)],
        "writer_style": styles,
        "writer_classes": allowed,
        "sources": list(SOURCES[: 1 + include_sklearn_digits]),
    }
    train = ArrayDataset(images.contiguous(), y[torch.from_numpy(chosen)], groups, info)
    return DataSource(
        train=train, test=None, task="classification", num_classes=NUM_CLASSES,
        natural_groups="writer", synthetic=True,
    )
