"""Fixed feature extractors phi for ECOS (spec 000 part 2, B.3 Alg. 5.1 line 1; B.6 and PART D).

The client and the cloud must embed images with the same public, untrained phi.  The
dissertation uses HOG or an ImageNet ResNet18; offline, hand-crafted extractors stand in:
HOG (:func:`hog_features`), HOG with per-cell colour statistics (:func:`hog_color_features`)
and raw (pooled) pixels (:func:`pixel_features`).  Images are torch tensors
``N x C x H x W`` with pixels in any range.

HOG sees only the strongest channel's gradients, normalised per block: it is blind to colour,
brightness and flat backgrounds, which is most of what separates some domains (e.g. a digit
recoloured on a flat background).  ``hog_color`` appends what HOG discards: per cell, the
mean and standard deviation of each channel.  Each of the two parts is L2-normalised per
image, then they are weighted ``sqrt(1 - color_weight)`` and ``sqrt(color_weight)``, so the
colour part holds the share ``color_weight`` of the (unit) squared norm; the default 0.5
lets neither dominate the Euclidean distances that k-means, the nearest-centroid counts
and K-Center use, whatever the two parts' dimensions.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..privacy import checks

__all__ = ["EXTRACTORS", "cell_colour_stats", "extract", "hog_color_features", "hog_features", "pixel_features"]

_EPS = 1e-6


def _check_images(x: torch.Tensor, min_side: int = 1) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.ndim != 4:
        raise ValueError(f"images must be a torch tensor N x C x H x W; got {getattr(x, 'shape', type(x).__name__)}.")
    if min(x.shape[2], x.shape[3]) < min_side:
        raise ValueError(f"images of {x.shape[2]} x {x.shape[3]} pixels are smaller than {min_side} x {min_side}.")
    return x.detach().to(torch.float32)


def _gradients(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(gx, gy, magnitude)``, each ``N x H x W``: centred differences ``[-1, 0, 1]`` (0 on the
    border) per channel, then per pixel the channel of largest magnitude (Dalal & Triggs' rule
    for colour images)."""
    gx = torch.zeros_like(x)
    gy = torch.zeros_like(x)
    gx[..., :, 1:-1] = x[..., :, 2:] - x[..., :, :-2]
    gy[..., 1:-1, :] = x[..., 2:, :] - x[..., :-2, :]
    magnitude = torch.hypot(gx, gy)
    best = magnitude.argmax(dim=1, keepdim=True)
    return tuple(g.gather(1, best).squeeze(1) for g in (gx, gy, magnitude))


def hog_features(x: torch.Tensor, cells: int = 4, bins: int = 9, block: int = 2) -> torch.Tensor:
    """A simplified HOG (Dalal & Triggs 2005): ``N x (cells - block + 1)^2 * block^2 * bins`` float32.

    Image gradients by centred differences; each pixel votes its gradient magnitude into one
    of ``bins`` unsigned orientation bins over [0, 180) degrees (bin 0 holds horizontal
    gradients, i.e. vertical edges) of its cell, the image being cut into ``cells x cells``
    cells (row ``i`` lies in cell ``i * cells // H``).  Blocks of ``block x block`` cells
    taken with a stride of one cell are each L2-normalised (``v / sqrt(|v|^2 + eps^2)``) and
    concatenated; ``block = cells`` is one global L2 normalisation.  Simplified: hard
    orientation and cell assignment (no trilinear interpolation), no Gaussian window, plain
    L2 instead of L2-Hys.
    """
    cells = checks.integer("cells", cells, minimum=1)
    bins = checks.integer("bins", bins, minimum=1)
    block = checks.integer("block", block, minimum=1)
    if block > cells:
        raise ValueError(f"block ({block} cells) cannot exceed cells ({cells} per side).")
    x = _check_images(x, min_side=cells)
    n, _, h, w = x.shape
    gx, gy, magnitude = _gradients(x)
    orientation = torch.remainder(torch.atan2(gy, gx), math.pi)  # unsigned, [0, pi]
    bin_index = torch.floor(orientation * (bins / math.pi)).long() % bins  # pi (from rounding) wraps to 0
    cell_row = (torch.arange(h) * cells) // h
    cell_col = (torch.arange(w) * cells) // w
    cell_index = cell_row[:, None] * cells + cell_col[None, :]
    target = (cell_index[None] * bins + bin_index).reshape(n, -1)
    hist = torch.zeros(n, cells * cells * bins).scatter_add_(1, target, magnitude.reshape(n, -1))
    hist = hist.reshape(n, cells, cells, bins)
    blocks = hist.unfold(1, block, 1).unfold(2, block, 1)  # n, rows, cols, bins, block, block
    blocks = blocks.permute(0, 1, 2, 4, 5, 3).reshape(n, -1, block * block * bins)
    blocks = blocks / torch.sqrt((blocks**2).sum(dim=2, keepdim=True) + _EPS**2)
    return blocks.reshape(n, -1)


