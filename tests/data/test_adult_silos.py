"""Adult cut into natural silos by a categorical attribute, on tiny files in the UCI format."""
from __future__ import annotations

import pytest
import torch

from fedveil.config import DataConfig
from fedveil.data import DataError
from fedveil.runtime.dataset import build_dataset
from fedveil.data.loaders.adult import load_adult

# 9 complete rows (all 5 races, 4 regions) and one with a missing value, which is dropped.
ADULT_TRAIN = """\
39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, 2174, 0, 40, United-States, <=50K
50, Self-emp-not-inc, 83311, Bachelors, 13, Married-civ-spouse, Exec-managerial, Husband, White, Male, 0, 0, 13, Canada, <=50K
38, Private, 215646, HS-grad, 9, Divorced, Handlers-cleaners, Not-in-family, White, Male, 0, 0, 40, Germany, <=50K
53, Private, 234721, 11th, 7, Married-civ-spouse, Handlers-cleaners, Husband, Black, Male, 0, 0, 40, United-States, <=50K
28, Private, 338409, Bachelors, 13, Married-civ-spouse, Prof-specialty, Wife, Black, Female, 0, 0, 40, Cuba, <=50K
54, ?, 180211, Some-college, 10, Married-civ-spouse, ?, Husband, Asian-Pac-Islander, Male, 0, 0, 60, South, >50K
30, State-gov, 141297, Bachelors, 13, Married-civ-spouse, Prof-specialty, Husband, Asian-Pac-Islander, Male, 0, 0, 40, India, >50K
32, Private, 205019, Assoc-acdm, 12, Never-married, Sales, Not-in-family, Amer-Indian-Eskimo, Male, 0, 0, 50, United-States, <=50K
40, Private, 121772, Assoc-voc, 11, Married-civ-spouse, Craft-repair, Husband, Other, Male, 0, 0, 40, Atlantis, >50K
34, Private, 245487, 7th-8th, 4, Married-civ-spouse, Transport-moving, Husband, Amer-Indian-Eskimo, Male, 0, 0, 45, Mexico, <=50K

"""
ADULT_TEST = """\
|1x3 Cross validator
25, Private, 226802, 11th, 7, Never-married, Machine-op-inspct, Own-child, Black, Male, 0, 0, 40, United-States, <=50K.
44, Local-gov, 160323, Bachelors, 13, Married-civ-spouse, Exec-managerial, Husband, Other, Male, 7688, 0, 40, Japan, >50K.

"""
RACES = ["Amer-Indian-Eskimo", "Asian-Pac-Islander", "Black", "Other", "White"]
REGIONS = ["United-States", "Latin-America", "Europe", "Asia", "Other"]


@pytest.fixture
def adult_dir(tmp_path):
    (tmp_path / "adult.data").write_text(ADULT_TRAIN)
    (tmp_path / "adult.test").write_text(ADULT_TEST)
    return tmp_path


def test_every_categorical_column_is_a_group_of_category_codes(adult_dir):
    train = load_adult(adult_dir, download=False).train
    names = train.info["group_categories"]
    assert names["race_code"] == RACES
    assert train.groups["race_code"].tolist() == [4, 4, 4, 2, 2, 1, 0, 3, 0]
    assert train.groups["race_code"].dtype == torch.int64
    assert names["workclass_code"] == ["Private", "Self-emp-not-inc", "State-gov"]
    assert train.groups["workclass_code"].tolist() == [2, 1, 0, 0, 0, 2, 0, 0, 0]
    expected = {
        "workclass", "education", "marital-status", "occupation", "relationship", "race", "sex",
        "native-country", "region",
    }
    assert set(names) == {f"{c}_code" for c in expected}
    assert {"sex", "race"} | set(names) == set(train.groups)


def test_native_country_is_grouped_into_regions(adult_dir):
    train = load_adult(adult_dir, download=False).train
    assert train.info["group_categories"]["region_code"] == REGIONS
    regions = [REGIONS[c] for c in train.groups["region_code"].tolist()]
    # US, Canada, Germany, US, Cuba, India, US, Atlantis (not a UCI country), Mexico
    assert regions == [
        "United-States", "Other", "Europe", "United-States", "Latin-America", "Asia",
        "United-States", "Other", "Latin-America",
    ]


def test_test_rows_use_the_train_categories(adult_dir):
    test = load_adult(adult_dir, download=False).test
    assert test.groups["race_code"].tolist() == [2, 3]
    assert test.groups["workclass_code"].tolist() == [0, -1]  # Local-gov is not in the train file
    assert test.groups["region_code"].tolist() == [0, 3]


def test_binary_fairness_groups_and_x_are_unchanged(adult_dir):
    source = load_adult(adult_dir, download=False)
    assert source.train.groups["race"].tolist() == [1, 1, 1, 0, 0, 0, 0, 0, 0]
    assert source.train.groups["sex"].tolist() == [1, 1, 1, 1, 0, 1, 1, 1, 1]
    assert not any(name.endswith("_code") for name in source.train.info["feature_names"])


@pytest.mark.parametrize(
    "key, counts",
    [("race_code", [2, 1, 2, 1, 3]), ("region_code", [3, 2, 1, 1, 2]), ("sex_code", [1, 8])],
)
def test_natural_partition_gives_one_client_per_category(adult_dir, key, counts):
    cfg = DataConfig(
        name="adult", root=str(adult_dir), download=False, num_clients=len(counts),
        partition={"name": "natural", "key": key}, test_fraction=0.0,
    )
    data = build_dataset(cfg, seed=0)
    assert [c.num_train for c in data.clients] == counts
    for code, client in enumerate(data.clients):
        assert client.train.groups[key].unique().tolist() == [code]
    assert len(data.test) == 2  # the pooled test set stays adult.test


def test_natural_partition_needs_one_client_per_present_category(adult_dir):
    cfg = DataConfig(
        name="adult", root=str(adult_dir), download=False, num_clients=4,
        partition={"name": "natural", "key": "race_code"},
    )
    with pytest.raises(DataError, match="5 distinct 'race_code' groups.*set num_clients=5"):
        build_dataset(cfg, seed=0)


def test_natural_groups_option_declares_the_silo_key(adult_dir):
    assert load_adult(adult_dir, download=False).natural_groups is None
    source = load_adult(adult_dir, download=False, natural_groups="region_code")
    assert source.natural_groups == "region_code"
    with pytest.raises(DataError, match="natural_groups='race' is not a silo key; choose one of .*race_code"):
        load_adult(adult_dir, download=False, natural_groups="race")
