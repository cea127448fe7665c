import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from fedveil.data.errors import DataError
from fedveil.data.source import DATASETS
from fedveil.data.synthetic import (
    load_multidomain_synthetic,
    load_patched_digits,
    load_rotated_digits,
    load_synthetic_fedprox,
)


def base_digits() -> torch.Tensor:
    return torch.from_numpy(load_digits().images / 16.0).float().unsqueeze(1)


def test_registered_as_synthetic():
    for name in ("synthetic_fedprox", "rotated_digits", "patched_digits", "multidomain_synthetic"):
        assert "synthetic" in DATASETS.entry(name).description
        assert DATASETS.get(name)().synthetic


# --- FedProx Synthetic(alpha, beta) ---


def test_fedprox_shapes_and_devices():
    src = load_synthetic_fedprox(alpha=0.5, beta=0.5, num_groups=12, seed=3)
    x, y, client = src.train.x, src.train.y, src.train.groups["client"]
    assert x.shape[1] == 60 and src.num_classes == 10
    assert y.min() >= 0 and y.max() <= 9
    assert src.natural_groups == "client" and src.test is None
    assert client.unique().tolist() == list(range(12))
    assert client.bincount().min() >= 50  # lognormal + 50


def test_fedprox_labels_are_argmax_of_each_devices_linear_model():
    src = load_synthetic_fedprox(seed=1)
    gen = src.train.info["generator"]
    x = src.train.x.double().numpy()
    client = src.train.groups["client"].numpy()
    logits = np.einsum("ncd,nd->nc", gen["W"][client], x) + gen["b"][client]
    assert np.array_equal(logits.argmax(1), src.train.y.numpy())


def test_fedprox_iid_shares_one_model_and_has_covariance_j_pow_minus_1_2():
    src = load_synthetic_fedprox(iid=True, seed=0)
    gen = src.train.info["generator"]
    assert np.allclose(gen["W"], gen["W"][0]) and np.allclose(gen["v"], 0)
    var = src.train.x.double().var(0).numpy()
    for j in (1, 2, 10, 60):
        assert var[j - 1] == pytest.approx(j**-1.2, rel=0.1)


def test_fedprox_is_seeded_and_validates():
    a, b, c = load_synthetic_fedprox(seed=5), load_synthetic_fedprox(seed=5), load_synthetic_fedprox(seed=6)
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.train.y, b.train.y)
    assert len(a.train) != len(c.train) or not torch.equal(a.train.x, c.train.x)
    with pytest.raises(DataError, match="alpha and beta must be >= 0"):
        load_synthetic_fedprox(alpha=-1)


# --- rotated / patched digits ---


def test_rotated_digits_domain_rotations_match_rot90():
    src = load_rotated_digits(seed=0)
    base, x, domain = base_digits(), src.train.x, src.train.groups["domain"]
    assert x.shape == (1797, 1, 8, 8) and src.natural_groups == "domain"
    assert sorted(domain.bincount().tolist()) == [449, 449, 449, 450]
    for d in range(4):  # default angles 0, 90, 180, 270
        rows = domain == d
        assert torch.equal(x[rows], torch.rot90(base[rows], d, dims=(-2, -1)))
    assert torch.equal(src.train.y, torch.from_numpy(load_digits().target))


def test_rotated_digits_free_angles():
    src = load_rotated_digits(angles=[0, 45], seed=0)
    base, x, domain = base_digits(), src.train.x, src.train.groups["domain"]
    assert torch.equal(x[domain == 0], base[domain == 0])
    assert not torch.allclose(x[domain == 1], base[domain == 1])
    with pytest.raises(DataError, match="2 angles but num_domains=3"):
        load_rotated_digits(angles=[0, 45], num_domains=3)