def _unit_rows(v: torch.Tensor) -> torch.Tensor:
    """Each row L2-normalised as ``v / sqrt(|v|^2 + eps^2)`` (a zero row stays zero)."""
    return v / torch.sqrt((v**2).sum(dim=1, keepdim=True) + _EPS**2)


def cell_colour_stats(x: torch.Tensor, cells: int = 4) -> torch.Tensor:
    """Per cell and channel, the mean and the (population) standard deviation of the pixels:
    ``N x 2 * C * cells^2`` float32, the means first (channel-major, cells row by row), the
    image cut into ``cells x cells`` cells as in :func:`hog_features`."""
    cells = checks.integer("cells", cells, minimum=1)
    x = _check_images(x, min_side=cells)
    n, c, h, w = x.shape
    cell_row = (torch.arange(h) * cells) // h
    cell_col = (torch.arange(w) * cells) // w
    cell_index = (cell_row[:, None] * cells + cell_col[None, :]).reshape(-1)
    member = F.one_hot(cell_index, cells * cells).to(torch.float32)  # (H W) x cells^2
    size = member.sum(dim=0)
    flat = x.reshape(n, c, h * w).to(torch.float64)
    mean = flat @ member.double() / size.double()
    square = (flat**2) @ member.double() / size.double()
    std = torch.sqrt(torch.clamp(square - mean**2, min=0.0))
    return torch.cat([mean.reshape(n, -1), std.reshape(n, -1)], dim=1).to(torch.float32)


def hog_color_features(
    x: torch.Tensor, cells: int = 4, bins: int = 9, block: int = 1, color_weight: float = 0.5
) -> torch.Tensor:
    """HOG and per-cell colour statistics: ``N x (hog_d + 2 * C * cells^2)`` float32.

    ``[sqrt(1 - w) * u(hog_features(x, cells, bins, block)), sqrt(w) * u(cell_colour_stats(x, cells))]``
    with ``u`` the per-image L2 normalisation and ``w = color_weight`` in [0, 1] (see the
    module docstring).  The colour part is invariant to a positive rescaling of the pixels,
    not to a shift; HOG to both.
    """
    w = checks.real("color_weight", color_weight)
    if not 0.0 <= w <= 1.0:
        raise ValueError(f"color_weight must be in [0, 1]; got {color_weight!r}.")
    shape = _unit_rows(hog_features(x, cells=cells, bins=bins, block=block))
    colour = _unit_rows(cell_colour_stats(x, cells=cells))
    return torch.cat([math.sqrt(1.0 - w) * shape, math.sqrt(w) * colour], dim=1)


def pixel_features(x: torch.Tensor, pool: int = 1) -> torch.Tensor:
    """Raw pixels, average-pooled over ``pool x pool`` windows (1: none), flattened: ``N x C*(H//pool)*(W//pool)``."""
    pool = checks.integer("pool", pool, minimum=1)
    x = _check_images(x, min_side=pool)
    if pool > 1:
        x = F.avg_pool2d(x, pool)
    return x.reshape(x.shape[0], -1)


#: Feature extractors by name, for :func:`extract`.
EXTRACTORS: dict[str, Callable[..., torch.Tensor]] = {
    "hog": hog_features,
    "hog_color": hog_color_features,
    "pixels": pixel_features,
}


def extract(name: str, x: torch.Tensor, **options) -> np.ndarray:
    """phi(x) by extractor ``name`` (``options`` go to it), as the float32 ``N x d`` numpy array ECOS works on."""
    if name not in EXTRACTORS:
        raise ValueError(f"unknown feature extractor {name!r}; choose one of {sorted(EXTRACTORS)}.")
    return EXTRACTORS[name](x, **options).numpy()
