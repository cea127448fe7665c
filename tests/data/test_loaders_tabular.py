"""Adult and COMPAS loaders on tiny files written in the original formats."""
from __future__ import annotations

import statistics

import pytest
import torch

from fedveil.data import DATASETS, DataError
from fedveil.data.loaders.adult import load_adult
from fedveil.data.loaders.compas import load_compas
from fedveil.data.standardise import standardise_pooled

ADULT_TRAIN = """\
39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, 2174, 0, 40, United-States, <=50K
50, Self-emp-not-inc, 83311, Bachelors, 13, Married-civ-spouse, Exec-managerial, Husband, White, Male, 0, 0, 13, United-States, <=50K
54, ?, 180211, Some-college, 10, Married-civ-spouse, ?, Husband, Asian-Pac-Islander, Male, 0, 0, 60, South, >50K
31, Private, 45781, Masters, 14, Never-married, Prof-specialty, Not-in-family, Black, Female, 14084, 0, 50, United-States, >50K

"""
ADULT_TEST = """\
|1x3 Cross validator
25, Private, 226802, 11th, 7, Never-married, Machine-op-inspct, Own-child, Black, Male, 0, 0, 40, United-States, <=50K.
38, Private, 89814, HS-grad, 9, Married-civ-spouse, Farming-fishing, Husband, White, Female, 0, 0, 50, ?, <=50K.
44, Local-gov, 160323, Bachelors, 13, Married-civ-spouse, Exec-managerial, Husband, Amer-Indian-Eskimo, Male, 7688, 0, 40, Mexico, >50K.

"""
ADULT_FEATURES = [
    "age", "workclass=Private", "workclass=Self-emp-not-inc", "workclass=State-gov", "fnlwgt",
    "education=Bachelors", "education=Masters", "education-num",
    "marital-status=Married-civ-spouse", "marital-status=Never-married",
    "occupation=Adm-clerical", "occupation=Exec-managerial", "occupation=Prof-specialty",
    "relationship=Husband", "relationship=Not-in-family", "race=Black", "race=White",
    "sex=Female", "sex=Male", "capital-gain", "capital-loss", "hours-per-week",
    "native-country=United-States",
]


def write_adult(tmp_path, train=ADULT_TRAIN, test=ADULT_TEST):
    (tmp_path / "adult.data").write_text(train)
    (tmp_path / "adult.test").write_text(test)
    return tmp_path


def z(value, train_values):
    """Standardised ``value`` with the population mean/std of ``train_values``."""
    return (value - statistics.fmean(train_values)) / statistics.pstdev(train_values)


def column(data, name):
    return data.x[:, data.info["feature_names"].index(name)]


def test_adult_registered():
    assert DATASETS.get("adult") is load_adult
    assert DATASETS.get("compas") is load_compas


def test_adult_rows_labels_and_groups(tmp_path):
    source = load_adult(write_adult(tmp_path), download=False)
    train, test = source.train, source.test
    assert (len(train), len(test)) == (3, 2)  # one '?' row dropped from each file
    assert source.task == "classification" and source.num_classes == 2
    assert train.y.tolist() == [0, 0, 1] and train.y.dtype == torch.int64
    assert test.y.tolist() == [0, 1]  # labels with a trailing dot
    assert train.groups["sex"].tolist() == [1, 1, 0]
    assert train.groups["race"].tolist() == [1, 1, 0]
    assert test.groups["sex"].tolist() == [1, 1]
    assert test.groups["race"].tolist() == [0, 0]


def test_adult_one_hot_uses_sorted_train_categories(tmp_path):
    source = load_adult(write_adult(tmp_path), download=False)
    train, test = source.train, source.test
    assert train.info["feature_names"] == ADULT_FEATURES
    assert train.x.shape == (3, 23) and train.x.dtype == torch.float32
    names = ADULT_FEATURES
    row0 = {names[j] for j in range(23) if "=" in names[j] and train.x[0, j] == 1}
    assert row0 == {
        "workclass=State-gov", "education=Bachelors", "marital-status=Never-married",
        "occupation=Adm-clerical", "relationship=Not-in-family", "race=White", "sex=Male",
        "native-country=United-States",
    }
    # test row 2: Local-gov, Amer-Indian-Eskimo and Mexico are unseen in train -> all zero
    row1 = {names[j] for j in range(23) if "=" in names[j] and test.x[1, j] == 1}
    assert row1 == {
        "education=Bachelors", "marital-status=Married-civ-spouse",
        "occupation=Exec-managerial", "relationship=Husband", "sex=Male",
    }


def test_adult_declares_its_raw_continuous_columns(tmp_path):
    source = load_adult(write_adult(tmp_path), download=False)
    names = source.train.info["feature_names"]
    assert [names[j] for j in source.continuous] == [
        "age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week",
    ]
    assert column(source.train, "age").tolist() == [39, 50, 31]
    assert column(source.test, "fnlwgt").tolist() == [226802, 160323]


