"""The ``mnist_digits`` UDA pair (MNIST as domain 0, scikit-learn digits as domain 1) and
``mnist_as_optdigits`` (MNIST's central 20x20 box -> 8x8 in [0, 1]), on tiny IDX files
written by hand. The MNIST images used here are constant over their central box (with
noise in the margin, which must be cut away), so their 8x8 versions are known exactly.
"""
from __future__ import annotations


import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits as sklearn_digits

from fedveil.data import DATASETS, DataError
from fedveil.data.loaders.mnist_digits import load_mnist_digits, mnist_as_optdigits
from fedveil.runtime.dataset import load_source
from fedveil.config import validate
from mnist_idx_files import idx  # tests/data helper: tiny IDX files

NUM_DIGITS = 1797


def boxed(values, seed: int) -> np.ndarray:
    """(N, 28, 28) uint8: image k is ``values[k]`` over rows/cols 4..23, random in the margin."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (len(values), 28, 28)).astype(np.uint8)
    for k, v in enumerate(values):
        images[k, 4:24, 4:24] = v
    return images


TRAIN_VALUES = [0, 51, 102, 204, 255]  # box values -> 0, 0.2, 0.4, 0.8, 1.0
TRAIN_LABELS = [7, 0, 3, 9, 1]
TEST_VALUES = [153, 255, 51]  # -> 0.6, 1.0, 0.2
TEST_LABELS = [2, 2, 5]


@pytest.fixture
def mnist_dir(tmp_path):
    for split, values, labels, seed in (
        ("train", TRAIN_VALUES, TRAIN_LABELS, 0), ("t10k", TEST_VALUES, TEST_LABELS, 1),
    ):
        (tmp_path / f"{split}-images-idx3-ubyte").write_bytes(idx(boxed(values, seed)))
        (tmp_path / f"{split}-labels-idx1-ubyte").write_bytes(idx(np.array(labels)))
    return tmp_path


def box_image(rows=slice(4, 24), cols=slice(4, 24), value=255) -> np.ndarray:
    image = np.zeros((28, 28), dtype=np.uint8)
    image[rows, cols] = value
    return image


def convert(*images) -> torch.Tensor:
    return mnist_as_optdigits(torch.from_numpy(np.stack(images)))


# --- the loader ---------------------------------------------------------------------------


def test_registered():
    assert DATASETS.get("mnist_digits") is load_mnist_digits


def test_shapes_domains_and_labels(mnist_dir):
    source = load_mnist_digits(mnist_dir, download=False)
    data = source.train
    n = 5 + 3 + NUM_DIGITS
    assert data.x.shape == (n, 1, 8, 8) and data.x.dtype == torch.float32
    assert data.y.dtype == torch.int64 and data.y.shape == (n,)
    domain = data.groups["domain"]
    assert domain.tolist() == [0] * 8 + [1] * NUM_DIGITS
    digits = sklearn_digits()
    assert data.y.tolist() == TRAIN_LABELS + TEST_LABELS + digits.target.tolist()
    assert source.test is None
    assert (source.task, source.num_classes, source.natural_groups) == ("classification", 10, "domain")
    assert data.info["domain_names"] == ["mnist", "digits"]
    assert data.info["classes"] == [str(c) for c in range(10)]


def test_values(mnist_dir):
    data = load_mnist_digits(mnist_dir, download=False).train
    assert data.x.min() >= 0 and data.x.max() <= 1
    expected_mnist = torch.tensor([0.0, 0.2, 0.4, 0.8, 1.0, 0.6, 1.0, 0.2])
    for k, v in enumerate(expected_mnist.tolist()):
        assert torch.allclose(data.x[k], torch.full((1, 8, 8), v), atol=1e-6), k
    digits = sklearn_digits()
    assert torch.equal(data.x[8:, 0], torch.from_numpy(digits.images / 16.0).float())
    assert data.x[8:].max() == 1.0  # optdigits' full-grey pixel (16) becomes 1


def test_train_only_subset_pair(tmp_path):
    (tmp_path / "images-idx3-ubyte").write_bytes(idx(boxed([255, 102], 3)))
    (tmp_path / "labels-idx1-ubyte").write_bytes(idx(np.array([4, 6])))
    data = load_mnist_digits(tmp_path, download=False).train
    assert len(data) == 2 + NUM_DIGITS
    assert data.groups["domain"][:3].tolist() == [0, 0, 1]
    assert data.y[:2].tolist() == [4, 6]
    assert torch.allclose(data.x[1], torch.full((1, 8, 8), 0.4), atol=1e-6)


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_mnist_rows_keeps_a_subset(mnist_dir, rows):
    full = load_mnist_digits(mnist_dir, download=False).train
    part = load_mnist_digits(mnist_dir, download=False, mnist_rows=rows, seed=4).train
    assert len(part) == rows + NUM_DIGITS
    assert part.groups["domain"].tolist() == [0] * rows + [1] * NUM_DIGITS
    # every kept MNIST row is one of the 8 (x and y together identify it), in the original order, once
    kept = []
    for k in range(rows):
        matches = [j for j in range(8) if torch.equal(full.x[j], part.x[k]) and full.y[j] == part.y[k]]
        assert len(matches) == 1, k
        kept.append(matches[0])
    assert kept == sorted(set(kept))
    assert torch.equal(part.x[rows:], full.x[8:]) and torch.equal(part.y[rows:], full.y[8:])


def test_mnist_rows_same_seed_same_rows(mnist_dir):
    a = load_mnist_digits(mnist_dir, download=False, mnist_rows=4, seed=9).train
    b = load_mnist_digits(mnist_dir, download=False, mnist_rows=4, seed=9).train
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)


@pytest.mark.parametrize("rows", [0, 9, -1])
def test_mnist_rows_out_of_range(mnist_dir, rows):
    with pytest.raises(DataError, match=rf"mnist_rows must be in 1\.\.8, got {rows}"):
        load_mnist_digits(mnist_dir, download=False, mnist_rows=rows)


def test_through_the_data_config(mnist_dir):
    config = validate({"data": {"name": "mnist_digits", "root": str(mnist_dir), "download": False,
                                "options": {"mnist_rows": 6}}})
    data = load_source(config.data, seed=0).train
    assert len(data) == 6 + NUM_DIGITS
    assert int((data.groups["domain"] == 0).sum()) == 6


def test_missing_files_without_download(tmp_path):
    with pytest.raises(DataError):
        load_mnist_digits(tmp_path / "empty", download=False)


# --- mnist_as_optdigits -------------------------------------------------------------------


def test_full_box_is_all_ones():
    out = convert(box_image())
    assert out.shape == (1, 1, 8, 8) and out.dtype == torch.float32
    assert torch.equal(out, torch.ones(1, 1, 8, 8))


def test_left_half_of_the_box():
    out = convert(box_image(cols=slice(4, 14)))[0, 0]
    expected = torch.zeros(8, 8)
    expected[:, :4] = 1
    assert torch.equal(out, expected)


def test_top_half_of_the_box():
    out = convert(box_image(rows=slice(4, 14)))[0, 0]
    expected = torch.zeros(8, 8)
    expected[:4, :] = 1
    assert torch.equal(out, expected)


def test_margin_only_is_zero():
    image = np.full((28, 28), 255, dtype=np.uint8)
    image[4:24, 4:24] = 0
    assert torch.equal(convert(image), torch.zeros(1, 1, 8, 8))


def test_corner_pixels_of_the_box_land_in_the_corner_cells():
    first = box_image(rows=slice(4, 5), cols=slice(4, 5))  # box pixel (0, 0)
    last = box_image(rows=slice(23, 24), cols=slice(23, 24))  # box pixel (19, 19)
    out = convert(first, last)[:, 0]
    assert out[0, 0, 0] > 0 and int((out[0] != 0).sum()) == 1
    assert out[1, 7, 7] > 0 and int((out[1] != 0).sum()) == 1
    assert out.max() < 1


def test_unit_scale_input_is_not_rescaled_and_channel_dim_is_optional():
    image = np.zeros((28, 28), dtype=np.float32)
    image[4:24, 4:24] = 0.5
    three_d = mnist_as_optdigits(torch.from_numpy(image[None]))
    four_d = mnist_as_optdigits(torch.from_numpy(image[None, None]))
    assert torch.equal(three_d, torch.full((1, 1, 8, 8), 0.5))
    assert torch.equal(four_d, three_d)


def test_batch_rows_are_independent():
    out = convert(box_image(), box_image(value=0), box_image(cols=slice(4, 14)))[:, 0]
    assert torch.equal(out[0], torch.ones(8, 8))
    assert torch.equal(out[1], torch.zeros(8, 8))
    assert torch.equal(out[2, :, :4], torch.ones(8, 4)) and torch.equal(out[2, :, 4:], torch.zeros(8, 4))


@pytest.mark.parametrize("shape", [(1, 27, 27), (2, 28, 27), (1, 1, 32, 32)])
def test_other_sizes_are_refused(shape):
    with pytest.raises(DataError, match="must be 28x28"):
        mnist_as_optdigits(torch.zeros(shape))
