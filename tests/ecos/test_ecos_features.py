"""The fixed feature extractors phi of ECOS: a hand-made HOG and pooled pixels."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedveil.ecos import EXTRACTORS, extract, hog_color_features, hog_features, pixel_features
from fedveil.ecos.features import cell_colour_stats


def _edge(vertical: bool) -> torch.Tensor:
    """An 8 x 8 image, 0 on one half and 1 on the other, split by a vertical (or horizontal) line."""
    x = torch.zeros(1, 1, 8, 8)
    if vertical:
        x[..., :, 4:] = 1.0
    else:
        x[..., 4:, :] = 1.0
    return x


def test_vertical_edge_votes_into_the_horizontal_gradient_bin():
    # 2 x 2 cells of 4 x 4 px, one 2 x 2 block.  The centred difference is 1 at columns 3
    # (cell column 0) and 4 (cell column 1) of all 8 rows, angle 0 -> bin 0: each cell's
    # bin 0 holds 4 x 1 = 4, the block [4, 4, 4, 4] normalises to 0.5 each.
    f = hog_features(_edge(vertical=True), cells=2, bins=9, block=2)
    assert f.shape == (1, 4 * 9)
    cells = f.reshape(4, 9)
    assert torch.allclose(cells[:, 0], torch.full((4,), 0.5), atol=1e-6)
    assert torch.all(cells[:, 1:] == 0)


def test_horizontal_edge_votes_into_the_90_degree_bin():
    cells = hog_features(_edge(vertical=False), cells=2, bins=9, block=2).reshape(4, 9)
    assert torch.allclose(cells[:, 4], torch.full((4,), 0.5), atol=1e-6)  # 90 deg lies in [80, 100)
    assert cells.sum() == pytest.approx(2.0, abs=1e-5)


def test_hog_shape_finite_block_normalised_and_scale_free():
    x = torch.rand(3, 3, 28, 28, generator=torch.Generator().manual_seed(0))
    f = hog_features(x, cells=4, bins=9, block=2)
    assert f.shape == (3, 9 * 4 * 9) and f.dtype == torch.float32
    assert torch.isfinite(f).all()
    norms = f.reshape(3, 9, 36).norm(dim=2)
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-5)
    assert torch.allclose(hog_features(255.0 * x - 7.0), hog_features(x), atol=1e-5)
    whole = hog_features(x, cells=4, bins=9, block=4)  # block = cells: one global normalisation
    assert whole.shape == (3, 4 * 4 * 9)
    assert torch.allclose(whole.norm(dim=1), torch.ones(3), atol=1e-5)


def test_hog_of_a_flat_image_is_zero_and_colour_uses_the_strongest_channel():
    assert torch.all(hog_features(torch.full((2, 1, 8, 8), 0.3), cells=2) == 0)
    colour = torch.zeros(1, 3, 8, 8)
    colour[:, 2] = _edge(vertical=True)[:, 0]
    assert torch.allclose(hog_features(colour, cells=2), hog_features(_edge(vertical=True), cells=2))


def test_pixel_features_pool_and_flatten():
    x = torch.arange(16.0).reshape(1, 1, 4, 4)
    assert torch.equal(pixel_features(x), torch.arange(16.0).reshape(1, 16))
    # 2 x 2 means of [[0,1,4,5], [2,3,6,7], [8,9,12,13], [10,11,14,15]]
    assert torch.equal(pixel_features(x, pool=2), torch.tensor([[2.5, 4.5, 10.5, 12.5]]))


def test_extract_by_name():
    x = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    out = extract("hog", x, cells=2)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    np.testing.assert_array_equal(out, hog_features(x, cells=2).numpy())
    assert set(EXTRACTORS) == {"hog", "hog_color", "pixels"}
    np.testing.assert_array_equal(extract("hog_color", x, cells=2), hog_color_features(x, cells=2).numpy())
    with pytest.raises(ValueError, match="unknown feature extractor 'resnet18'"):
        extract("resnet18", x)


def test_cell_colour_stats_by_hand():
    # 2 x 2 cells of a 1-channel 4 x 4 image: cell (0, 0) holds 0, 0, 0, 2 (mean 0.5, std sqrt(0.75)),
    # the other cells are flat at 1 (mean 1, std 0).
    x = torch.ones(1, 1, 4, 4)
    x[0, 0, :2, :2] = torch.tensor([[0.0, 0.0], [0.0, 2.0]])
    stats = cell_colour_stats(x, cells=2)
    expected = torch.tensor([[0.5, 1.0, 1.0, 1.0, 0.75**0.5, 0.0, 0.0, 0.0]])
    assert stats.shape == (1, 2 * 1 * 4) and torch.allclose(stats, expected, atol=1e-6)


def test_hog_color_shape_weights_and_colour_separation():
    x = torch.rand(3, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    f = hog_color_features(x)  # 4 x 4 cells, 9 bins, per-cell blocks: 144 HOG + 2 * 3 * 16 colour
    assert f.shape == (3, 144 + 96) and f.dtype == torch.float32 and torch.isfinite(f).all()
    shape, colour = f[:, :144], f[:, 144:]
    assert torch.allclose(shape.norm(dim=1), torch.full((3,), 0.5**0.5), atol=1e-5)  # equal halves of a unit norm
    assert torch.allclose(colour.norm(dim=1), torch.full((3,), 0.5**0.5), atol=1e-5)
    assert torch.allclose(hog_color_features(x, color_weight=0.0)[:, 144:], torch.zeros(3, 96))
    assert torch.allclose(hog_color_features(3.0 * x), f, atol=1e-5)  # a positive rescaling changes nothing
    # The same digit-like stroke in red and in green on black: HOG cannot tell them apart, hog_color can.
    red, green = torch.zeros(1, 3, 16, 16), torch.zeros(1, 3, 16, 16)
    red[0, 0, 3:13, 6:10] = 1.0
    green[0, 1, 3:13, 6:10] = 1.0
    assert torch.allclose(hog_features(red, block=1), hog_features(green, block=1))
    a, b = hog_color_features(red), hog_color_features(green)
    assert torch.allclose(a[:, :144], b[:, :144])
    assert (a - b).norm() > 0.9  # the colour halves are orthogonal: distance sqrt(2 * 0.5) = 1
    assert (a - b).norm() == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: hog_features(torch.zeros(8, 8)), "N x C x H x W"),
        (lambda: hog_features(torch.zeros(1, 1, 8, 8), cells=2, block=3), "block"),
        (lambda: hog_features(torch.zeros(1, 1, 3, 3), cells=4), "smaller than"),
        (lambda: pixel_features(torch.zeros(1, 1, 4, 4), pool=0), "pool"),
        (lambda: hog_color_features(torch.zeros(1, 3, 8, 8), color_weight=1.5), "color_weight"),
        (lambda: hog_color_features(torch.zeros(1, 3, 8, 8), cells=16), "smaller than"),
    ],
)
def test_feature_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()