def test_adult_pooled_standardisation_uses_train_statistics(tmp_path):
    source = standardise_pooled(load_adult(write_adult(tmp_path), download=False))
    ages, gains = [39, 50, 31], [2174, 0, 14084]
    assert column(source.train, "age").tolist() == pytest.approx([z(a, ages) for a in ages], abs=1e-5)
    assert column(source.test, "age").tolist() == pytest.approx([z(25, ages), z(44, ages)], abs=1e-5)
    assert column(source.test, "capital-gain").tolist() == pytest.approx(
        [z(0, gains), z(7688, gains)], abs=1e-5
    )
    # capital-loss is constant in train: centred, not divided by zero
    assert column(source.test, "capital-loss").tolist() == [0.0, 0.0]


def test_adult_drop_sensitive_keeps_groups(tmp_path):
    source = load_adult(write_adult(tmp_path), download=False, drop_sensitive=True)
    names = source.train.info["feature_names"]
    assert names == [n for n in ADULT_FEATURES if not n.startswith(("race=", "sex="))]
    assert source.train.x.shape == (3, 19) and source.test.x.shape == (2, 19)
    assert source.train.groups["sex"].tolist() == [1, 1, 0]


@pytest.mark.parametrize(
    "file, bad_line, line_no, message",
    [
        ("adult.data", "39, State-gov, 77516, Bachelors, 13, Never-married, Male, <=50K", 2, "expected 15"),
        ("adult.data", ADULT_TRAIN.splitlines()[0].replace("39,", "3x9,"), 2, "column 'age'"),
        ("adult.data", ADULT_TRAIN.splitlines()[0].replace("<=50K", "rich"), 2, "column 'income'"),
        ("adult.test", ADULT_TEST.splitlines()[1].replace("226802", "n/a"), 3, "column 'fnlwgt'"),
    ],
)
def test_adult_malformed_rows_name_file_and_line(tmp_path, file, bad_line, line_no, message):
    original = ADULT_TRAIN if file == "adult.data" else ADULT_TEST
    lines = original.splitlines()
    lines.insert(line_no - 1, bad_line)
    write_adult(tmp_path, **{"train" if file == "adult.data" else "test": "\n".join(lines)})
    with pytest.raises(DataError, match=f"{file}, line {line_no}.*{message}"):
        load_adult(tmp_path, download=False)


COMPAS_HEADER = (
    "id,name,first,last,compas_screening_date,sex,dob,age,age_cat,race,juv_fel_count,"
    "decile_score,juv_misd_count,juv_other_count,priors_count,days_b_screening_arrest,"
    "c_jail_in,c_jail_out,c_case_number,c_offense_date,c_arrest_date,c_days_from_compas,"
    "c_charge_degree,c_charge_desc,is_recid,r_case_number,r_charge_degree,r_days_from_arrest,"
    "r_offense_date,r_charge_desc,r_jail_in,r_jail_out,violent_recid,is_violent_recid,"
    "vr_case_number,vr_charge_degree,vr_offense_date,vr_charge_desc,type_of_assessment,"
    "decile_score,score_text,screening_date,v_type_of_assessment,v_decile_score,v_score_text,"
    "v_screening_date,in_custody,out_custody,priors_count,start,end,event,two_year_recid"
).split(",")
COMPAS_KEYS = (
    "sex age age_cat race juv_fel_count juv_misd_count juv_other_count priors_count "
    "days_b_screening_arrest c_charge_degree is_recid score_text two_year_recid"
).split()
COMPAS_ROWS = [  # values for COMPAS_KEYS; the rows marked "dropped" fail ProPublica's filters
    ("Male", 69, "Greater than 45", "Other", 0, 0, 0, 0, -1, "F", 0, "Low", 0),
    ("Male", 34, "25 - 45", "African-American", 0, 0, 0, 0, -1, "F", 1, "Low", 1),
    ("Male", 24, "Less than 25", "African-American", 0, 0, 1, 4, "", "F", 1, "Low", 1),  # dropped
    ("Male", 44, "25 - 45", "Hispanic", 0, 0, 0, 2, 31, "F", 1, "Medium", 1),  # dropped
    ("Female", 30, "25 - 45", "Hispanic", 0, 0, 0, 1, 0, "O", 0, "Low", 0),  # dropped
    ("Male", 52, "Greater than 45", "Caucasian", 0, 0, 0, 1, 0, "F", -1, "Low", 0),  # dropped
    ("Male", 27, "25 - 45", "Asian", 0, 0, 0, 1, 0, "M", 0, "N/A", 0),  # dropped
    ("Female", 23, "Less than 25", "Caucasian", 1, 0, 2, 3, 30, "M", 1, "Medium", 1),
    ("Female", 41, "25 - 45", "African-American", 0, 1, 0, 14, -30, "F", 0, "High", 0),
]


