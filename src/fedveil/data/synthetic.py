"""Synthetic data sets: FedProx Synthetic(alpha, beta), rotated / patched digit domains,
and a many-class multi-domain image stand-in for Office / DomainNet.

All are generated in memory from ``seed`` (nothing is downloaded, ``root`` is unused),
have no separate test split, and are flagged ``synthetic=True``.
"""
from __future__ import annotations

import math
import os
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from scipy import ndimage

from .arrays import ArrayDataset
from .errors import DataError
from .source import DATASETS, DataSource

FEDPROX_FEATURES = 60
FEDPROX_CLASSES = 10
MAX_MASK_DRAWS = 100


def require(ok: bool, message: str) -> None:
    """A DataError with ``message`` unless ``ok``."""
    if not ok:
        raise DataError(message)


# --- FedProx Synthetic(alpha, beta) -------------------------------------------------------


def fedprox_models(
    alpha: float, beta: float, num_groups: int, iid: bool, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-device (W_k, b_k, v_k) of Li et al. 2020, §5.1 (FedProx, "Synthetic data").

    u_k ~ N(0, alpha), W_k ~ N(u_k, 1) (10 x 60), b_k ~ N(u_k, 1); B_k ~ N(0, beta),
    v_k ~ N(B_k, 1) elementwise. As in the authors' generator, alpha and beta are used as
    standard deviations. ``iid``: one W, b ~ N(0, 1) for all devices and v_k = 0.
    """
    shape_w, shape_b = (FEDPROX_CLASSES, FEDPROX_FEATURES), (FEDPROX_CLASSES,)
    if iid:
        w = np.broadcast_to(rng.normal(0.0, 1.0, shape_w), (num_groups, *shape_w)).copy()
        b = np.broadcast_to(rng.normal(0.0, 1.0, shape_b), (num_groups, *shape_b)).copy()
        return w, b, np.zeros((num_groups, FEDPROX_FEATURES))
    u = rng.normal(0.0, alpha, num_groups)
    big_b = rng.normal(0.0, beta, num_groups)
    w = rng.normal(u[:, None, None], 1.0, (num_groups, *shape_w))
    b = rng.normal(u[:, None], 1.0, (num_groups, *shape_b))
    v = rng.normal(big_b[:, None], 1.0, (num_groups, FEDPROX_FEATURES))
    return w, b, v


@DATASETS.register(
    "synthetic_fedprox", "synthetic FedProx Synthetic(alpha, beta): 60 features, 10 classes, power-law devices"
)
def load_synthetic_fedprox(
    root: str | os.PathLike | None = None,
    *,
    download: bool = True,
    seed: int = 0,
    alpha: float = 1.0,
    beta: float = 1.0,
    num_groups: int = 30,
    iid: bool = False,
    size_log_mean: float = 4.0,
    size_log_sigma: float = 2.0,
    min_size: int = 50,
) -> DataSource:
    """Synthetic(alpha, beta) of FedProx (Li et al. 2020, §5.1): device k draws
    x ~ N(v_k, Sigma) with Sigma_jj = j^-1.2 and labels y = argmax softmax(W_k x + b_k).

    Device sizes follow a power law, ``floor(LogNormal(size_log_mean, size_log_sigma)) +
    min_size`` (the authors' 4, 2 and 50). ``groups["client"]`` is the device id; the
    generating (W, b, v) are in ``info["generator"]`` as arrays indexed by device.
    """
    require(alpha >= 0 and beta >= 0, f"alpha and beta must be >= 0, got alpha={alpha}, beta={beta}")
    require(num_groups >= 1, f"num_groups must be >= 1, got {num_groups}")
    require(min_size >= 1 and size_log_sigma >= 0, "min_size must be >= 1 and size_log_sigma >= 0")
    rng = np.random.default_rng(seed)
    w, b, v = fedprox_models(alpha, beta, num_groups, iid, rng)
    sizes = rng.lognormal(size_log_mean, size_log_sigma, num_groups).astype(np.int64) + min_size
    std = np.arange(1, FEDPROX_FEATURES + 1, dtype=np.float64) ** (-1.2 / 2)
    xs, ys = [], []
    for k, n in enumerate(sizes):
        x = v[k] + rng.standard_normal((n, FEDPROX_FEATURES)) * std
        xs.append(x)
        ys.append(np.argmax(x @ w[k].T + b[k], axis=1))
    train = ArrayDataset(
        torch.from_numpy(np.concatenate(xs)).float(),
        torch.from_numpy(np.concatenate(ys)).long(),
        {"client": torch.repeat_interleave(torch.arange(num_groups), torch.from_numpy(sizes))},
        {"classes": [str(c) for c in range(FEDPROX_CLASSES)], "generator": {"W": w, "b": b, "v": v}},
    )
    return DataSource(
        train=train, test=None, task="classification", num_classes=FEDPROX_CLASSES,
        natural_groups="client", synthetic=True,
    )


# --- digit domains ------------------------------------------------------------------------


def base_digits(
    base: str, base_root: str | os.PathLike | None, download: bool, num_rows: int | None, rng: np.random.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gray digit images (N, 1, H, W) scaled to [0, 1] and their labels.

    ``"digits"``: scikit-learn's bundled 8x8 digits, pixel / 16. ``"mnist"``: train and test
    rows of the registered ``mnist`` loader (shuffled together, as in the MR-MTL setup),
    min-max scaled over the whole set. ``num_rows`` keeps a random subset.
    """
    if base == "digits":
        from sklearn.datasets import load_digits

        bunch = load_digits()
        x = torch.from_numpy(bunch.images / 16.0).float().unsqueeze(1)
        y = torch.from_numpy(bunch.target).long()
    elif base == "mnist":
        source = DATASETS.get("mnist")(base_root, download=download)
        parts = [source.train] + ([source.test] if source.test is not None else [])
        x = torch.cat([p.x for p in parts]).float()
        y = torch.cat([p.y for p in parts]).long()
        if x.dim() == 3:
            x = x.unsqueeze(1)
        require(x.dim() == 4 and x.shape[1] == 1, f"mnist images must be (N, 1, H, W), got {tuple(x.shape)}")
        x = (x - x.min()) / (x.max() - x.min())
    else:
        raise DataError(f"unknown base '{base}'; choose 'digits' (bundled 8x8) or 'mnist'")
    if num_rows is not None:
        require(1 <= num_rows <= len(x), f"num_rows must be in 1..{len(x)} for base '{base}', got {num_rows}")
        keep = torch.from_numpy(np.sort(rng.choice(len(x), num_rows, replace=False)))
        x, y = x[keep], y[keep]
    return x, y


def assign_domains(num_rows: int, num_domains: int, rng: np.random.Generator) -> np.ndarray:
    """A domain id per row: a random permutation cut into ``num_domains`` near-equal blocks."""
    require(
        1 <= num_domains <= num_rows,
        f"num_domains must be between 1 and the number of rows ({num_rows}), got {num_domains}",
    )
    domain = np.empty(num_rows, dtype=np.int64)
    for d, rows in enumerate(np.array_split(rng.permutation(num_rows), num_domains)):
        domain[rows] = d
    return domain


def rotate_images(x: torch.Tensor, angle: float) -> torch.Tensor:
    """Rotate images (..., H, W) counter-clockwise by ``angle`` degrees: exactly
    (``torch.rot90``) for multiples of 90, else bilinear with zero fill, same size."""
    if angle % 90 == 0:
        return torch.rot90(x, int(angle // 90) % 4, dims=(-2, -1))
    axes = (x.dim() - 1, x.dim() - 2)
    return torch.from_numpy(ndimage.rotate(x.numpy(), angle, axes=axes, reshape=False, order=1)).to(x.dtype)


def digit_domains(x: torch.Tensor, y: torch.Tensor, domain: np.ndarray, extra: dict, base: str) -> DataSource:
    """The :class:`DataSource` of 10-class digits ``x``, ``y`` with
    ``groups["domain"]`` and ``extra`` groups, flagged synthetic."""
    groups = {"domain": torch.from_numpy(domain), **extra}
    info = {"classes": [str(c) for c in range(10)], "base": base}
    return DataSource(
        train=ArrayDataset(x, y, groups, info), test=None, task="classification", num_classes=10,
        natural_groups="domain", synthetic=True,
    )


@DATASETS.register("rotated_digits", "synthetic rotation domains of a digit set (8x8 digits or MNIST)")
def load_rotated_digits(
    root: str | os.PathLike | None = None,
    *,
    download: bool = True,
    seed: int = 0,
    base: Literal["digits", "mnist"] = "digits",
    base_root: str | os.PathLike | None = None,
    num_domains: int | None = None,
    angles: list[float] | None = None,
    num_rows: int | None = None,
) -> DataSource:
    """Rotated digits: the rows are cut at random into disjoint domains and domain d is
    rotated by ``angles[d]`` degrees, by default d * 360 / num_domains (num_domains 4:
    0/90/180/270, the rotation clusters of Rotated MNIST in MR-MTL, Liu et al. 2022 §5).
    Rows keep the base order; ``groups["domain"]`` is the domain id.
    """
    if angles is None:
        num_domains = 4 if num_domains is None else num_domains
        require(num_domains >= 1, f"num_domains must be >= 1, got {num_domains}")
        angles = [d * 360.0 / num_domains for d in range(num_domains)]
    require(len(angles) >= 1, "angles must hold at least one angle")
    require(
        num_domains is None or num_domains == len(angles),
        f"got {len(angles)} angles but num_domains={num_domains}; drop num_domains or make them agree",
    )
    rng = np.random.default_rng(seed)
    x, y = base_digits(base, base_root, download, num_rows, rng)
    domain = assign_domains(len(x), len(angles), rng)
    for d, angle in enumerate(angles):
        rows = torch.from_numpy(np.flatnonzero(domain == d))
        x[rows] = rotate_images(x[rows], angle)
    return digit_domains(x, y, domain, {}, base)


def patch_masks(
    shape: tuple[int, int], num_domains: int, patch_size: int, mask_ratio: float, rng: np.random.Generator
) -> torch.Tensor:
    """One distinct mask per domain (num_domains, H, W): a grid of non-overlapping
    ``patch_size`` squares, each white (1) with probability ``mask_ratio``."""
    cells = (shape[0] // patch_size, shape[1] // patch_size)
    require(min(cells) >= 1, f"patch_size {patch_size} is larger than the {shape[0]}x{shape[1]} images")
    masks: list[np.ndarray] = []
    for _ in range(num_domains * MAX_MASK_DRAWS):
        grid = rng.random(cells) < mask_ratio
        if not any(np.array_equal(grid, m) for m in masks):
            masks.append(grid)
        if len(masks) == num_domains:
            break
    require(
        len(masks) == num_domains,
        f"could not draw {num_domains} distinct masks on a {cells[0]}x{cells[1]} patch grid with "
        f"mask_ratio={mask_ratio}; use fewer domains, a smaller patch_size or a mask_ratio nearer 0.5",
    )
    full = np.zeros((num_domains, *shape), dtype=np.float32)
    block = np.ones((patch_size, patch_size), dtype=np.float32)
    full[:, : cells[0] * patch_size, : cells[1] * patch_size] = np.stack([np.kron(m, block) for m in masks])
    return torch.from_numpy(full)


def minmax_per_image(x: torch.Tensor) -> torch.Tensor:
    """Rescale every image to [0, 1]; constant images are left as they are."""
    flat = x.flatten(1)
    low, high = flat.min(1).values, flat.max(1).values
    span = (high - low).view(-1, *[1] * (x.dim() - 1))
    scaled = (x - low.view_as(span)) / span.clamp_min(1e-12)
    return torch.where(span > 0, scaled, x)


@DATASETS.register("patched_digits", "synthetic masked-patch domains of a digit set (MR-MTL Rotated & Masked MNIST)")
def load_patched_digits(
    root: str | os.PathLike | None = None,
    *,
    download: bool = True,
    seed: int = 0,
    base: Literal["digits", "mnist"] = "digits",
    base_root: str | os.PathLike | None = None,
    num_domains: int = 4,
    patch_size: int = 2,
    mask_ratio: float = 0.5,
    rotation_groups: int = 1,
    num_rows: int | None = None,
) -> DataSource:
    """Masked digits of MR-MTL (Liu et al. 2022, §5, Rotated & Masked MNIST): each domain
    (silo) has a fixed mask, a grid of ``patch_size`` squares each white with probability
    ``mask_ratio``; ``img = max(img, mask)``, then per-image min-max rescaling.

    ``rotation_groups`` > 1 first rotates contiguous blocks of domains by b * 360 /
    rotation_groups degrees (the paper: 40 silos in 4 blocks of 10 at 0/90/180/270, i.e.
    ``num_domains=40, rotation_groups=4``); ``groups["rotation"]`` is the block id.
    """
    require(num_domains >= 1, f"num_domains must be >= 1, got {num_domains}")
    require(patch_size >= 1, f"patch_size must be >= 1, got {patch_size}")
    require(0.0 <= mask_ratio <= 1.0, f"mask_ratio must be in [0, 1], got {mask_ratio}")
    require(
        1 <= rotation_groups <= num_domains,
        f"rotation_groups must be between 1 and num_domains ({num_domains}), got {rotation_groups}",
    )
    rng = np.random.default_rng(seed)
    x, y = base_digits(base, base_root, download, num_rows, rng)
    domain = assign_domains(len(x), num_domains, rng)
    masks = patch_masks((x.shape[-2], x.shape[-1]), num_domains, patch_size, mask_ratio, rng)
    rotation = np.zeros(num_domains, dtype=np.int64)
    for b, block in enumerate(np.array_split(np.arange(num_domains), rotation_groups)):
        rotation[block] = b
    for d in range(num_domains):
        rows = torch.from_numpy(np.flatnonzero(domain == d))
        rotated = rotate_images(x[rows], rotation[d] * 360.0 / rotation_groups)
        x[rows] = minmax_per_image(torch.maximum(rotated, masks[d]))
    extra = {"rotation": torch.from_numpy(rotation[domain])}
    source = digit_domains(x, y, domain, extra, base)
    source.train.info["masks"] = masks
    return source


# --- many-class multi-domain images -------------------------------------------------------


def smooth_fields(count: int, channels: int, size: int, grid: int, rng: np.random.Generator) -> torch.Tensor:
    """Smooth random images: Gaussian ``grid`` x ``grid`` noise upsampled bicubically to ``size``."""
    coarse = torch.from_numpy(rng.standard_normal((count, channels, grid, grid))).float()
    return F.interpolate(coarse, size=(size, size), mode="bicubic", align_corners=False)


def domain_transform(x: torch.Tensor, shift: float, rng: np.random.Generator) -> torch.Tensor:
    """One random affine warp (rotation 15-30 deg, scale +-10-20 %, shift 7.5-15 % of the
    image, each with a random sign) and one random colour mixing ``M x + c`` (M = I + 0.5
    N(0, 1)), all scaled by ``shift``."""
    largest = np.array([math.radians(30), 0.2, 0.15, 0.15])
    angle, zoom, tx, ty = shift * largest * rng.uniform(0.5, 1.0, 4) * rng.choice([-1.0, 1.0], 4)
    scale = 1.0 + zoom
    cos, sin = scale * math.cos(angle), scale * math.sin(angle)
    theta = torch.tensor([[cos, -sin, tx], [sin, cos, ty]], dtype=x.dtype).expand(len(x), 2, 3)
    warped = F.grid_sample(
        x, F.affine_grid(theta, list(x.shape), align_corners=False), padding_mode="border", align_corners=False
    )
    channels = x.shape[1]
    mix = torch.from_numpy(np.eye(channels) + 0.5 * shift * rng.standard_normal((channels, channels))).float()
    bias = torch.from_numpy(0.5 * shift * rng.standard_normal(channels)).float()
    return torch.einsum("ij,njhw->nihw", mix, warped) + bias.view(1, -1, 1, 1)


@DATASETS.register("multidomain_synthetic", "synthetic many-class multi-domain images (Office / DomainNet stand-in)")
def load_multidomain_synthetic(
    root: str | os.PathLike | None = None,
    *,
    download: bool = True,
    seed: int = 0,
    num_classes: int = 31,
    num_domains: int = 3,
    samples_per_class: int = 20,
    image_size: int = 32,
    channels: int = 3,
    domain_shift: float = 1.0,
    intra_class: float = 1.0,
    noise: float = 0.2,
    pixels: str = "raw",
) -> DataSource:
    """Procedural stand-in for Office-31 / DomainNet (FADE §5.2, Split-Mix feature non-IID):
    class c has a smooth random prototype image; a sample is prototype + ``intra_class`` x a
    finer smooth random field, then its domain's affine + colour transform, then Gaussian
    pixel noise of std ``noise``. Each domain holds ``samples_per_class`` rows per class,
    ordered domain by domain; ``groups["domain"]`` is the domain id. ``pixels = "unit"``
    min-max rescales every image to [0, 1], like a photo's pixels (FedFed's bound needs it).
    """
    require(pixels in ("raw", "unit"), f"pixels must be 'raw' or 'unit', got {pixels!r}")
    require(num_classes >= 2, f"num_classes must be >= 2, got {num_classes}")
    require(num_domains >= 1 and samples_per_class >= 1, "num_domains and samples_per_class must be >= 1")
    require(image_size >= 8 and channels >= 1, f"need image_size >= 8 and channels >= 1, got {image_size}, {channels}")
    require(min(domain_shift, intra_class, noise) >= 0, "domain_shift, intra_class and noise must be >= 0")
    rng = np.random.default_rng(seed)
    prototypes = smooth_fields(num_classes, channels, image_size, 4, rng)
    prototypes = (prototypes - prototypes.mean((1, 2, 3), keepdim=True)) / prototypes.std((1, 2, 3), keepdim=True)
    labels = torch.arange(num_classes).repeat_interleave(samples_per_class)
    xs = []
    for _ in range(num_domains):
        clean = prototypes[labels] + intra_class * smooth_fields(len(labels), channels, image_size, 8, rng)
        shifted = domain_transform(clean, domain_shift, rng)
        noisy = shifted + noise * torch.from_numpy(rng.standard_normal(shifted.shape)).float()
        xs.append(minmax_per_image(noisy) if pixels == "unit" else noisy)
    info = {
        "classes": [f"class_{c}" for c in range(num_classes)],
        "domain_names": [f"domain_{d}" for d in range(num_domains)],
    }
    train = ArrayDataset(
        torch.cat(xs),
        labels.repeat(num_domains),
        {"domain": torch.arange(num_domains).repeat_interleave(len(labels))},
        info,
    )
    return DataSource(
        train=train, test=None, task="classification", num_classes=num_classes,
        natural_groups="domain", synthetic=True,
    )
