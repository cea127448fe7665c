"""``digit_domains_synthetic``: five digit domains (MNIST + four imitations) from disjoint
MNIST rows, on tiny MNIST IDX files written here (200 rows of drawn strokes)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits as sklearn_digits

from mnist_idx_files import idx, strokes  # tests/data helper: tiny IDX files
from fedveil.config import validate
from fedveil.data import DATASETS, DataError
from fedveil.data.loaders.digit_domains import (
    DOMAINS, affine, as_mnistm, contrasting_colours, fill_frame, load_digit_domains_synthetic, luma,
)
from fedveil.runtime.dataset import build_dataset

torch.set_num_threads(1)

NAME = "digit_domains_synthetic"
SPLITS = {"train": 160, "t10k": 40}  # pooled: 200 MNIST rows, at most 40 per domain
ROWS = 200
MNIST, SVHN, USPS, SYNTH, MNISTM = range(5)


@pytest.fixture(scope="module")
def mnist_dir(tmp_path_factory):
    root, rng = tmp_path_factory.mktemp("mnist"), np.random.default_rng(0)
    for split, n in SPLITS.items():
        (root / f"{split}-images-idx3-ubyte").write_bytes(idx(strokes(n, rng)))
        (root / f"{split}-labels-idx1-ubyte").write_bytes(idx(rng.integers(0, 10, n)))
    return root


def read_back(mnist_dir, kind: str, header: int) -> np.ndarray:
    """The fixture's pooled (train then t10k) ``images`` or ``labels`` bytes."""
    return np.concatenate([
        np.frombuffer((mnist_dir / f"{split}-{kind}").read_bytes()[header:], dtype=np.uint8) for split in SPLITS
    ])


def load(mnist_dir, **options):
    return load_digit_domains_synthetic(mnist_dir, download=False, **options)


def of_domain(data, d: int) -> torch.Tensor:
    return data.x[data.groups["domain"] == d]


# --- shape, labels, rows ------------------------------------------------------------------


def test_registered_as_synthetic():
    assert DATASETS.get(NAME) is load_digit_domains_synthetic and "synthetic" in NAME


def test_shapes_range_domains_and_labels(mnist_dir):
    source = load(mnist_dir, rows_per_domain=12, test_rows_per_domain=3)
    train, test = source.train, source.test
    assert train.x.shape == (60, 3, 28, 28) and train.x.dtype == torch.float32
    assert test.x.shape == (15, 3, 28, 28)
    labels = torch.from_numpy(read_back(mnist_dir, "labels-idx1-ubyte", 8).astype(np.int64))
    for part, n in ((train, 12), (test, 3)):
        assert part.x.min() >= 0 and part.x.max() <= 1
        assert part.groups["domain"].tolist() == [d for d in range(5) for _ in range(n)]
        assert torch.equal(part.y, labels[part.groups["source_row"]])
    assert (source.task, source.num_classes, source.natural_groups, source.synthetic) == (
        "classification", 10, "domain", True,
    )
    assert train.info["domain_names"] == ["mnist", "svhn_like", "usps_like", "synth_like", "mnistm_like"]
    assert list(DOMAINS) == train.info["domain_names"]


def test_domains_use_disjoint_mnist_rows(mnist_dir):
    source = load(mnist_dir, rows_per_domain=37, test_rows_per_domain=3)  # all 200 rows
    rows = torch.cat([source.train.groups["source_row"], source.test.groups["source_row"]])
    assert sorted(rows.tolist()) == list(range(ROWS))


def test_no_test_split_by_default(mnist_dir):
    source = load(mnist_dir, rows_per_domain=4)
    assert source.test is None and len(source.train) == 20


def test_mnist_domain_is_mnist_in_three_channels(mnist_dir):
    data = load(mnist_dir, rows_per_domain=10).train
    images = torch.from_numpy(read_back(mnist_dir, "images-idx3-ubyte", 16).reshape(-1, 28, 28) / 255).float()
    rows = data.groups["source_row"][data.groups["domain"] == MNIST]
    assert torch.equal(of_domain(data, MNIST), images[rows].unsqueeze(1).repeat(1, 3, 1, 1))


# --- determinism --------------------------------------------------------------------------