def compas_fields(values: tuple) -> list[str]:
    """A full 53-field row: ``values`` for COMPAS_KEYS, "x" in the columns the loader ignores."""
    given = dict(zip(COMPAS_KEYS, map(str, values)))
    return [given.get(name, "x") for name in COMPAS_HEADER]


def write_compas(tmp_path, header=COMPAS_HEADER):
    lines = [",".join(header)] + [",".join(compas_fields(r)) for r in COMPAS_ROWS]
    (tmp_path / "compas-scores-two-years.csv").write_text("\n".join(lines) + "\n")
    return tmp_path


def test_compas_filters_and_targets(tmp_path):
    source = load_compas(write_compas(tmp_path), download=False)
    data = source.train
    assert source.test is None and source.num_classes == 2
    assert len(data) == 4  # rows 1, 2, 8, 9 pass the filters
    assert data.y.tolist() == [0, 1, 1, 0] and data.y.dtype == torch.int64
    assert data.groups["race"].tolist() == [0, 1, 0, 1]
    assert data.groups["sex"].tolist() == [1, 1, 0, 0]


def test_compas_features(tmp_path):
    source = load_compas(write_compas(tmp_path), download=False)
    assert source.continuous == (0, 1, 2, 3, 4)
    assert column(source.train, "priors_count").tolist() == [0, 0, 3, 14]  # raw
    data = standardise_pooled(source).train
    assert data.info["feature_names"] == [
        "age", "priors_count", "juv_fel_count", "juv_misd_count", "juv_other_count",
        "c_charge_degree=F", "c_charge_degree=M",
        "age_cat=25 - 45", "age_cat=Greater than 45", "age_cat=Less than 25",
        "sex=Male", "race=African-American", "race=Caucasian", "race=Other",
    ]  # categories of dropped rows (O, Hispanic, Asian) do not appear
    assert data.x[:, 5:].tolist() == [
        [1, 0, 0, 1, 0, 1, 0, 0, 1],
        [1, 0, 1, 0, 0, 1, 1, 0, 0],
        [0, 1, 0, 0, 1, 0, 0, 1, 0],
        [1, 0, 1, 0, 0, 0, 1, 0, 0],
    ]
    kept = {
        "age": [69, 34, 23, 41], "priors_count": [0, 0, 3, 14], "juv_fel_count": [0, 0, 1, 0],
        "juv_misd_count": [0, 0, 0, 1], "juv_other_count": [0, 0, 2, 0],
    }
    for name, values in kept.items():
        assert column(data, name).tolist() == pytest.approx([z(v, values) for v in values], abs=1e-5)


def test_compas_drop_sensitive(tmp_path):
    data = load_compas(write_compas(tmp_path), download=False, drop_sensitive=True).train
    assert data.x.shape == (4, 10)
    assert not any(n.startswith(("sex", "race")) for n in data.info["feature_names"])
    assert data.groups["race"].tolist() == [0, 1, 0, 1]


def test_compas_missing_header_column(tmp_path):
    header = [n for n in COMPAS_HEADER if n != "two_year_recid"] + ["other"]
    write_compas(tmp_path, header=header)
    with pytest.raises(DataError, match="compas-scores-two-years.csv, line 1.*two_year_recid"):
        load_compas(tmp_path, download=False)


def test_compas_wrong_field_count(tmp_path):
    write_compas(tmp_path)
    path = tmp_path / "compas-scores-two-years.csv"
    lines = path.read_text().splitlines()
    lines[2] += ",extra"
    path.write_text("\n".join(lines))
    with pytest.raises(DataError, match="csv, line 3: expected 53 fields"):
        load_compas(tmp_path, download=False)


@pytest.mark.parametrize("key, value", [("age", "sixty"), ("days_b_screening_arrest", "soon")])
def test_compas_unparsable_number(tmp_path, key, value):
    fields = compas_fields(COMPAS_ROWS[0])
    fields[COMPAS_HEADER.index(key)] = value
    write_compas(tmp_path)
    path = tmp_path / "compas-scores-two-years.csv"
    path.write_text(path.read_text() + ",".join(fields) + "\n")
    with pytest.raises(DataError, match=f"line 11, column '{key}': '{value}' is not a number"):
        load_compas(tmp_path, download=False)


def test_missing_files_without_download(tmp_path):
    with pytest.raises(DataError, match="adult.data"):
        load_adult(tmp_path, download=False)
    with pytest.raises(DataError, match="compas-scores-two-years.csv"):
        load_compas(tmp_path, download=False)
