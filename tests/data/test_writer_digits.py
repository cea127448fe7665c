"""``writer_digits_synthetic``: FEMNIST-like synthetic writers from disjoint MNIST rows, on
tiny MNIST IDX files written here (1,200 rows of drawn strokes; 300 copies of one blob)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits as sklearn_digits

from mnist_idx_files import idx, strokes  # tests/data helper: tiny IDX files
from fedveil.config import validate
from fedveil.data import DATASETS, DataError
from fedveil.data.loaders.writer_digits import STYLE_RANGES, load_writer_digits_synthetic, stroke_width
from fedveil.runtime.dataset import build_dataset

torch.set_num_threads(1)

NAME = "writer_digits_synthetic"
SPLITS = {"train": 1000, "t10k": 200}  # pooled: 1,200 MNIST rows
ROWS = 1200
BLOB_ROWS = 300
CENTRE = 13.5  # the image centre in pixel coordinates (pixel centres 0..27)


def blob() -> np.ndarray:
    """(28, 28) uint8 Gaussian spot (std 2.5 px) centred on the image centre: any linear
    map about the centre leaves its centroid there, a shift moves it."""
    r2 = (np.arange(28)[:, None] - CENTRE) ** 2 + (np.arange(28)[None, :] - CENTRE) ** 2
    return np.rint(255 * np.exp(-r2 / (2 * 2.5**2))).astype(np.uint8)


@pytest.fixture(scope="module")
def mnist_dir(tmp_path_factory):
    root, rng = tmp_path_factory.mktemp("mnist"), np.random.default_rng(0)
    for split, n in SPLITS.items():
        (root / f"{split}-images-idx3-ubyte").write_bytes(idx(strokes(n, rng)))
        (root / f"{split}-labels-idx1-ubyte").write_bytes(idx(rng.integers(0, 10, n)))
    return root


@pytest.fixture(scope="module")
def blob_dir(tmp_path_factory):
    """A train-only subset pair: the same blob 300 times, random labels."""
    root, rng = tmp_path_factory.mktemp("blobs"), np.random.default_rng(1)
    (root / "images-idx3-ubyte").write_bytes(idx(np.repeat(blob()[None], BLOB_ROWS, 0)))
    (root / "labels-idx1-ubyte").write_bytes(idx(rng.integers(0, 10, BLOB_ROWS)))
    return root


def read_back(mnist_dir, kind: str, header: int) -> np.ndarray:
    """The fixture's pooled (train then t10k) ``images`` or ``labels`` bytes."""
    return np.concatenate([
        np.frombuffer((mnist_dir / f"{split}-{kind}").read_bytes()[header:], dtype=np.uint8) for split in SPLITS
    ])


def load(root, **options):
    return load_writer_digits_synthetic(root, download=False, **options)


def per_writer(data, values: torch.Tensor, w: int) -> torch.Tensor:
    return values[data.groups["writer"] == w]


# --- shape, writers, rows -----------------------------------------------------------------


def test_registered_synthetic_source(mnist_dir):
    assert DATASETS.get(NAME) is load_writer_digits_synthetic and "synthetic" in NAME
    source = load(mnist_dir, num_writers=5, rows_per_writer=20)
    data = source.train
    assert (source.task, source.num_classes, source.natural_groups, source.synthetic, source.test) == (
        "classification", 10, "writer", True, None,
    )
    assert data.x.dtype == torch.float32 and data.x.shape[1:] == (1, 28, 28)
    assert data.x.min() >= 0 and data.x.max() <= 1
    assert data.info["classes"] == [str(c) for c in range(10)] and data.info["sources"] == ["mnist"]
    assert len(data.info["writer_style"]) == 5 and (data.groups["source"] == 0).all()


def test_writer_count_and_sizes(mnist_dir):
    equal = load(mnist_dir, num_writers=12, rows_per_writer=30, rows_spread=0).train
    assert equal.groups["writer"].tolist() == [w for w in range(12) for _ in range(30)]
    spread = load(mnist_dir, num_writers=40, rows_per_writer=25, rows_spread=0.8, min_rows_per_writer=12).train
    sizes = np.bincount(spread.groups["writer"].numpy())
    assert len(sizes) == 40 and sizes.min() >= 12 and sizes.sum() == len(spread)
    assert sizes.max() > 2 * sizes.min()  # log-normal quantity skew
    assert (np.diff(spread.groups["writer"].numpy()) >= 0).all()  # ordered writer by writer


