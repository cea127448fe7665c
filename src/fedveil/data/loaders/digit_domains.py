"""Five digit domains made from disjoint MNIST rows: a stand-in for FedBN's Digits benchmark.

Split-Mix's feature non-IID setting (Hong et al. 2022, after FedBN) uses MNIST, SVHN, USPS,
SynthDigits and MNIST-M at 3x28x28. Only MNIST is at hand offline, so four domains imitate
the others, each made from its own MNIST rows (never the same digits recoloured):

0 ``mnist``        the digits as they are, grey copied to 3 channels;
1 ``svhn_like``    a house-number crop: the digit enlarged, flanked by parts of other digits
                   in its colour, light on dark or dark on light over a shaded colour
                   background; blurred, with sensor noise;
2 ``usps_like``    USPS's format: the digit's bounding box scaled (aspect kept) to fill the
                   frame, taken down to USPS's 16x16 and back up to 28x28 (blurry), grey;
3 ``synth_like``   SynthDigits' rendered look: bold strokes, random rotation, scale and shift,
                   flat random foreground and background colours of different brightness;
4 ``mnistm_like``  MNIST-M's recipe (Ganin & Lempitsky 2015): ``|patch - digit|`` for a random
                   28x28 crop of a colour photo (scikit-learn's china.jpg and flower.jpg in
                   place of BSDS500).

``include_sklearn_digits`` adds domain 5, ``sklearn_digits``: scikit-learn's real 8x8
optdigits (other writers) upsampled into MNIST's central 20x20 box. Images are (3, 28, 28)
in [0, 1], not normalised (adversarial training needs that range).
"""
from __future__ import annotations

import math
import os
from functools import lru_cache
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_sample_images

from ..arrays import ArrayDataset
from ..errors import DataError
from ..source import DATASETS, DataSource
from .digits import load_digits
from .mnist import load_mnist

SIDE = 28
USPS_SIDE = 16
PHOTO_SCALE = 0.5
INK = 0.2  # a pixel above this is part of the digit (bounding boxes)
LUMA = (0.299, 0.587, 0.114)
Domain = Callable[[torch.Tensor, np.random.Generator], torch.Tensor]


# --- image helpers ------------------------------------------------------------------------


def affine(x: torch.Tensor, scale: np.ndarray, degrees: np.ndarray, shift: np.ndarray) -> torch.Tensor:
    """Every image scaled by ``scale``, rotated by ``degrees`` and moved by ``shift`` (x, y)
    pixels about the centre, zero outside (bilinear)."""
    angle = torch.from_numpy(np.radians(degrees)).float()
    s = torch.from_numpy(np.asarray(scale, dtype=np.float32))
    cos, sin = torch.cos(angle) / s, torch.sin(angle) / s
    inverse = torch.stack([torch.stack([cos, sin], 1), torch.stack([-sin, cos], 1)], 1)  # (N, 2, 2)
    move = torch.from_numpy(np.asarray(shift, dtype=np.float32)) * 2 / x.shape[-1]
    theta = torch.cat([inverse, -(inverse @ move.unsqueeze(2))], 2)
    return sample(x, theta)


