import numpy as np
import pytest
import torch
from pydantic import ValidationError

from fedveil.data.arrays import ArrayDataset
from fedveil.data.errors import DataError
from fedveil.data.partition import (
    ClassWindowPartitioner,
    DirichletPartitioner,
    DomainPartitioner,
    IIDPartitioner,
    NaturalPartitioner,
    QuantitySkewPartitioner,
    ShardsPartitioner,
)
from fedveil.data.partition_base import PARTITIONERS


def make(cls, **params):
    return cls(cls.Params(**params))


def labelled(rows_per_class: int, num_classes: int, **groups) -> ArrayDataset:
    y = torch.arange(num_classes).repeat_interleave(rows_per_class)
    return ArrayDataset(torch.zeros(len(y), 2), y, {k: torch.as_tensor(v) for k, v in groups.items()})


def label_counts(data: ArrayDataset, parts: list[np.ndarray]) -> np.ndarray:
    c = int(data.y.max()) + 1
    return np.stack([np.bincount(data.y.numpy()[p], minlength=c) for p in parts])


def assert_valid(parts, n, exactly_once):
    used = np.concatenate(parts)
    assert all(p.dtype == np.int64 and np.all(np.diff(p) > 0) for p in parts)  # sorted, no repeats
    assert len(np.unique(used)) == len(used)
    assert used.min() >= 0 and used.max() < n
    if exactly_once:
        assert len(used) == n


def test_all_partitioners_are_registered_with_descriptions():
    names = {"iid", "dirichlet", "shards", "quantity_skew", "natural", "domain", "class_window"}
    assert names <= set(PARTITIONERS.names())
    assert all(PARTITIONERS.entry(n).description for n in names)


# --- iid ---


def test_iid_sizes_differ_by_at_most_one_and_use_every_row():
    data = labelled(10, 10)
    parts = make(IIDPartitioner).split(data, 7, np.random.default_rng(0))
    assert_valid(parts, 100, exactly_once=True)
    assert sorted(len(p) for p in parts) == [14, 14, 14, 14, 14, 15, 15]


def test_more_clients_than_rows_is_a_clear_error():
    with pytest.raises(DataError, match=r"num_clients <= 5"):
        make(IIDPartitioner).split(labelled(1, 5), 6, np.random.default_rng(0))


# --- determinism ---

SEEDED = [
    (IIDPartitioner, {}),
    (DirichletPartitioner, {"alpha": 0.5, "min_size": 5}),
    (ShardsPartitioner, {"classes_per_client": 2}),
    (QuantitySkewPartitioner, {"alpha": 1.0, "min_size": 5}),
    (DomainPartitioner, {}),
    (ClassWindowPartitioner, {"window": 3, "stride": 2}),
]