def test_writers_get_disjoint_mnist_rows_with_their_labels(mnist_dir):
    labels = torch.from_numpy(read_back(mnist_dir, "labels-idx1-ubyte", 8).astype(np.int64))
    data = load(mnist_dir, num_writers=10, rows_per_writer=120, rows_spread=0, label_alpha=0.2).train  # all rows
    assert sorted(data.groups["source_row"].tolist()) == list(range(ROWS))
    assert torch.equal(data.y, labels[data.groups["source_row"]])
    part = load(mnist_dir, num_writers=20, rows_per_writer=30, rows_spread=1.0).train
    rows = part.groups["source_row"].tolist()
    assert len(set(rows)) == len(rows) and torch.equal(part.y, labels[part.groups["source_row"]])


def test_no_style_is_plain_mnist(mnist_dir):
    data = load(mnist_dir, num_writers=6, rows_per_writer=15, style_strength=0).train
    images = torch.from_numpy(read_back(mnist_dir, "images-idx3-ubyte", 16).reshape(-1, 1, 28, 28) / 255).float()
    torch.testing.assert_close(data.x, images[data.groups["source_row"]], atol=1e-5, rtol=0)
    neutral = {"rotation": 0, "scale": 1, "shear": 0, "stroke": 0, "contrast": 1, "brightness": 0, "noise": 0}
    assert data.info["writer_style"] == [{**neutral, "shift": [0, 0]}] * 6


# --- label skew ---------------------------------------------------------------------------


def expected_top_share(alpha: float, rows: int, draws: int = 20000) -> float:
    """Mean share of a writer's most frequent class when its 10 class proportions are
    Dir(alpha) and its ``rows`` labels a multinomial draw from them (Monte Carlo)."""
    rng = np.random.default_rng(123)
    p = rng.dirichlet(np.full(10, alpha), draws)
    return float(np.mean([rng.multinomial(rows, q).max() / rows for q in p]))


def top_shares(data, num_writers: int) -> np.ndarray:
    counts = np.stack([np.bincount(per_writer(data, data.y, w).numpy(), minlength=10) for w in range(num_writers)])
    return counts.max(1) / counts.sum(1)


@pytest.mark.parametrize("alpha", [0.1, 1.0, 100.0])
def test_label_skew_follows_the_dirichlet(mnist_dir, alpha):
    data = load(mnist_dir, num_writers=30, rows_per_writer=20, rows_spread=0, label_alpha=alpha, seed=4).train
    measured, expected = top_shares(data, 30).mean(), expected_top_share(alpha, 20)
    assert abs(measured - expected) < 0.1, (measured, expected)


def test_small_alpha_skews_most_writers(mnist_dir):
    skewed = top_shares(load(mnist_dir, num_writers=30, rows_per_writer=20, rows_spread=0, label_alpha=0.1).train, 30)
    even = top_shares(load(mnist_dir, num_writers=30, rows_per_writer=20, rows_spread=0, label_alpha=100).train, 30)
    assert np.mean(skewed >= 0.5) > 0.6 and np.mean(even >= 0.5) == 0
    assert np.median(even) <= 0.3


def test_classes_per_writer(mnist_dir):
    data = load(mnist_dir, num_writers=25, rows_per_writer=20, rows_spread=0, classes_per_writer=[2, 3],
                label_alpha=1000).train
    allowed = data.info["writer_classes"]
    assert {len(a) for a in allowed} == {2, 3}
    for w in range(25):
        assert sorted(set(per_writer(data, data.y, w).tolist())) == allowed[w], w
    single = load(mnist_dir, num_writers=8, rows_per_writer=10, rows_spread=0, classes_per_writer=1).train
    assert all(len(set(per_writer(single, single.y, w).tolist())) == 1 for w in range(8))
    assert load(mnist_dir, num_writers=3, rows_per_writer=10).train.info["writer_classes"] == [list(range(10))] * 3


