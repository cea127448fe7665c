"""build_dataset: loader options are checked by name, and one seed fixes the whole split."""
from __future__ import annotations

import pytest
import torch

from fedveil.config import DataConfig
from fedveil.data import DataError
from fedveil.runtime.dataset import build_dataset, check_loader_options, loader_options

FEDPROX = {"num_groups": 4, "size_log_mean": 2.0, "size_log_sigma": 0.5, "min_size": 30}


def test_loader_options_exclude_root_and_download():
    assert loader_options("digits") == {}
    options = loader_options("synthetic_fedprox")
    assert options["alpha"] == 1.0 and options["beta"] == 1.0 and options["num_groups"] == 30
    assert "seed" in options
    assert "root" not in options and "download" not in options


def test_misspelt_option_is_rejected_with_a_hint_and_the_accepted_options():
    cfg = DataConfig(name="synthetic_fedprox", num_clients=2, options={"alpah": 0.5})
    with pytest.raises(DataError) as err:
        build_dataset(cfg, seed=0)
    message = str(err.value)
    assert "data.options" in message and "'synthetic_fedprox'" in message
    assert "no option 'alpah'" in message and "did you mean 'alpha'?" in message
    accepted = message.split("accepted: ", 1)[1]
    for shown in ("alpha=1.0", "beta=1.0", "num_groups=30", "iid=False", "min_size=50", "seed=0"):
        assert shown in accepted
    assert "root" not in accepted and "download" not in accepted


def test_option_of_a_loader_without_options():
    with pytest.raises(DataError, match=r"data set 'digits' has no option 'size'; accepted: none$"):
        build_dataset(DataConfig(name="digits", options={"size": 3}), seed=0)


@pytest.mark.parametrize("common", ["root", "download"])
def test_common_arguments_are_not_options(common):
    with pytest.raises(DataError, match=f"no option '{common}'"):
        check_loader_options("digits", {common: "x"})


def test_a_valid_option_reaches_the_loader():
    data = build_dataset(DataConfig(name="synthetic_fedprox", num_clients=4, options=FEDPROX), seed=0)
    total = sum(c.num_train + len(c.test) for c in data.clients)
    # 4 devices of floor(LogNormal) + 30 rows each: at least 120 rows, all of them used
    assert total >= 4 * 30
    assert data.input_shape == (60,) and data.num_classes == 10


# ------------------------------------------------------------------ determinism


def flatten(data):
    parts = []
    for c in data.clients:
        for split in (c.train, c.val, c.test):
            if split is not None:
                parts += [split.x, split.y.to(torch.float64)]
    return parts


def same(a, b):
    pa, pb = flatten(a), flatten(b)
    return len(pa) == len(pb) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(pa, pb))


DIGITS = DataConfig(
    name="digits", num_clients=6, val_fraction=0.1, partition={"name": "dirichlet", "alpha": 0.5}
)


def test_same_seed_same_partition_and_splits():
    a, b = build_dataset(DIGITS, seed=11), build_dataset(DIGITS, seed=11)
    assert same(a, b)
    assert torch.equal(a.test.x, b.test.x) and torch.equal(a.test.y, b.test.y)
    assert a.train_sizes().tolist() == b.train_sizes().tolist()
    assert (a.label_counts() == b.label_counts()).all()


def test_another_seed_another_partition():
    a, b = build_dataset(DIGITS, seed=11), build_dataset(DIGITS, seed=12)
    assert not same(a, b)
    assert (a.label_counts() != b.label_counts()).any()  # Dirichlet label skew redrawn
    # ... but the same rows in total: the 1,797 digits, every one used exactly once
    for data in (a, b):
        assert sum(c.num_train + len(c.val) + len(c.test) for c in data.clients) == 1797
        assert data.label_counts().sum() == sum(c.num_train for c in data.clients)


def test_split_sizes_follow_the_fractions():
    data = build_dataset(DIGITS, seed=3)
    for c in data.clients:
        n = c.num_train + len(c.val) + len(c.test)
        assert len(c.test) == round(0.2 * n) and len(c.val) == round(0.1 * n)
    assert len(data.test) == sum(len(c.test) for c in data.clients)


def pooled_rows(data):
    """All feature rows of all clients, in a canonical order (sorted by the first feature)."""
    rows = torch.cat([cl.train.x for cl in data.clients] + [cl.test.x for cl in data.clients])
    return rows[torch.argsort(rows[:, 0])]


def test_synthetic_data_follow_the_run_seed():
    cfg = DataConfig(name="synthetic_fedprox", num_clients=4, options=FEDPROX)
    a, b, c = build_dataset(cfg, seed=0), build_dataset(cfg, seed=0), build_dataset(cfg, seed=1)
    assert same(a, b)
    assert not same(a, c)
    # the generated rows themselves differ, not only their assignment to clients
    ra, rc = pooled_rows(a), pooled_rows(c)
    assert ra.shape != rc.shape or not torch.equal(ra, rc)


def test_an_explicit_loader_seed_overrides_the_run_seed():
    cfg = DataConfig(name="synthetic_fedprox", num_clients=4, options={**FEDPROX, "seed": 5})
    a, b = build_dataset(cfg, seed=0), build_dataset(cfg, seed=1)
    # the same generated rows (seed 5 both times), dealt to clients differently by the run seed
    assert torch.equal(pooled_rows(a), pooled_rows(b))
    assert not same(a, b)
