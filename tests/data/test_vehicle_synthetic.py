"""The synthetic Vehicle stand-in: Table B.1 shapes, per-silo standardisation, tau-controlled
heterogeneity, seeding and option checks."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedveil.config import DataConfig
from fedveil.data import DATASETS, DataError
from fedveil.runtime.dataset import build_dataset
from fedveil.data.loaders.vehicle_synthetic import load_vehicle_synthetic, rows_for_train_size

SMALL = {"num_silos": 6, "num_features": 20, "min_size": 300, "max_size": 400}


def silo_ids(source) -> np.ndarray:
    return source.train.groups["silo"].numpy()


def mean_pairwise_cosine(vectors: np.ndarray) -> float:
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    k = len(unit)
    return float(((unit @ unit.T).sum() - k) / (k * k - k))


def fitted_directions(source) -> np.ndarray:
    """Least-squares fit of the +-1 labels on x, one per silo: what the data says about w_k."""
    x, y = source.train.x.double().numpy(), 2.0 * source.train.y.numpy() - 1
    silo = silo_ids(source)
    return np.stack([np.linalg.lstsq(x[silo == k], y[silo == k], rcond=None)[0] for k in np.unique(silo)])


def test_registered_as_a_synthetic_natural_silo_source():
    entry = DATASETS.entry("vehicle_synthetic")
    assert entry.description == "synthetic stand-in for the Vehicle (SensIT) silos of MR-MTL"
    source = load_vehicle_synthetic(**SMALL)
    assert source.synthetic and source.natural_groups == "silo" and source.test is None
    assert (source.task, source.num_classes) == ("classification", 2)


def test_default_shapes_follow_table_b1():
    source = load_vehicle_synthetic()
    x, y, sizes = source.train.x, source.train.y, source.train.info["train_sizes"]
    assert x.dtype == torch.float32 and x.shape[1] == 100
    assert y.dtype == torch.int64 and set(y.unique().tolist()) == {0, 1}
    assert len(sizes) == 23 and min(sizes) == 872 and max(sizes) == 1933
    rows = np.bincount(silo_ids(source))
    assert rows.tolist() == [rows_for_train_size(n, 0.25) for n in sizes]
    assert len(x) == rows.sum()


def test_natural_split_with_the_papers_75_25_keeps_exactly_the_drawn_training_sizes():
    options = {**SMALL, "seed": 4}
    cfg = DataConfig(
        name="vehicle_synthetic", num_clients=6, test_fraction=0.25,
        partition={"name": "natural", "key": "silo"}, options=options,
    )
    data = build_dataset(cfg, seed=0)
    sizes = load_vehicle_synthetic(**options).train.info["train_sizes"]
    assert data.train_sizes().tolist() == sizes
    assert min(sizes) == 300 and max(sizes) == 400
    assert data.input_shape == (20,)


@pytest.mark.parametrize("test_fraction", [0.0, 0.2, 0.25, 0.3, 0.5, 0.9])
def test_rows_for_train_size_is_the_fewest_rows_leaving_n_train(test_fraction):
    for n_train in range(1, 400):
        n = rows_for_train_size(n_train, test_fraction)
        assert n - round(test_fraction * n) == n_train
        assert (n - 1) - round(test_fraction * (n - 1)) < n_train


def test_features_are_standardised_per_silo():
    source = load_vehicle_synthetic(seed=2, **SMALL)
    x, silo = source.train.x.double(), silo_ids(source)
    for k in np.unique(silo):
        rows = torch.from_numpy(silo == k)
        assert x[rows].mean(0).abs().max() < 1e-5
        assert (x[rows].std(0, correction=0) - 1).abs().max() < 1e-5


def test_labels_follow_each_silos_linear_model_with_the_stated_noise():
    """Without noise the silo's own w_k predicts almost every label (not all: x is
    standardised); label_noise 0.33 brings it to the Bayes accuracy
    1 - arccos(1 / sqrt(1 + 0.33^2)) / pi ~ 0.90."""
    for noise, low, high in [(0.0, 0.95, 1.0), (0.33, 0.86, 0.94)]:
        source = load_vehicle_synthetic(seed=1, label_noise=noise, **SMALL)
        w = source.train.info["generator"]["w"][silo_ids(source)]
        predicted = np.einsum("nd,nd->n", source.train.x.double().numpy(), w) > 0
        agreement = (predicted == source.train.y.numpy().astype(bool)).mean()
        assert low <= agreement <= high
        assert 0.4 < source.train.y.double().mean() < 0.6  # boundary through each silo's mean


def test_silo_models_drift_apart_as_tau_grows():
    taus = [0.0, 0.35, 1.0, 3.0]
    sources = [load_vehicle_synthetic(seed=0, tau=tau, **SMALL) for tau in taus]
    true = [mean_pairwise_cosine(s.train.info["generator"]["w"]) for s in sources]
    fitted = [mean_pairwise_cosine(fitted_directions(s)) for s in sources]
    assert true[0] == pytest.approx(1.0)
    assert all(a > b for a, b in zip(true, true[1:]))
    assert all(a > b for a, b in zip(fitted, fitted[1:]))
    assert fitted[0] > 0.9 and fitted[-1] < 0.2


def test_one_seed_fixes_the_data_set():
    a, b, c = (load_vehicle_synthetic(seed=s, **SMALL) for s in (7, 7, 8))
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.train.y, b.train.y)
    assert torch.equal(a.train.groups["silo"], b.train.groups["silo"])
    assert a.train.info["train_sizes"] != c.train.info["train_sizes"]


@pytest.mark.parametrize(
    "option, message",
    [
        ({"num_silos": 0}, "num_silos must be >= 1, got 0"),
        ({"num_features": 0}, "num_features must be >= 1"),
        ({"tau": -0.1}, r"tau \(silo heterogeneity\) must be >= 0"),
        ({"label_noise": -1.0}, "label_noise must be >= 0"),
        ({"min_size": 0}, r"min_size \(training rows of the smallest silo\) must be >= 1"),
        ({"min_size": 500, "max_size": 400}, r"max_size \(400\) must be >= min_size \(500\)"),
        ({"test_fraction": 1.0}, r"test_fraction must be in \[0, 1\), got 1.0"),
    ],
)
def test_bad_options_are_named(option, message):
    with pytest.raises(DataError, match=message):
        load_vehicle_synthetic(**{**SMALL, **option})
