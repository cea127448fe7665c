"""The ``table`` data set (issue 39 item 2, the reader issue 35's silos share): CSV and
Parquet, one file or one per client, categorical and group columns, each bad input one
line. Tiny files are written in each test; the expected encodings are worked out by hand."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
import torch

from fedveil.config import DataConfig
from fedveil.data.errors import DataError
from fedveil.data.loaders.table import load_table
from fedveil.runtime.dataset import build_dataset

HEADER = ["age", "city", "site", "sex", "outcome"]
ROWS = [
    ["30", "paris", "north", "F", "yes"],
    ["40", "rome", "north", "M", "no"],
    ["50", "paris", "south", "M", "yes"],
    ["60", "oslo", "south", "F", "no"],
    ["20", "rome", "east", "F", "no"],
]


def write_csv(path: Path, rows, header=HEADER) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def test_a_csv_is_encoded_with_one_hot_categories_groups_and_text_classes(tmp_path):
    write_csv(tmp_path / "t.csv", ROWS)
    source = load_table(tmp_path, path="t.csv", label="outcome", categorical=["city"], groups=["sex"], client="site")
    train = source.train
    assert train.info["feature_names"] == ["age", "city=oslo", "city=paris", "city=rome"]
    assert torch.equal(train.x, torch.tensor([[30, 0, 1, 0], [40, 0, 0, 1], [50, 0, 1, 0], [60, 1, 0, 0], [20, 0, 0, 1]],
                                             dtype=torch.float32))
    assert source.task == "classification" and source.num_classes == 2 and train.info["classes"] == ["no", "yes"]
    assert train.y.tolist() == [1, 0, 1, 0, 0]
    assert train.groups["sex"].tolist() == [0, 1, 1, 0, 0]  # F < M
    assert train.groups["site"].tolist() == [1, 1, 2, 2, 0]  # east < north < south
    assert source.natural_groups == "site" and source.continuous == (0,)


def test_a_folder_gives_one_client_per_file_like_a_client_column(tmp_path):
    folder = tmp_path / "sites"
    folder.mkdir()
    for site in ("east", "north", "south"):
        write_csv(folder / f"{site}.csv", [r for r in ROWS if r[2] == site])
    per_file = load_table(tmp_path, path="sites", label="outcome", features=["age", "city"], categorical=["city"])
    assert per_file.natural_groups == "client" and per_file.train.groups["client"].tolist() == [0, 1, 1, 2, 2]
    assert per_file.train.info["group_categories"]["client"] == ["east.csv", "north.csv", "south.csv"]
    ordered = [ROWS[4], ROWS[0], ROWS[1], ROWS[2], ROWS[3]]  # the files' order
    write_csv(tmp_path / "one.csv", ordered)
    one = load_table(tmp_path, path="one.csv", label="outcome", features=["age", "city"], categorical=["city"], client="site")
    assert torch.equal(per_file.train.x, one.train.x) and torch.equal(per_file.train.y, one.train.y)
    # natural partition: one client per file, with that file's rows
    data = build_dataset(DataConfig(name="table", root=str(tmp_path), num_clients=3, test_fraction=0.5, standardize="none",
                                    options={"path": "sites", "label": "outcome", "features": ["age"]},
                                    partition={"name": "natural", "key": "client"}), seed=0)
    assert [c.num_train + len(c.test) for c in data.clients] == [1, 2, 2]


def test_parquet_reads_as_the_csv_does(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    write_csv(tmp_path / "t.csv", ROWS)
    columns = {name: [row[i] for row in ROWS] for i, name in enumerate(HEADER)}
    columns["age"] = [int(v) for v in columns["age"]]  # a real Parquet file keeps numbers as numbers
    pq.write_table(pa.table(columns), tmp_path / "t.parquet")
    kwargs = dict(label="outcome", categorical=["city"], groups=["sex"], client="site")
    a, b = load_table(tmp_path, path="t.csv", **kwargs), load_table(tmp_path, path="t.parquet", **kwargs)
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.train.y, b.train.y)
    assert all(torch.equal(a.train.groups[k], b.train.groups[k]) for k in a.train.groups)


def test_a_real_valued_label_is_regression_and_whole_numbers_are_classes(tmp_path):
    write_csv(tmp_path / "r.csv", [["1", "0.5"], ["2", "1.25"], ["3", "2.0"]], header=["x", "score"])
    reg = load_table(tmp_path, path="r.csv", label="score")
    assert reg.task == "regression" and reg.num_classes == 0 and reg.train.y.dtype == torch.float32
    assert reg.train.y.tolist() == [0.5, 1.25, 2.0]
    write_csv(tmp_path / "c.csv", [["1", "3"], ["2", "1"], ["3", "3"]], header=["x", "grade"])
    cls = load_table(tmp_path, path="c.csv", label="grade")
    assert cls.task == "classification" and cls.train.info["classes"] == ["1", "3"] and cls.train.y.tolist() == [1, 0, 1]


def test_per_client_standardisation_applies_to_the_numeric_columns(tmp_path):
    rows = [[str(a), "paris", site, "F", "yes" if a % 2 else "no"] for site, base in (("north", 10), ("south", 1000))
            for a in range(base, base + 20)]
    write_csv(tmp_path / "t.csv", rows)
    data = build_dataset(DataConfig(name="table", root=str(tmp_path), num_clients=2, test_fraction=0.2, standardize="per_client",
                                    options={"path": "t.csv", "label": "outcome", "features": ["age", "city"], "categorical": ["city"], "client": "site"},
                                    partition={"name": "natural", "key": "site"}), seed=0)
    for client in data.clients:
        age = client.train.x[:, 0].double()
        assert abs(age.mean().item()) < 1e-5 and age.std(unbiased=False).item() == pytest.approx(1.0, rel=1e-4)
        assert set(client.train.x[:, 1].tolist()) == {1.0}  # the one-hot column is left as it is


BAD = {
    "data.options.label: name the target column": dict(path="t.csv"),
    "no column 'weight'": dict(path="t.csv", label="outcome", features=["age", "weight"]),
    "feature column 'city' is not numeric (value 'paris'); list it in data.options.categorical": dict(path="t.csv", label="outcome", features=["age", "city"]),
    "data.options.path: give the CSV or Parquet file": dict(label="outcome"),
    "table file": dict(path="missing.csv", label="outcome"),
    "a folder already gives one client per file": dict(path="sites", label="outcome", client="site"),
    "task 'regression' needs a numeric label": dict(path="t.csv", label="outcome", task="regression", features=["age"]),
}


@pytest.mark.parametrize("expected", list(BAD))
def test_each_bad_option_is_one_line_naming_the_problem(tmp_path, expected):
    write_csv(tmp_path / "t.csv", ROWS)
    (tmp_path / "sites").mkdir()
    write_csv(tmp_path / "sites" / "a.csv", ROWS[:2])
    with pytest.raises(DataError) as caught:
        load_table(tmp_path, **BAD[expected])
    assert expected in str(caught.value) and "\n" not in str(caught.value)


def test_each_bad_file_is_one_line_naming_the_file_or_column(tmp_path):
    cases = {}
    write_csv(tmp_path / "gap.csv", [["30", "", "north", "F", "yes"]])
    cases["gap.csv"] = "column 'city' has no value at data row 1"
    (tmp_path / "empty").mkdir()
    write_csv(tmp_path / "empty" / "a.csv", ROWS[:2])
    write_csv(tmp_path / "empty" / "b.csv", [])
    cases["empty"] = "client file 'b.csv' has no rows"
    (tmp_path / "mixed").mkdir()
    write_csv(tmp_path / "mixed" / "a.csv", ROWS[:2])
    write_csv(tmp_path / "mixed" / "b.csv", [r[:4] for r in ROWS[2:]], header=HEADER[:4])
    cases["mixed"] = "'b.csv' has columns age, city, site, sex, not those of 'a.csv'"
    (tmp_path / "short.csv").write_text("age,outcome\n1,yes\n2\n")
    cases["short.csv"] = "'short.csv' line 3: 1 values for 2 columns"
    (tmp_path / "t.txt").write_text("age,outcome\n1,yes\n")
    cases["t.txt"] = "a table is a .csv or .parquet file"
    for path, expected in cases.items():
        with pytest.raises(DataError) as caught:
            load_table(tmp_path, path=path, label="outcome", categorical=["city"])
        assert expected in str(caught.value) and "\n" not in str(caught.value), path


def test_a_test_table_is_encoded_with_the_training_categories(tmp_path):
    write_csv(tmp_path / "train.csv", ROWS)
    write_csv(tmp_path / "test.csv", [["35", "rome", "north", "M", "no"]])
    kwargs = dict(label="outcome", categorical=["city"], groups=["sex"], client="site")
    source = load_table(tmp_path, path="train.csv", test_path="test.csv", **kwargs)
    assert source.test.x.tolist() == [[35.0, 0.0, 0.0, 1.0]] and source.test.y.tolist() == [0]
    write_csv(tmp_path / "new.csv", [["35", "lima", "north", "M", "no"]])
    with pytest.raises(DataError, match="column 'city' has value 'lima', outside its categories paris, rome, oslo|column 'city' has value 'lima', outside its categories oslo, paris, rome"):
        load_table(tmp_path, path="train.csv", test_path="new.csv", **kwargs)
    assert np.isfinite(source.train.x.numpy()).all()