def test_same_seed_same_data_other_seed_other_data(mnist_dir):
    a, b, c = (load(mnist_dir, rows_per_domain=8, seed=s).train for s in (5, 5, 6))
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    assert torch.equal(a.groups["source_row"], b.groups["source_row"])
    assert not torch.equal(a.groups["source_row"], c.groups["source_row"])
    for d in range(1, 5):  # the same rows would still be drawn differently
        assert not torch.equal(of_domain(a, d), of_domain(c, d)), d


# --- the domains look different -----------------------------------------------------------


def domain_stats(x: torch.Tensor) -> dict[str, float]:
    """Mean brightness, saturation (max - min channel), mean of the 2-pixel frame, largest
    frame pixel, and spread within the four 2x2 corners (background clutter)."""
    frame = torch.ones(28, 28, dtype=torch.bool)
    frame[2:-2, 2:-2] = False
    corners = torch.cat([x[..., :2, :2], x[..., :2, -2:], x[..., -2:, :2], x[..., -2:, -2:]], 2).flatten(2)
    return {
        "mean": x.mean().item(),
        "saturation": (x.max(1).values - x.min(1).values).mean().item(),
        "frame": x[..., frame].mean().item(),
        "frame_max": x[..., frame].amax((1, 2)).mean().item(),
        "clutter": corners.std(2).mean().item(),
    }


@pytest.fixture(scope="module")
def stats(mnist_dir):
    data = load(mnist_dir, rows_per_domain=40).train
    return [domain_stats(of_domain(data, d)) for d in range(5)]


def test_grey_domains_and_coloured_domains(stats):
    for d in (MNIST, USPS):
        assert stats[d]["saturation"] == 0, d
    for d in (SVHN, SYNTH, MNISTM):
        assert stats[d]["saturation"] > 0.1, d


def test_backgrounds(stats):
    assert stats[MNIST]["frame"] == 0  # black background, digit in the central box
    for d in (SVHN, SYNTH, MNISTM):
        assert stats[d]["frame"] > 0.25, d  # coloured or photo backgrounds
    assert stats[SYNTH]["clutter"] < 1e-3  # flat colour
    for d in (SVHN, MNISTM):
        assert stats[d]["clutter"] > 0.05, d  # shading, noise, neighbours; photo texture


def test_usps_digits_fill_the_frame(stats, mnist_dir):
    assert stats[USPS]["frame_max"] > 0.5 and stats[MNIST]["frame_max"] == 0
    usps = of_domain(load(mnist_dir, rows_per_domain=10).train, USPS)[:, 0]
    edges = torch.stack([usps[:, 0].amax(1), usps[:, -1].amax(1), usps[:, :, 0].amax(1), usps[:, :, -1].amax(1)], 1)
    assert ((edges > 0.2).sum(1) >= 2).all()  # the bounding box touches two opposite sides


def test_every_pair_of_domains_differs(stats):
    for a, b in itertools.combinations(range(5), 2):
        gap = max(abs(stats[a][k] - stats[b][k]) for k in stats[a])
        assert gap > 0.05, (a, b, gap)


# --- the optional scikit-learn domain -----------------------------------------------------


def test_sklearn_digits_domain(mnist_dir):
    plain = load(mnist_dir, rows_per_domain=6, test_rows_per_domain=2, seed=3)
    source = load(mnist_dir, rows_per_domain=6, test_rows_per_domain=2, seed=3, include_sklearn_digits=True)
    data = source.train
    assert data.info["domain_names"][-1] == "sklearn_digits" and len(data.info["domain_names"]) == 6
    assert data.groups["domain"].tolist() == [d for d in range(6) for _ in range(6)]
    assert source.test.groups["domain"].tolist() == [d for d in range(6) for _ in range(2)]
    own = data.groups["domain"] == 5
    digits = sklearn_digits()
    assert data.y[own].tolist() == digits.target[data.groups["source_row"][own].numpy()].tolist()
    x = data.x[own]
    assert torch.equal(x[:, 0], x[:, 1]) and torch.equal(x[:, 0], x[:, 2])
    assert x[..., :4, :].abs().sum() == 0 and x[..., :, -4:].abs().sum() == 0  # MNIST's margin
    train_rows = set(data.groups["source_row"][own].tolist())
    assert not train_rows & set(source.test.groups["source_row"][source.test.groups["domain"] == 5].tolist())
    # the MNIST domains do not depend on whether the sixth is there (their own rows drawn)
    assert torch.equal(data.groups["source_row"][~own], plain.train.groups["source_row"])


# --- through the config: clients numbered domain by domain --------------------------------


