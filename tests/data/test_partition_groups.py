"""Clients per group for FADE's fairness setting (spec 004 §2.2, "Adult fairness"): the
``domain`` partitioner with ``clients_per_domain``, e.g. one female user and m male users."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from fedveil.config import DataConfig, load_config
from fedveil.data.arrays import ArrayDataset
from fedveil.data.errors import DataError
from fedveil.data.partition import DomainPartitioner
from fedveil.runtime.dataset import build_dataset


def grouped(sex: np.ndarray, labels: np.ndarray | None = None) -> ArrayDataset:
    y = torch.as_tensor(labels if labels is not None else np.zeros(len(sex), dtype=np.int64))
    return ArrayDataset(torch.zeros(len(sex), 2), y, {"sex": torch.as_tensor(sex)})


def split(data: ArrayDataset, counts, num_clients: int, seed: int = 0, key: str = "sex"):
    part = DomainPartitioner(DomainPartitioner.Params(key=key, clients_per_domain=counts))
    return part.split(data, num_clients, np.random.default_rng(seed))


def assert_disjoint_and_complete(parts, n):
    used = np.concatenate(parts)
    assert all(p.dtype == np.int64 and np.all(np.diff(p) > 0) for p in parts)
    assert len(used) == n and set(used.tolist()) == set(range(n))


def test_one_female_user_holds_every_female_row_and_four_male_users_share_the_rest():
    rng = np.random.default_rng(1)
    sex = rng.permutation(np.repeat([0, 1], [10, 40]))  # 0 = Female, 1 = Male (adult loader)
    parts = split(grouped(sex), [1, 4], 5)
    assert_disjoint_and_complete(parts, 50)
    assert parts[0].tolist() == np.flatnonzero(sex == 0).tolist()
    assert [len(p) for p in parts] == [10, 10, 10, 10, 10]
    assert all((sex[p] == 1).all() for p in parts[1:])


def test_uneven_group_sizes_give_near_equal_shares_within_each_group():
    sex = np.repeat([0, 1], [11, 17])
    parts = split(grouped(sex), [2, 3], 5)
    assert_disjoint_and_complete(parts, 28)
    # 11 female rows over 2 users, 17 male rows over 3 users (np.array_split: larger shares first).
    assert [len(p) for p in parts] == [6, 5, 6, 6, 5]
    assert [set(sex[p].tolist()) for p in parts] == [{0}, {0}, {1}, {1}, {1}]


def test_shares_within_a_group_are_iid():
    # 400 male rows, labels alternating: each of 4 male users should see about half positives.
    sex = np.repeat([0, 1], [100, 400])
    labels = np.concatenate([np.zeros(100, np.int64), np.arange(400) % 2])
    parts = split(grouped(sex, labels), [1, 4], 5)
    for p in parts[1:]:
        positives = labels[p].mean()
        assert 0.35 < positives < 0.65  # 100 rows from a 50/50 pool: sd 0.05
        assert np.diff(p).max() > 1  # drawn at random, not a contiguous block


def test_counts_equal_to_the_even_spread_reproduce_the_default_partition():
    domain = np.repeat([0, 1, 2], [30, 20, 10])
    data = grouped(domain)
    default = DomainPartitioner(DomainPartitioner.Params(key="sex")).split(data, 10, np.random.default_rng(3))
    explicit = split(data, [4, 3, 3], 10, seed=3)
    assert [p.tolist() for p in explicit] == [p.tolist() for p in default]


def test_the_counts_follow_sorted_domain_order_not_first_appearance():
    sex = np.array([1] * 8 + [0] * 2)  # males come first in the file
    parts = split(grouped(sex), [1, 4], 5)
    assert parts[0].tolist() == [8, 9]
    assert all(len(p) == 2 for p in parts[1:])


@pytest.mark.parametrize(
    "counts, num_clients, match",
    [
        ([1, 4], 6, r"clients_per_domain=\[1, 4\] sums to 5 but num_clients=6; set num_clients=5"),
        ([5], 5, r"clients_per_domain has 1 entries but 'sex' has 2 domains \(0, 1\); give one count per domain"),
        ([1, 2, 2], 5, r"has 3 entries but 'sex' has 2 domains"),
        ([0, 5], 5, r"clients_per_domain=\[0, 5\] gives a domain no client; every domain \(0, 1\) needs >= 1"),
        ([3, 2], 5, r"domain sex=0 has 2 rows but 3 clients must share it"),
    ],
)
def test_bad_counts_are_clear_one_line_errors(counts, num_clients, match):
    sex = np.repeat([0, 1], [2, 8])
    with pytest.raises(DataError, match=match) as err:
        split(grouped(sex), counts, num_clients)
    assert "\n" not in str(err.value)


def test_counts_must_be_integers():
    with pytest.raises(ValidationError):
        DomainPartitioner.Params(key="sex", clients_per_domain=[1.5, 3])


# --- through the config, on a tiny Adult file ---

ROW = (
    "{age}, Private, 200000, Bachelors, 13, Never-married, Sales, Not-in-family, White, {sex}, 0, 0, 40, "
    "United-States, {label}"
)


@pytest.fixture
def adult_dir(tmp_path):
    rows = [ROW.format(age=30 + i, sex="Female", label="<=50K" if i % 2 else ">50K") for i in range(3)]
    rows += [ROW.format(age=40 + i, sex="Male", label="<=50K" if i % 2 else ">50K") for i in range(12)]
    (tmp_path / "adult.data").write_text("\n".join(rows) + "\n")
    test = [ROW.format(age=50, sex=s, label=">50K.") for s in ("Female", "Male")]
    (tmp_path / "adult.test").write_text("|1x3 Cross validator\n" + "\n".join(test) + "\n")
    return tmp_path


def test_adult_one_female_user_and_four_male_users_from_the_config(adult_dir):
    cfg = load_config(
        overrides=[
            "data.name=adult", f"data.root={adult_dir}", "data.download=false", "data.num_clients=5",
            "data.test_fraction=0.0", "data.partition.name=domain", "data.partition.key=sex",
            "data.partition.clients_per_domain=[1, 4]", "federation.clients_per_round=2",
        ]
    )
    data = build_dataset(cfg.data, seed=0)
    assert [c.num_train for c in data.clients] == [3, 3, 3, 3, 3]
    assert [c.train.groups["sex"].unique().tolist() for c in data.clients] == [[0], [1], [1], [1], [1]]


def test_adult_counts_that_do_not_add_up_stop_the_build(adult_dir):
    cfg = DataConfig(
        name="adult", root=str(adult_dir), download=False, num_clients=4, test_fraction=0.0,
        partition={"name": "domain", "key": "sex", "clients_per_domain": [1, 4]},
    )
    with pytest.raises(DataError, match="sums to 5 but num_clients=4; set num_clients=5"):
        build_dataset(cfg, seed=0)