def sample(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """``F.grid_sample`` of ``x`` on the affine grid ``theta`` (output -> input coordinates)."""
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def blur(x: torch.Tensor, sigma: float) -> torch.Tensor:
    """Separable Gaussian blur of std ``sigma`` pixels, edges reflected."""
    radius = max(1, math.ceil(2 * sigma))
    taps = torch.exp(-torch.arange(-radius, radius + 1, dtype=torch.float32) ** 2 / (2 * sigma**2))
    taps = (taps / taps.sum()).repeat(x.shape[1], 1, 1, 1)  # (C, 1, 1, K)
    x = F.conv2d(F.pad(x, (radius, radius, 0, 0), mode="reflect"), taps, groups=x.shape[1])
    return F.conv2d(F.pad(x, (0, 0, radius, radius), mode="reflect"), taps.transpose(2, 3), groups=x.shape[1])


def smooth_field(n: int, cells: int, rng: np.random.Generator) -> torch.Tensor:
    """(n, 3, 28, 28) colour noise in [0, 1], smooth on the scale of a ``cells`` x ``cells`` grid."""
    coarse = torch.from_numpy(rng.random((n, 3, cells, cells), dtype=np.float32))
    return F.interpolate(coarse, size=(SIDE, SIDE), mode="bilinear", align_corners=False)


def luma(colours: np.ndarray) -> np.ndarray:
    """Brightness of (n, 3) RGB colours."""
    return colours @ np.array(LUMA)


def contrasting_colours(n: int, gap: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Random (n, 3) foreground and background colours whose brightness differs by >= ``gap``;
    foregrounds too close to their background are redrawn."""
    fg, bg = rng.random((n, 3)), rng.random((n, 3))
    close = np.abs(luma(fg) - luma(bg)) < gap
    while close.any():
        fg[close] = rng.random((int(close.sum()), 3))
        close = np.abs(luma(fg) - luma(bg)) < gap
    return fg, bg


def paint(mask: torch.Tensor, fg: np.ndarray, background: torch.Tensor) -> torch.Tensor:
    """``mask`` (N, 1, H, W) in [0, 1] coloured ``fg`` (N, 3) over ``background`` (N, 3, H, W)."""
    colour = torch.from_numpy(fg).float()[:, :, None, None]
    return mask * colour + (1 - mask) * background


def flat(colours: np.ndarray) -> torch.Tensor:
    """(N, 3) colours as constant (N, 3, 28, 28) images."""
    return torch.from_numpy(colours).float()[:, :, None, None].expand(-1, -1, SIDE, SIDE)


def grey(x: torch.Tensor) -> torch.Tensor:
    """(N, 1, H, W) -> (N, 3, H, W), the channel copied."""
    return x.repeat(1, 3, 1, 1)


# --- the domains: (N, 1, 28, 28) MNIST in [0, 1] -> (N, 3, 28, 28) in [0, 1] --------------


def as_mnist(x: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """MNIST as FedBN feeds it: grey copied to 3 channels."""
    return grey(x)


def flanking_digits(x: torch.Tensor, scale: np.ndarray, rng: np.random.Generator) -> torch.Tensor:
    """Other rows' digits pushed 17-22 pixels left and right (each side present with
    probability 0.6): the neighbouring digits of a house number, cut by the frame."""
    n, out = len(x), torch.zeros_like(x)
    for side in (-1, 1):
        other = x[torch.from_numpy(rng.permutation(n))]
        shift = np.stack([side * rng.uniform(17, 22, n), rng.uniform(-2, 2, n)], 1)
        present = torch.from_numpy(rng.random(n) < 0.6).float()[:, None, None, None]
        out = torch.maximum(out, present * affine(other, scale, np.zeros(n), shift))
    return out


def as_svhn(x: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """SVHN-like: enlarged digit and flanking digits, light on dark or dark on light over a
    shaded colour background, blurred, with Gaussian noise."""
    n = len(x)
    scale = rng.uniform(1.1, 1.3, n)
    digit = affine(x, scale, rng.uniform(-8, 8, n), rng.uniform(-1.5, 1.5, (n, 2)))
    mask = torch.maximum(digit, flanking_digits(x, scale, rng))
    dark, light = rng.uniform(0.0, 0.4, (n, 3)), rng.uniform(0.55, 1.0, (n, 3))
    light_digit = rng.random((n, 1)) < 0.5
    fg, bg = np.where(light_digit, light, dark), np.where(light_digit, dark, light)
    shading = 0.4 * (smooth_field(n, 3, rng) - 0.5) + 0.15 * (smooth_field(n, 7, rng) - 0.5)
    image = blur(paint(mask, fg, flat(bg) + shading), 0.7)
    noise = torch.from_numpy(rng.normal(0.0, 0.03, image.shape).astype(np.float32))
    return (image + noise).clamp(0, 1)


def fill_frame(x: torch.Tensor) -> torch.Tensor:
    """Each digit's bounding box (pixels > ``INK``) scaled, aspect kept, to fill the frame;
    blank images are left as they are."""
    ink = x[:, 0] > INK
    spans = [bounds(ink.any(dim)) for dim in (1, 2)]  # columns (x), rows (y)
    (x0, x1), (y0, y1) = spans
    half = torch.maximum(x1 - x0, y1 - y0) / x.shape[-1]  # half the box side, normalised
    centre = torch.stack([x0 + x1, y0 + y1], 1) / x.shape[-1] - 1
    blank = ~ink.flatten(1).any(1)
    half = torch.where(blank, torch.ones_like(half), half)
    centre = torch.where(blank[:, None], torch.zeros_like(centre), centre)
    theta = torch.zeros(len(x), 2, 3)
    theta[:, 0, 0] = theta[:, 1, 1] = half
    theta[:, :, 2] = centre
    return sample(x, theta)


def bounds(used: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """First used index and one past the last of every row of ``used`` (N, L), as floats."""
    index = torch.arange(used.shape[1]).expand_as(used)
    first = torch.where(used, index, used.shape[1]).min(1).values
    last = torch.where(used, index, -1).max(1).values
    return first.float(), (last + 1).float()


def as_usps(x: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """USPS-like: digit filling the frame, through 16x16 and back to 28x28, grey 3 channels."""
    small = F.interpolate(fill_frame(x), size=(USPS_SIDE, USPS_SIDE), mode="area")
    return grey(F.interpolate(small, size=(SIDE, SIDE), mode="bilinear", align_corners=False).clamp(0, 1))


def as_synth(x: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """SynthDigits-like: bold strokes (3x3 dilation), random rotation / scale / shift, flat
    random colours of different brightness, slightly blurred."""
    n = len(x)
    bold = F.max_pool2d(x, 3, stride=1, padding=1)
    mask = affine(bold, rng.uniform(0.8, 1.05, n), rng.uniform(-15, 15, n), rng.uniform(-2, 2, (n, 2)))
    fg, bg = contrasting_colours(n, 0.3, rng)
    return blur(paint(mask, fg, flat(bg)), 0.5).clamp(0, 1)


@lru_cache(maxsize=1)
def sample_photos() -> torch.Tensor:
    """scikit-learn's bundled photos (china.jpg, flower.jpg), halved to (2, 3, 213, 320) in
    [0, 1] so that a 28x28 patch holds about as much texture as MNIST-M's BSDS500 patches."""
    images = torch.from_numpy(np.stack(load_sample_images().images)).permute(0, 3, 1, 2).float() / 255.0
    return F.interpolate(images, scale_factor=PHOTO_SCALE, mode="area")


def photo_patches(n: int, rng: np.random.Generator) -> torch.Tensor:
    """``n`` random 28x28 crops of the sample photos, (n, 3, 28, 28)."""
    photos = sample_photos()
    which = torch.from_numpy(rng.integers(0, len(photos), n))
    top = torch.from_numpy(rng.integers(0, photos.shape[2] - SIDE + 1, n))
    left = torch.from_numpy(rng.integers(0, photos.shape[3] - SIDE + 1, n))
    step = torch.arange(SIDE)
    rows = (top[:, None] + step)[:, None, :, None]
    cols = (left[:, None] + step)[:, None, None, :]
    return photos[which[:, None, None, None], torch.arange(3)[None, :, None, None], rows, cols]


def as_mnistm(x: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """MNIST-M's blend: ``|photo patch - digit|``, so the digit inverts the photo's colours."""
    return (photo_patches(len(x), rng) - x).abs()


DOMAINS: dict[str, Domain] = {
    "mnist": as_mnist, "svhn_like": as_svhn, "usps_like": as_usps, "synth_like": as_synth, "mnistm_like": as_mnistm,
}
SKLEARN_DOMAIN = "sklearn_digits"


def optdigits_in_mnist_frame(x: torch.Tensor) -> torch.Tensor:
    """(N, 1, 8, 8) optdigits in [0, 1] -> (N, 3, 28, 28): upsampled into MNIST's central 20x20 box."""
    box = F.interpolate(x.float(), size=(20, 20), mode="bilinear", align_corners=False)
    return grey(F.pad(box, (4, 4, 4, 4)).clamp(0, 1))


# --- the loader ---------------------------------------------------------------------------


def mnist_rows(root: str | os.PathLike | None, download: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """MNIST's train and test rows pooled: x (N, 1, 28, 28) in [0, 1], y (N,)."""
    mnist = load_mnist(root, download=download)
    parts = [mnist.train] + ([mnist.test] if mnist.test is not None else [])
    return torch.cat([p.x for p in parts]).float(), torch.cat([p.y for p in parts]).long()


def check_counts(rows: int, test_rows: int, with_sklearn: bool) -> None:
    """Raise a DataError unless the row counts are whole and, with the scikit-learn domain,
    within its 1,797 digits."""
    if not isinstance(rows, int) or rows < 1:
        raise DataError(f"rows_per_domain must be an int >= 1, got {rows!r}")
    if not isinstance(test_rows, int) or test_rows < 0:
        raise DataError(f"test_rows_per_domain must be an int >= 0, got {test_rows!r}")
    digits = len(load_digits().train) if with_sklearn else 0
    if with_sklearn and rows + test_rows > digits:
        raise DataError(
            f"include_sklearn_digits: rows_per_domain={rows} + test_rows_per_domain={test_rows} exceeds "
            f"scikit-learn's {digits} digits; lower them to at most {digits} in all"
        )


def check_mnist_size(rows: int, test_rows: int, available: int) -> None:
    """Raise a DataError when the MNIST files hold too few rows for disjoint domains."""
    need = len(DOMAINS) * (rows + test_rows)
    if need > available:
        raise DataError(
            f"rows_per_domain={rows} + test_rows_per_domain={test_rows} for {len(DOMAINS)} domains need "
            f"{need} MNIST rows but MNIST has {available}; lower them to at most "
            f"{available // len(DOMAINS)} in all"
        )


def cut(images: torch.Tensor, labels: torch.Tensor, rows: np.ndarray, n: int, train: list, test: list) -> None:
    """Append a domain's first ``n`` (images, labels, source rows) to ``train``, the rest to ``test``."""
    train.append((images[:n], labels[:n], rows[:n]))
    test.append((images[n:], labels[n:], rows[n:]))


def shrunk(parts: list[tuple[torch.Tensor, torch.Tensor, np.ndarray]], size: int) -> list:
    """Each domain's images area-averaged to ``size x size`` (values stay in [0, 1])."""
    return [(F.interpolate(x, size=(size, size), mode="area"), y, rows) for x, y, rows in parts]


def assemble(parts: list[tuple[torch.Tensor, torch.Tensor, np.ndarray]], info: dict) -> ArrayDataset:
    """Domains' (images, labels, source rows) stacked domain by domain, ``groups["domain"]``
    the domain id and ``groups["source_row"]`` the row in the domain's source."""
    domain = torch.cat([torch.full((len(y),), d, dtype=torch.long) for d, (_, y, _) in enumerate(parts)])
    source_row = torch.cat([torch.from_numpy(r).long() for _, _, r in parts])
    x, y = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    return ArrayDataset(x.contiguous(), y, {"domain": domain, "source_row": source_row}, dict(info))


@DATASETS.register(
    "digit_domains_synthetic",
    "FedBN Digits stand-in: MNIST plus SVHN/USPS/SynthDigits/MNIST-M-like synthetic domains, 3x28x28",
)
def load_digit_domains_synthetic(
    root: str | os.PathLike | None = None,
    *,
    download: bool = True,
    seed: int = 0,
    rows_per_domain: int = 1000,
    test_rows_per_domain: int = 0,
    include_sklearn_digits: bool = False,
    size: int = 28,
) -> DataSource:
    """``rows_per_domain`` training rows per domain (module docstring), domain by domain,
    each domain from its own random MNIST rows (train and test files pooled; ``root`` is
    MNIST's data directory). ``test_rows_per_domain`` > 0 adds a separate test split from
    further unused rows, in the same domains. ``groups["domain"]`` is the domain id and
    ``groups["source_row"]`` the row in MNIST (in scikit-learn's digits for domain 5).
    ``size`` < 28 shrinks every image to ``size x size`` by area averaging (CPU-scale runs).
    """
    check_counts(rows_per_domain, test_rows_per_domain, include_sklearn_digits)
    if isinstance(size, bool) or not isinstance(size, int) or not 4 <= size <= SIDE:
        raise DataError(f"size must be an int in 4..{SIDE} (the images' side), got {size!r}")
    x, y = mnist_rows(root, download)
    check_mnist_size(rows_per_domain, test_rows_per_domain, len(x))
    seeds = np.random.SeedSequence(seed).spawn(len(DOMAINS) + 2)
    rngs = [np.random.default_rng(s) for s in seeds]
    per_domain = rows_per_domain + test_rows_per_domain
    chosen = rngs[0].permutation(len(x))[: len(DOMAINS) * per_domain].reshape(len(DOMAINS), per_domain)
    train, test = [], []
    for d, make in enumerate(DOMAINS.values()):
        index = torch.from_numpy(chosen[d])
        cut(make(x[index], rngs[1 + d]), y[index], chosen[d], rows_per_domain, train, test)
    names = list(DOMAINS)
    if include_sklearn_digits:
        digits = load_digits().train
        rows = rngs[-1].permutation(len(digits))[:per_domain]
        index = torch.from_numpy(rows)
        cut(optdigits_in_mnist_frame(digits.x[index]), digits.y[index].long(), rows, rows_per_domain, train, test)
        names.append(SKLEARN_DOMAIN)
    if size != SIDE:
        train, test = shrunk(train, size), shrunk(test, size)
    info = {"classes": [str(c) for c in range(10)], "domain_names": names}
    return DataSource(
        train=assemble(train, info), test=assemble(test, info) if test_rows_per_domain else None,
        task="classification", num_classes=10, natural_groups="domain", synthetic=True,
    )
