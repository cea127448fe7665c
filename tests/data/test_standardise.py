"""data.standardize on Adult and COMPAS files in the original formats: pooled (statistics of
the whole training file, the default), per_client (each client's own training rows), none."""
from __future__ import annotations

import statistics

import pytest
import torch

from fedveil.config import ConfigError, DataConfig, validate
from fedveil.data import DATASETS, DataError
from fedveil.runtime.dataset import build_dataset

NUM_ROWS = 16  # 2 IID clients of 8 rows: 4 train, 2 val, 2 test each
# workclass, education, marital-status, occupation, relationship, race, sex, native-country
ADULT_CATEGORIES = [
    ("State-gov", "Bachelors", "Never-married", "Adm-clerical", "Not-in-family", "White", "Male", "United-States"),
    ("Private", "Masters", "Never-married", "Prof-specialty", "Not-in-family", "Black", "Female", "United-States"),
    ("Self-emp-not-inc", "Bachelors", "Married-civ-spouse", "Exec-managerial", "Husband", "White", "Male", "Mexico"),
]


def continuous_values(i: int) -> tuple[int, ...]:
    """Row i's age, fnlwgt, education-num, capital-gain, capital-loss, hours-per-week (Adult)
    or age, priors_count and the three juvenile counts (COMPAS): all different across rows,
    so no client has a constant column."""
    return 20 + 3 * i, 40000 + 1000 * i * i, 1 + i, 100 * i * i, 13 * i, 70 - 2 * i


def adult_row(i: int, label: str) -> str:
    age, fnlwgt, edu_num, gain, loss, hours = continuous_values(i)
    work, edu, marital, job, relation, race, sex, country = ADULT_CATEGORIES[i % 3]
    return ", ".join(map(str, (
        age, work, fnlwgt, edu, edu_num, marital, job, relation, race, sex, gain, loss, hours, country, label,
    )))


COMPAS_KEYS = (
    "sex age age_cat race juv_fel_count juv_misd_count juv_other_count priors_count "
    "days_b_screening_arrest c_charge_degree is_recid score_text two_year_recid"
).split()


def compas_row(i: int) -> str:
    age, priors, fel, misd, other, _ = continuous_values(i)
    sex, race = ("Male", "African-American") if i % 2 else ("Female", "Caucasian")
    return ",".join(map(str, (sex, age, "25 - 45", race, fel, misd, other, priors, 0, "F", 0, "Low", i % 2)))


@pytest.fixture
def roots(tmp_path):
    """Data directories of a 16-row Adult (3 test rows) and a 16-row COMPAS file; COMPAS
    gets only the columns the loader reads, which is all its header check asks for."""
    adult, compas = tmp_path / "adult", tmp_path / "compas"
    adult.mkdir()
    compas.mkdir()
    (adult / "adult.data").write_text("\n".join(adult_row(i, "<=50K") for i in range(NUM_ROWS)) + "\n")
    (adult / "adult.test").write_text(
        "|1x3 Cross validator\n" + "\n".join(adult_row(i, ">50K.") for i in (1, 7, 30)) + "\n"
    )
    (compas / "compas-scores-two-years.csv").write_text(
        "\n".join([",".join(COMPAS_KEYS)] + [compas_row(i) for i in range(NUM_ROWS)]) + "\n"
    )
    return {"adult": adult, "compas": compas}


def build(name, roots, **data):
    cfg = DataConfig(
        name=name, root=str(roots[name]), download=False, num_clients=2, val_fraction=0.25,
        test_fraction=0.25, **data,
    )
    return build_dataset(cfg, seed=0)


def continuous_columns(name, roots) -> list[int]:
    return list(DATASETS.get(name)(roots[name], download=False).continuous)


def z(values, train_values):
    """``values`` standardised with the population mean/std of ``train_values``."""
    mean, std = statistics.fmean(train_values), statistics.pstdev(train_values)
    return [(v - mean) / std for v in values]


def splits(client):
    return client.train, client.val, client.test


@pytest.mark.parametrize("name, num_continuous", [("adult", 6), ("compas", 5)])
def test_per_client_uses_each_clients_own_training_statistics(roots, name, num_continuous):
    scaled, raw = build(name, roots, standardize="per_client"), build(name, roots, standardize="none")
    continuous = continuous_columns(name, roots)
    assert len(continuous) == num_continuous
    other = [j for j in range(raw.input_shape[0]) if j not in continuous]
    for s, r in zip(scaled.clients, raw.clients):  # same seed: same rows, only the scaling differs
        train = s.train.x[:, continuous].double()
        assert train.mean(0).tolist() == pytest.approx([0.0] * num_continuous, abs=1e-6)
        assert train.std(0, unbiased=False).tolist() == pytest.approx([1.0] * num_continuous, abs=1e-5)
        for j in continuous:
            train_raw = r.train.x[:, j].tolist()
            for s_split, r_split in zip(splits(s), splits(r)):  # val and test rows: the client's train statistics
                assert s_split.x[:, j].tolist() == pytest.approx(z(r_split.x[:, j].tolist(), train_raw), abs=1e-5)
        for s_split, r_split in zip(splits(s), splits(r)):
            assert torch.equal(s_split.x[:, other], r_split.x[:, other])  # one-hot columns untouched
            assert torch.equal(s_split.y, r_split.y)
    client_means = [c.train.x[:, continuous[0]].mean().item() for c in raw.clients]
    assert client_means[0] != client_means[1]  # the two clients' statistics really differ


def test_per_client_pooled_test_is_the_union_of_the_clients_test_splits(roots):
    data = build("adult", roots, standardize="per_client")
    assert len(data.test) == sum(len(c.test) for c in data.clients) == 4  # not adult.test's 3 rows
    assert torch.equal(data.test.x, torch.cat([c.test.x for c in data.clients]))


def test_pooled_is_the_default_and_uses_the_whole_training_file(roots):
    pooled, raw = build("adult", roots), build("adult", roots, standardize="none")
    continuous = continuous_columns("adult", roots)
    assert len(pooled.test) == 3  # adult.test stays the pooled test set
    file_values = list(zip(*(continuous_values(i) for i in range(NUM_ROWS))))
    pairs = [(pooled.test, raw.test)] + [
        pair for p, r in zip(pooled.clients, raw.clients) for pair in zip(splits(p), splits(r))
    ]
    for p_split, r_split in pairs:
        for j, values in zip(continuous, file_values):
            assert p_split.x[:, j].tolist() == pytest.approx(z(r_split.x[:, j].tolist(), values), abs=1e-5)


def test_none_keeps_the_raw_values(roots):
    data = build("compas", roots, standardize="none")
    ages = sorted(v for c in data.clients for split in splits(c) for v in split.x[:, 0].tolist())
    assert ages == [continuous_values(i)[0] for i in range(NUM_ROWS)]


def test_bad_value_is_one_line_naming_the_field():
    with pytest.raises(ConfigError, match=r"^data\.standardize: Input should be 'pooled', 'per_client' or 'none'"):
        validate({"data": {"name": "adult", "standardize": "per_silo"}})


def test_per_client_needs_client_test_splits():
    with pytest.raises(ConfigError, match="standardize='per_client' needs test_fraction > 0"):
        validate({"data": {"name": "adult", "standardize": "per_client", "test_fraction": 0.0}})


@pytest.mark.parametrize("mode", ["per_client", "none"])
def test_data_set_without_continuous_columns_refuses_a_mode(mode):
    with pytest.raises(DataError, match=f"data.standardize='{mode}': data set 'digits' declares no continuous"):
        build_dataset(DataConfig(name="digits", num_clients=2, standardize=mode), seed=0)