@pytest.mark.parametrize("cls,params", SEEDED)
def test_same_seed_same_partition_other_seed_other_partition(cls, params):
    data = labelled(30, 10, domain=np.arange(300) % 2)

    def split(seed):
        return make(cls, **params).split(data, 6, np.random.default_rng(seed))

    a, b, c = split(1), split(1), split(2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


# --- dirichlet ---


def test_dirichlet_uses_every_row_once_and_enforces_min_size():
    data = labelled(100, 10)
    parts = make(DirichletPartitioner, alpha=0.5, min_size=30).split(data, 10, np.random.default_rng(0))
    assert_valid(parts, 1000, exactly_once=True)
    assert min(len(p) for p in parts) >= 30


def mean_max_class_fraction(alpha: float) -> float:
    data = labelled(200, 10)
    fractions = []
    for seed in range(5):
        parts = make(DirichletPartitioner, alpha=alpha, min_size=2).split(data, 20, np.random.default_rng(seed))
        counts = label_counts(data, parts)
        fractions.append(np.mean(counts.max(1) / counts.sum(1)))
    return float(np.mean(fractions))


def test_dirichlet_small_alpha_skews_labels_large_alpha_does_not():
    # alpha -> 0: each class lands on ~one client; alpha -> inf: every client ~uniform (1/10).
    assert mean_max_class_fraction(0.05) > 0.7
    assert mean_max_class_fraction(100.0) < 0.3


def test_dirichlet_gives_up_after_bounded_retries_with_advice():
    part = make(DirichletPartitioner, alpha=0.01, min_size=40, max_retries=20)
    with pytest.raises(DataError, match="lower min_size or raise alpha"):
        part.split(labelled(100, 10), 20, np.random.default_rng(0))


def test_dirichlet_min_size_beyond_the_data_fails_at_once():
    with pytest.raises(DataError, match="needs 200 rows, the data set has 100"):
        make(DirichletPartitioner, min_size=20).split(labelled(10, 10), 10, np.random.default_rng(0))


def test_label_partitioners_reject_regression_targets():
    data = ArrayDataset(torch.zeros(50, 2), torch.rand(50))
    with pytest.raises(DataError, match="integer label"):
        make(DirichletPartitioner, min_size=1).split(data, 2, np.random.default_rng(0))


@pytest.mark.parametrize(
    "cls,params,field",
    [
        (DirichletPartitioner, {"alpha": -1}, "alpha"),
        (DirichletPartitioner, {"alpha": 0}, "alpha"),
        (DirichletPartitioner, {"min_size": 0}, "min_size"),
        (ShardsPartitioner, {"classes_per_client": 0}, "classes_per_client"),
        (QuantitySkewPartitioner, {"alpha": -0.5}, "alpha"),
        (ClassWindowPartitioner, {"stride": 0}, "stride"),
        (IIDPartitioner, {"alhpa": 1}, "alhpa"),
    ],
)
def test_invalid_params_name_the_field(cls, params, field):
    with pytest.raises(ValidationError) as err:
        cls.Params(**params)
    assert err.value.errors()[0]["loc"] == (field,)


# --- shards ---


def test_shards_every_client_has_k_classes_evenly_shared():
    # 4 classes x 6 rows, 4 clients x 2 classes = 8 slots: every class held by exactly 2
    # clients, so each holder gets 6 / 2 = 3 rows of each of its 2 classes.
    data = labelled(6, 4)
    parts = make(ShardsPartitioner, classes_per_client=2).split(data, 4, np.random.default_rng(3))
    assert_valid(parts, 24, exactly_once=True)
    counts = label_counts(data, parts)
    assert all(sorted(row) == [0, 0, 3, 3] for row in counts.tolist())
    assert counts.sum(0).tolist() == [6, 6, 6, 6]


def test_shards_uneven_slots_differ_by_one_use():
    # 3 clients x 2 = 6 slots over 4 classes: two classes held twice (3 + 3 rows), two once (6 rows).
    data = labelled(6, 4)
    parts = make(ShardsPartitioner, classes_per_client=2).split(data, 3, np.random.default_rng(0))
    counts = label_counts(data, parts)
    assert sorted(counts[counts > 0].tolist()) == [3, 3, 3, 3, 6, 6]
    assert ((counts > 0).sum(1) == 2).all()


def test_shards_too_many_classes_per_client():
    with pytest.raises(DataError, match="only 4 classes"):
        make(ShardsPartitioner, classes_per_client=5).split(labelled(6, 4), 2, np.random.default_rng(0))


# --- class windows (FADE) ---


def test_class_window_exact_counts():
    # C = 6, window 3, stride 2: client u holds {2u, 2u+1, 2u+2} mod 6.
    # Class 0 held by clients 0, 2 (12 / 2 = 6 each); class 1 only by client 0 (12), etc.
    data = labelled(12, 6)
    parts = make(ClassWindowPartitioner, window=3, stride=2).split(data, 3, np.random.default_rng(0))
    assert_valid(parts, 72, exactly_once=True)
    assert label_counts(data, parts).tolist() == [
        [6, 12, 6, 0, 0, 0],
        [0, 0, 6, 12, 6, 0],
        [6, 0, 0, 0, 6, 12],
    ]


def test_class_window_with_an_all_class_source_client():
    # Client 0 holds every class; classes 0, 2, 4 then have 3 holders (4 rows each),
    # classes 1, 3, 5 two holders (6 rows each).
    data = labelled(12, 6)
    parts = make(ClassWindowPartitioner, window=3, stride=2, source_clients=1).split(data, 4, np.random.default_rng(0))
    assert_valid(parts, 72, exactly_once=True)
    assert label_counts(data, parts).tolist() == [
        [4, 6, 4, 6, 4, 6],
        [4, 6, 4, 0, 0, 0],
        [0, 0, 4, 6, 4, 0],
        [4, 0, 0, 0, 4, 6],
    ]


def test_class_window_office_setting_wraps_modulo_classes():
    # FADE Office: 31 classes, 20 per user, stride 10: user 2 holds 20..30 and 0..8.
    data = labelled(6, 31)
    parts = make(ClassWindowPartitioner, window=20, stride=10).split(data, 3, np.random.default_rng(0))
    held = [set(np.flatnonzero(row)) for row in label_counts(data, parts)]
    assert held == [set(range(20)), set(range(10, 30)), set(range(20, 31)) | set(range(9))]


def test_class_window_source_domain_rows_go_to_source_clients_only():
    data = labelled(8, 4, domain=np.tile([0, 1], 16))
    part = make(ClassWindowPartitioner, window=2, stride=2, source_clients=1, source_domain=0)
    parts = part.split(data, 3, np.random.default_rng(0))
    assert_valid(parts, 32, exactly_once=True)
    domain = data.groups["domain"].numpy()
    assert (domain[parts[0]] == 0).all() and len(parts[0]) == 16
    assert all((domain[p] == 1).all() for p in parts[1:])
    assert label_counts(data, parts).tolist() == [[4, 4, 4, 4], [4, 4, 0, 0], [0, 0, 4, 4]]


def test_class_window_errors():
    data = labelled(4, 3)
    with pytest.raises(DataError, match="window <= 3"):
        make(ClassWindowPartitioner, window=4).split(data, 2, np.random.default_rng(0))
    with pytest.raises(DataError, match="num_clients > source_clients"):
        make(ClassWindowPartitioner, source_clients=2).split(data, 2, np.random.default_rng(0))


# --- quantity skew ---


def test_quantity_skew_sizes():
    data = labelled(100, 10)
    skewed = make(QuantitySkewPartitioner, alpha=0.1, min_size=10).split(data, 10, np.random.default_rng(0))
    even = make(QuantitySkewPartitioner, alpha=1000.0, min_size=10).split(data, 10, np.random.default_rng(0))
    assert_valid(skewed, 1000, exactly_once=True)
    sizes, even_sizes = [len(p) for p in skewed], [len(p) for p in even]
    assert min(sizes) >= 10
    assert max(sizes) / min(sizes) > 5
    assert max(even_sizes) / min(even_sizes) < 1.5  # 10 + Multinomial(900, ~1/10): 100 +- 9


# --- natural and domain ---


def test_natural_one_client_per_group_value():
    data = labelled(1, 5, client=[5, 5, 2, 9, 2])
    parts = make(NaturalPartitioner).split(data, 3, np.random.default_rng(0))
    assert [p.tolist() for p in parts] == [[2, 4], [0, 1], [3]]


def test_natural_wrong_client_count_and_missing_key():
    data = labelled(1, 5, client=[5, 5, 2, 9, 2])
    with pytest.raises(DataError, match="3 distinct 'client' groups.*set num_clients=3"):
        make(NaturalPartitioner).split(data, 4, np.random.default_rng(0))
    with pytest.raises(DataError, match="only has these groups: client"):
        make(NaturalPartitioner, key="school").split(data, 3, np.random.default_rng(0))


def test_domain_spreads_clients_evenly_domain_by_domain():
    domain = np.repeat([0, 1, 2], [30, 20, 10])
    data = labelled(6, 10, domain=domain)
    parts = make(DomainPartitioner).split(data, 7, np.random.default_rng(0))
    assert_valid(parts, 60, exactly_once=True)
    # 7 clients over 3 domains: 3, 2, 2.
    assert [set(domain[p]) for p in parts] == [{0}, {0}, {0}, {1}, {1}, {2}, {2}]
    assert [len(p) for p in parts] == [10, 10, 10, 10, 10, 5, 5]


def test_domain_needs_a_client_per_domain():
    data = labelled(6, 10, domain=np.arange(60) % 3)
    with pytest.raises(DataError, match="num_clients >= 3"):
        make(DomainPartitioner).split(data, 2, np.random.default_rng(0))