def test_patched_digits_masks_and_rotation_blocks():
    src = load_patched_digits(num_domains=8, rotation_groups=4, mask_ratio=0.5, seed=2)
    base, x = base_digits(), src.train.x
    domain, rotation = src.train.groups["domain"], src.train.groups["rotation"]
    masks = src.train.info["masks"]
    assert masks.shape == (8, 8, 8)
    assert len({tuple(m.flatten().tolist()) for m in masks}) == 8  # distinct per domain
    # masks are unions of aligned 2x2 squares
    blocks = masks.reshape(8, 4, 2, 4, 2)
    assert torch.equal(blocks, blocks[:, :, :1, :, :1].expand_as(blocks))
    # domains 2k, 2k+1 form rotation block k, rotated by k * 90 degrees
    assert torch.equal(rotation, domain // 2)
    for d in range(8):
        rows = domain == d
        expected = torch.maximum(torch.rot90(base[rows], d // 2, dims=(-2, -1)), masks[d])
        low = expected.amin((1, 2, 3), keepdim=True)
        high = expected.amax((1, 2, 3), keepdim=True)
        assert torch.allclose(x[rows], (expected - low) / (high - low))


def test_patched_digits_mask_ratio_is_the_expected_masked_area():
    masks = load_patched_digits(num_domains=40, seed=0).train.info["masks"]
    assert masks.mean().item() == pytest.approx(0.5, abs=0.08)


def test_patched_digits_cannot_make_distinct_masks_from_empty_patches():
    with pytest.raises(DataError, match="distinct masks"):
        load_patched_digits(num_domains=3, mask_ratio=0.0)


def test_unknown_base_is_a_clear_error():
    with pytest.raises(DataError, match="unknown base 'emnist'"):
        load_rotated_digits(base="emnist")


# --- multi-domain images ---


def nearest_mean_accuracy(train_x, train_y, test_x, test_y, num_classes):
    means = torch.stack([train_x[train_y == c].mean(0) for c in range(num_classes)])
    return (torch.cdist(test_x, means).argmin(1) == test_y).float().mean().item()


def test_multidomain_layout():
    src = load_multidomain_synthetic(num_classes=5, num_domains=2, samples_per_class=4, image_size=16)
    x, y, domain = src.train.x, src.train.y, src.train.groups["domain"]
    assert x.shape == (40, 3, 16, 16) and src.num_classes == 5 and src.natural_groups == "domain"
    assert domain.tolist() == [0] * 20 + [1] * 20
    assert torch.bincount(domain * 5 + y).tolist() == [4] * 10  # 4 rows per (domain, class)


def test_multidomain_unit_pixels_rescale_each_image_and_keep_its_pattern():
    raw = load_multidomain_synthetic(num_classes=3, num_domains=1, samples_per_class=4, image_size=8)
    unit = load_multidomain_synthetic(num_classes=3, num_domains=1, samples_per_class=4, image_size=8, pixels="unit")
    flat_raw, flat_unit = raw.train.x.flatten(1), unit.train.x.flatten(1)
    assert torch.equal(flat_unit.min(1).values, torch.zeros(12)) and torch.equal(flat_unit.max(1).values, torch.ones(12))
    lo, hi = flat_raw.min(1, keepdim=True).values, flat_raw.max(1, keepdim=True).values
    torch.testing.assert_close(flat_unit, (flat_raw - lo) / (hi - lo))  # the same draws, min-max per image
    with pytest.raises(DataError, match="pixels"):
        load_multidomain_synthetic(num_classes=3, num_domains=1, samples_per_class=4, image_size=8, pixels="bytes")


def test_multidomain_classes_learnable_and_domains_shifted():
    def cross_domain(shift):
        src = load_multidomain_synthetic(num_classes=10, num_domains=3, samples_per_class=20, domain_shift=shift)
        x, y, d = src.train.x.flatten(1), src.train.y, src.train.groups["domain"]
        half = torch.arange(len(y)) % 2 == 0
        fit, held_out = (d == 0) & half, (d == 0) & ~half
        within = nearest_mean_accuracy(x[fit], y[fit], x[held_out], y[held_out], 10)
        across = nearest_mean_accuracy(x[d == 0], y[d == 0], x[d > 0], y[d > 0], 10)
        return within, across

    within, across_no_shift = cross_domain(0.0)
    _, across_shift = cross_domain(1.0)
    assert within > 0.9 and across_no_shift > 0.9
    assert across_shift < across_no_shift - 0.2


def test_mnist_base_goes_through_the_registered_loader(monkeypatch):
    from fedveil.data.arrays import ArrayDataset
    from fedveil.data.source import DataSource

    gen = torch.Generator().manual_seed(0)
    train_x = torch.randint(0, 256, (30, 28, 28), generator=gen, dtype=torch.uint8)
    test_x = torch.randint(0, 256, (10, 28, 28), generator=gen, dtype=torch.uint8)
    calls = []

    def fake_mnist(root=None, *, download=True):
        calls.append((root, download))
        return DataSource(
            ArrayDataset(train_x, torch.arange(30) % 10), ArrayDataset(test_x, torch.arange(10)), "classification", 10
        )

    real_get = DATASETS.get
    monkeypatch.setattr(DATASETS, "get", lambda name: fake_mnist if name == "mnist" else real_get(name))
    src = load_rotated_digits(base="mnist", base_root="/data/mnist", download=False, num_domains=2)
    assert calls == [("/data/mnist", False)]
    base = torch.cat([train_x, test_x]).float().unsqueeze(1) / 255.0  # min 0 and max 255 occur
    domain = src.train.groups["domain"]
    assert src.train.x.shape == (40, 1, 28, 28)
    assert torch.allclose(src.train.x[domain == 1], torch.rot90(base[domain == 1], 2, dims=(-2, -1)))


def test_synthetic_images_can_carry_a_group_label():
    from fedveil.data.synthetic_images import load_synthetic_images

    source = load_synthetic_images(channels=1, height=2, width=2, rows=7, test_rows=3, groups=3)
    assert source.train.groups["group"].tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert source.test.groups["group"].tolist() == [0, 1, 2]
    assert "group" not in load_synthetic_images(channels=1, height=2, width=2, rows=4).train.groups
