"""``class_window`` with ``target_domain``: one source -> target task out of a many-domain set.

The data set is built so that every row's domain and class are known from its index:
row i has domain i % 3 and class (i // 3) % 4, so each (domain, class) pair has 6 of the
72 rows. Expected client rows are written down from that rule, not from the partitioner.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedveil.data.arrays import ArrayDataset
from fedveil.data.errors import DataError
from fedveil.data.partition import ClassWindowPartitioner

N = 72
INDEX = np.arange(N)
DOMAIN = INDEX % 3
LABEL = (INDEX // 3) % 4


def dataset(domain=DOMAIN, label=LABEL, key: str = "domain") -> ArrayDataset:
    x = torch.arange(len(label), dtype=torch.float32).unsqueeze(1)
    return ArrayDataset(x, torch.as_tensor(label), {key: torch.as_tensor(domain)})


def split(data: ArrayDataset, num_clients: int, seed: int = 0, **params) -> list[np.ndarray]:
    part = ClassWindowPartitioner(ClassWindowPartitioner.Params(**params))
    return part.split(data, num_clients, np.random.default_rng(seed))


def rows(domain: int, classes=None, domains=DOMAIN, labels=LABEL) -> np.ndarray:
    keep = domains == domain
    if classes is not None:
        keep &= np.isin(labels, list(classes))
    return np.flatnonzero(keep)


def per_class(part: np.ndarray, labels=LABEL, num_classes: int = 4) -> list[int]:
    return np.bincount(labels[part], minlength=num_classes).tolist()


@pytest.mark.parametrize("seed", [0, 1])
def test_disjoint_windows_exact_rows(seed):
    # 1 source + 2 targets, C = 4, window 2, stride 2: target u holds {2u, 2u+1}.
    parts = split(dataset(), 3, seed, window=2, stride=2, source_clients=1, source_domain=0, target_domain=2)
    assert len(parts) == 3
    assert parts[0].tolist() == rows(0).tolist()  # all 24 domain-0 rows, nothing else
    assert len(parts[0]) == 24
    assert parts[1].tolist() == rows(2, {0, 1}).tolist()
    assert parts[2].tolist() == rows(2, {2, 3}).tolist()
    used = np.concatenate(parts)
    assert not np.isin(rows(1), used).any()  # domain 1 is unused
    assert len(used) == 48 and len(np.unique(used)) == 48


def test_overlapping_windows_deal_shared_classes_evenly():
    # 2 sources + 2 targets, window 3, stride 1: targets hold {0, 1, 2} and {1, 2, 3};
    # classes 1 and 2 have two holders, 3 of their 6 domain-2 rows each.
    parts = split(dataset(), 4, window=3, stride=1, source_clients=2, source_domain=0, target_domain=2)
    assert np.array_equal(np.sort(np.concatenate(parts[:2])), rows(0))
    assert sorted(len(p) for p in parts[:2]) == [12, 12]
    for p in parts[2:]:
        assert (DOMAIN[p] == 2).all()
    assert per_class(parts[2]) == [6, 3, 3, 0]
    assert per_class(parts[3]) == [0, 3, 3, 6]
    assert np.array_equal(np.sort(np.concatenate(parts[2:])), rows(2))
    assert not np.isin(rows(1), np.concatenate(parts)).any()


def test_windows_wrap_modulo_the_target_classes():
    # window 2, stride 3, C = 4: target 0 holds {0, 1}, target 1 holds {3, 0}; class 2 unused.
    parts = split(dataset(), 3, window=2, stride=3, source_clients=1, source_domain=0, target_domain=2)
    assert parts[0].tolist() == rows(0).tolist()
    assert per_class(parts[1]) == [3, 6, 0, 0]
    assert per_class(parts[2]) == [3, 0, 0, 6]
    assert all((DOMAIN[p] == 2).all() for p in parts[1:])
    assert np.array_equal(np.sort(np.concatenate(parts[1:])), rows(2, {0, 1, 3}))


def test_classes_come_from_the_target_domain_only():
    # Domain 1 also has class 4 (which domain 2 lacks); it must not widen the window's C.
    domain = np.concatenate([DOMAIN, np.full(6, 1)])
    label = np.concatenate([LABEL, np.full(6, 4)])
    data = dataset(domain, label)
    # C = 4 (target rows): window 2, stride 3 wraps to {3, 0} for target 1.  With C = 5
    # target 1 would hold {3, 4} and class 0 would not be shared.
    parts = split(data, 3, window=2, stride=3, source_clients=1, source_domain=0, target_domain=2)
    assert per_class(parts[1], label, 5) == [3, 6, 0, 0, 0]
    assert per_class(parts[2], label, 5) == [3, 0, 0, 6, 0]
    assert parts[0].tolist() == rows(0, domains=domain, labels=label).tolist()


def test_target_domain_may_be_the_lower_id_and_the_key_configurable():
    parts = split(
        dataset(key="site"), 2, window=4, stride=1, source_clients=1, source_domain=2, target_domain=1, domain_key="site",
    )
    assert parts[0].tolist() == rows(2).tolist()
    assert parts[1].tolist() == rows(1).tolist()


def test_without_target_domain_every_other_domain_goes_to_targets():
    parts = split(dataset(), 3, window=2, stride=2, source_clients=1, source_domain=0)
    assert parts[0].tolist() == rows(0).tolist()
    assert np.array_equal(np.sort(np.concatenate(parts[1:])), np.flatnonzero(DOMAIN != 0))
    assert per_class(parts[1]) == [12, 12, 0, 0]
    assert per_class(parts[2]) == [0, 0, 12, 12]


def error(num_clients: int = 3, **params) -> str:
    with pytest.raises(DataError) as err:
        split(dataset(), num_clients, window=2, stride=2, source_clients=1, **params)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_target_domain_needs_source_domain():
    assert "target_domain needs source_domain" in error(target_domain=2)


def test_target_domain_must_differ_from_source_domain():
    message = error(source_domain=1, target_domain=1)
    assert "target_domain=1 must be another domain with rows" in message
    assert "(domains: 0, 1, 2)" in message


def test_target_domain_without_rows():
    message = error(source_domain=0, target_domain=7)
    assert "target_domain=7 must be another domain with rows" in message
    assert "(domains: 0, 1, 2)" in message


def test_source_domain_without_rows_is_still_reported():
    assert "no row has domain == source_domain=5" in error(source_domain=5, target_domain=2)


def test_window_larger_than_the_target_domains_classes():
    # domain 2 keeps only classes 0 and 1: window 3 cannot fit there although the data set has 4.
    keep = ~((DOMAIN == 2) & (LABEL >= 2))
    data = dataset(DOMAIN[keep], LABEL[keep])
    with pytest.raises(DataError, match="window=3 but the target rows have only 2 classes"):
        split(data, 3, window=3, stride=1, source_clients=1, source_domain=0, target_domain=2)