# --- per-writer style ---------------------------------------------------------------------


def test_style_is_fixed_per_writer(mnist_dir):
    a = load(mnist_dir, num_writers=10, rows_per_writer=20, seed=7).train.info["writer_style"]
    b = load(mnist_dir, num_writers=4, rows_per_writer=50, label_alpha=3.0, seed=7).train.info["writer_style"]
    c = load(mnist_dir, num_writers=10, rows_per_writer=20, seed=8).train.info["writer_style"]
    assert a[:4] == b  # a writer's style depends on the seed and its id only
    assert a != c
    for key in ("rotation", "scale", "shear", "stroke", "contrast", "brightness", "noise"):
        values = [s[key] for s in a]
        assert len(set(values)) == 10, key  # every writer draws its own
        centre, half = STYLE_RANGES[key]
        assert all(abs(v - centre) <= half + 1e-9 for v in values), key
    assert all(max(abs(d) for d in s["shift"]) <= 2 for s in a)
    strong = load(mnist_dir, num_writers=10, rows_per_writer=20, seed=7, style_strength=2).train.info["writer_style"]
    assert [s["rotation"] for s in strong] == pytest.approx([2 * s["rotation"] for s in a])


@pytest.fixture(scope="module")
def blob_writers(blob_dir):
    """Writers of the same blob: each writer's median image (noise removed) and rows."""
    data = load(blob_dir, num_writers=8, rows_per_writer=30, rows_spread=0, seed=2).train
    medians = torch.stack([per_writer(data, data.x, w)[:, 0].median(0).values for w in range(8)])
    return data, medians


def centroid(image: torch.Tensor) -> tuple[float, float]:
    """(x, y) centre of mass of the part above 30% of the way from background to peak (a
    symmetric spot stays symmetric; the background's leftover noise does not count)."""
    low, high = image.min(), image.max()
    mass = (image - (low + 0.3 * (high - low))).clamp(min=0)
    ys, xs = torch.meshgrid(torch.arange(28.0), torch.arange(28.0), indexing="ij")
    return float((mass * xs).sum() / mass.sum()), float((mass * ys).sum() / mass.sum())


def test_same_writer_same_transform_other_writers_differ(blob_writers):
    data, medians = blob_writers
    within = []
    for w in range(8):
        rows = per_writer(data, data.x, w)[:, 0]
        noise = data.info["writer_style"][w]["noise"]
        within.append((rows - medians[w]).abs().mean().item())
        assert within[-1] <= noise + 0.01, (w, within[-1], noise)  # rows differ by pixel noise only
    for a in range(8):
        for b in range(a + 1, 8):
            assert (medians[a] - medians[b]).abs().max() > 0.25, (a, b)  # other shift / shape / contrast


def test_the_shift_moves_the_digit(blob_writers):
    data, medians = blob_writers
    for w, style in enumerate(data.info["writer_style"]):
        x, y = centroid(medians[w])
        dx, dy = style["shift"]
        assert abs(x - (CENTRE + dx)) < 0.3 and abs(y - (CENTRE + dy)) < 0.3, (w, x, y, style["shift"])


def test_stroke_thickness():
    x = torch.zeros(1, 1, 28, 28)
    x[0, 0, 6:22, 12:15] = 1.0  # a 3-pixel wide bar
    assert torch.equal(stroke_width(x, 0.0), x)
    assert stroke_width(x, 1.0).sum() == 18 * 5  # dilated to 5 x 18
    assert stroke_width(x, -1.0).sum() == 14 * 1  # eroded to 1 x 14
    assert stroke_width(x, -0.5).sum() < x.sum() < stroke_width(x, 0.5).sum()


# --- determinism, size, scikit-learn digits -----------------------------------------------


def test_same_seed_same_data_other_seed_other_data(mnist_dir):
    a, b, c = (load(mnist_dir, num_writers=10, rows_per_writer=20, seed=s).train for s in (5, 5, 6))
    assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and a.info == b.info
    assert all(torch.equal(a.groups[k], b.groups[k]) for k in a.groups)
    assert not torch.equal(a.groups["source_row"][:50], c.groups["source_row"][:50])