def test_domain_partitioner_numbers_clients_domain_by_domain(mnist_dir):
    config = validate({"data": {
        "name": NAME, "root": str(mnist_dir), "download": False, "num_clients": 10,
        "options": {"rows_per_domain": 20, "test_rows_per_domain": 4}, "partition": {"name": "domain"},
    }})
    data = build_dataset(config.data, seed=0)
    assert len(data.clients) == 10
    for cid, client in enumerate(data.clients):
        for split in (client.train, client.test):
            assert split.groups["domain"].tolist() == [cid // 2] * len(split), cid
        assert len(client.train) + len(client.test) == 10
    assert data.test.groups["domain"].tolist() == [d for d in range(5) for _ in range(4)]
    assert data.input_shape == (3, 28, 28)


# --- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("options, message", [
    ({"rows_per_domain": 41}, r"need 205 MNIST rows but MNIST has 200; lower them to at most 40 in all"),
    ({"rows_per_domain": 38, "test_rows_per_domain": 3}, r"need 205 MNIST rows"),
    ({"rows_per_domain": 0}, r"rows_per_domain must be an int >= 1, got 0"),
    ({"rows_per_domain": 2.5}, r"rows_per_domain must be an int >= 1, got 2\.5"),
    ({"test_rows_per_domain": -1}, r"test_rows_per_domain must be an int >= 0, got -1"),
    ({"rows_per_domain": 1798, "include_sklearn_digits": True}, r"exceeds scikit-learn's 1797 digits"),
])
def test_bad_options(mnist_dir, options, message):
    with pytest.raises(DataError, match=message):
        load(mnist_dir, **options)


def test_missing_files_without_download(tmp_path):
    with pytest.raises(DataError):
        load(tmp_path / "empty", rows_per_domain=1)


# --- transforms ---------------------------------------------------------------------------


def test_affine_identity_and_whole_pixel_shift():
    x = torch.rand(2, 1, 28, 28)
    assert torch.allclose(affine(x, np.ones(2), np.zeros(2), np.zeros((2, 2))), x, atol=1e-5)
    moved = affine(x, np.ones(2), np.zeros(2), np.array([[3.0, 0.0], [0.0, -2.0]]))
    assert torch.allclose(moved[0, :, :, 3:], x[0, :, :, :-3], atol=1e-5)  # 3 pixels right
    assert torch.allclose(moved[1, :, :-2], x[1, :, 2:], atol=1e-5)  # 2 pixels up


def test_fill_frame_scales_the_bounding_box_to_the_frame():
    x = torch.zeros(2, 1, 28, 28)
    x[0, 0, 10:17, 12:26] = 1  # 7 rows x 14 columns: the width fills the frame
    out = fill_frame(x)
    assert out[0, 0, 14, 1:-1].min() > 0.99 and out[0, 0, 14, [0, -1]].min() > 0.7  # edge pixels: bilinear
    assert out[0, 0, :6].max() == 0 and out[0, 0, -6:].max() == 0  # the height: 14 rows (+ bilinear edges), centred
    assert torch.equal(out[1], x[1])  # a blank image stays blank


def test_contrasting_colours_keep_the_gap():
    fg, bg = contrasting_colours(500, 0.3, np.random.default_rng(0))
    assert fg.shape == bg.shape == (500, 3) and (np.abs(luma(fg) - luma(bg)) >= 0.3).all()


def test_mnistm_is_the_difference_of_photo_and_digit():
    blank, full = torch.zeros(4, 1, 28, 28), torch.ones(4, 1, 28, 28)
    patches = as_mnistm(blank, np.random.default_rng(1))
    assert patches.std() > 0.01  # photo crops, not a constant
    assert torch.allclose(as_mnistm(full, np.random.default_rng(1)), 1 - patches)


def test_size_shrinks_every_image_by_area_averaging(mnist_dir):
    full, small = load(mnist_dir, rows_per_domain=10, seed=3), load(mnist_dir, rows_per_domain=10, seed=3, size=14)
    assert small.train.x.shape == (50, 3, 14, 14)
    # 28 -> 14 is exact 2x2 block means
    blocks = full.train.x.reshape(50, 3, 14, 2, 14, 2).mean((3, 5))
    torch.testing.assert_close(small.train.x, blocks)
    assert torch.equal(small.train.y, full.train.y)
    with pytest.raises(DataError, match="size must be an int in 4..28"):
        load(mnist_dir, size=32)