def test_size_area_averages(mnist_dir):
    full = load(mnist_dir, num_writers=4, rows_per_writer=10, rows_spread=0, seed=3).train
    small = load(mnist_dir, num_writers=4, rows_per_writer=10, rows_spread=0, seed=3, size=14).train
    assert small.x.shape == (40, 1, 14, 14) and torch.equal(small.y, full.y)
    torch.testing.assert_close(small.x, full.x.reshape(40, 1, 14, 2, 14, 2).mean((3, 5)))


def test_sklearn_digits_join_the_pool(mnist_dir):
    source = load(mnist_dir, num_writers=20, rows_per_writer=100, rows_spread=0, include_sklearn_digits=True)
    data, digits = source.train, sklearn_digits()
    assert data.info["sources"] == ["mnist", "sklearn_digits"] and len(data) == 2000  # > 1,200 MNIST rows
    own = data.groups["source"] == 1
    assert 800 <= own.sum() <= 1797
    assert data.y[own].tolist() == digits.target[data.groups["source_row"][own].numpy()].tolist()
    for s in (0, 1):
        rows = data.groups["source_row"][data.groups["source"] == s].tolist()
        assert len(set(rows)) == len(rows)


# --- through the config: one client per writer --------------------------------------------


def test_natural_partition_gives_one_client_per_writer(mnist_dir):
    data_cfg = {
        "name": NAME, "root": str(mnist_dir), "download": False, "num_clients": 10,
        "options": {"num_writers": 10, "rows_per_writer": 20}, "partition": {"name": "natural", "key": "writer"},
    }
    data = build_dataset(validate({"data": data_cfg}).data, seed=0)
    assert len(data.clients) == 10 and data.input_shape == (1, 28, 28)
    rows = []
    for cid, client in enumerate(data.clients):
        writers = torch.cat([client.train.groups["writer"], client.test.groups["writer"]])
        assert len(writers) >= 10 and writers.tolist() == [cid] * len(writers), cid
        rows += client.train.groups["source_row"].tolist() + client.test.groups["source_row"].tolist()
    assert len(set(rows)) == len(rows)
    with pytest.raises(DataError, match="set num_clients=10"):
        wrong = validate({"data": {**data_cfg, "num_clients": 5}, "federation": {"clients_per_round": 5}})
        build_dataset(wrong.data, seed=0)


# --- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize("options, message", [
    ({"num_writers": 20, "rows_per_writer": 100, "rows_spread": 0},
     r"need 2000 rows but MNIST has 1200 available; lower num_writers or rows_per_writer"),
    ({"num_writers": 10, "rows_per_writer": 100, "rows_spread": 0, "classes_per_writer": 1},
     r"classes \[\d\] ran out of rows"),
    ({"num_writers": 0}, r"num_writers must be an int >= 1, got 0"),
    ({"rows_per_writer": 5}, r"rows_per_writer must be an int >= 10, got 5"),
    ({"rows_per_writer": 20.5}, r"rows_per_writer must be an int >= 10, got 20\.5"),
    ({"min_rows_per_writer": 0}, r"min_rows_per_writer must be an int >= 1"),
    ({"rows_spread": -0.1}, r"rows_spread must be a number in \[0\.0, 3\.0\]"),
    ({"label_alpha": 0}, r"label_alpha must be a number in \(0\.0"),
    ({"classes_per_writer": [3, 2]}, r"classes_per_writer must be an int or a pair \[lo, hi\]"),
    ({"classes_per_writer": 11}, r"1 <= lo <= hi <= 10, got 11"),
    ({"style_strength": 3}, r"style_strength must be a number in \[0\.0, 2\.0\], got 3"),
    ({"size": 32}, r"size must be an int in 4..28"),
])
def test_bad_options(mnist_dir, options, message):
    with pytest.raises(DataError, match=message) as caught:
        load(mnist_dir, **options)
    assert str(caught.value).startswith(NAME) and "\n" not in str(caught.value)


def test_missing_mnist_says_what_to_do(tmp_path):
    with pytest.raises(DataError, match=r"writer_digits_synthetic draws its writers' digits from MNIST.*not found"):
        load(tmp_path / "empty", num_writers=2, rows_per_writer=10)
