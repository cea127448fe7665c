"""Silos that read their own files (issue 35, item 4): the operator writes federation.json
from the config alone, three silo services each read their own CSV, and the run goes end
to end through their sockets; a silo file that breaks the schema stops its service at
start with one line naming the column."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from fedveil.config import validate
from fedveil.data.errors import DataError
from fedveil.deploy.silo_data import SILO_FILE, read_federation, silo_folder
from fedveil.deploy.silo_service import SiloService
from fedveil.deploy.silo_table import load_silo_table, table_schema, write_schema_federation

from tests.deploy.test_silo_service import run_through_services

pytestmark = pytest.mark.filterwarnings("ignore:privacy.secure_rng is false")
HEADER = ["age", "smoker", "sex", "readmitted"]
OPTIONS = {
    "path": "unused-by-silos.csv", "label": "readmitted", "features": ["age", "smoker"], "categorical": ["smoker"],
    "groups": ["sex"], "categories": {"smoker": ["no", "yes"]}, "classes": ["no", "yes"], "task": "classification",
}


def table_config(**data_changes):
    data = {"name": "table", "num_clients": 3, "options": OPTIONS, "standardize": "per_client", "test_fraction": 0.25,
            "partition": {"name": "natural", "key": "client"}, **data_changes}
    return validate({
        "data": data, "model": {"name": "mlp", "options": {"hidden": [8]}}, "client": {"lr": 0.3, "batch_size": 16},
        "federation": {"rounds": 4, "clients_per_round": 3}, "checkpoint": {"every": 1},
        "privacy": {"level": "example", "epsilon": 4.0, "delta": 1e-5, "clip": 1.0},
    })


def write_silo_csv(path: Path, n: int, shift: float, seed: int, header=HEADER, smoker_values=("no", "yes")) -> Path:
    rng = np.random.default_rng(seed)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for _ in range(n):
            age = rng.normal(50 + shift, 10)
            smoker = rng.choice(smoker_values)
            row = {"age": f"{age:.0f}", "smoker": smoker, "sex": rng.choice(["F", "M"]),
                   "readmitted": "yes" if age + 10 * (smoker == "yes") + rng.normal(0, 5) > 55 else "no", "extra": "1"}
            writer.writerow([row[h] for h in header])
    return path


def test_three_silos_read_their_own_csv_and_train_end_to_end(tmp_path):
    config = table_config()
    shape = write_schema_federation(config, tmp_path / "fed")
    assert shape.input_shape == (3,) and shape.num_classes == 2 and shape.model_name == "mlp"
    facts = json.loads((tmp_path / "fed" / "federation.json").read_text())
    assert facts["table"]["feature_names"] == ["age", "smoker=no", "smoker=yes"]
    assert not any((silo_folder(tmp_path / "fed", k) / SILO_FILE).exists() for k in range(3))  # no rows were written
    files = [write_silo_csv(tmp_path / f"site-{k}.csv", n, shift, seed=k) for k, (n, shift) in enumerate([(80, -5), (60, 0), (40, 8)])]
    services = [SiloService(silo_folder(tmp_path / "fed", k), tmp_path / f"s{k}.sock", share_metrics=True, table=files[k])
                for k in range(3)]
    assert [s.own_rows[0] for s in services] == [0, 1, 2]
    assert [s.own_rows[1].num_train + len(s.own_rows[1].test) for s in services] == [80, 60, 40]
    fed_shape, _ = read_federation(tmp_path / "fed")
    summary, recorder = run_through_services(config, fed_shape, services)
    assert [r["survivors"] for r in recorder.rows] == [3, 3, 3, 3]
    assert 0 < summary["epsilon"] <= 4.0 * (1 + 1e-6)
    assert summary["evaluated_silos"] == 3
    assert summary["global_client_accuracy_weighted_mean"] > 0.6  # it learned (0.756 when written; seeded)


def test_a_silo_splits_and_standardises_its_own_rows(tmp_path, monkeypatch):
    import fedveil.deploy.silo_table as silo_table

    write_schema_federation(table_config(), tmp_path / "fed")
    path = write_silo_csv(tmp_path / "mine.csv", 40, 30, seed=5)
    reads = []
    monkeypatch.setattr(silo_table, "read_table", lambda p, read=silo_table.read_table: reads.append(p) or read(p))
    cid, client = load_silo_table(silo_folder(tmp_path / "fed", 2), path)
    assert reads == [path]  # the file is read once: checked, then encoded
    assert cid == 2 and client.num_train == 30 and len(client.test) == 10
    age = client.train.x[:, 0].double()
    assert abs(age.mean().item()) < 1e-5 and age.std(unbiased=False).item() == pytest.approx(1.0, rel=1e-4)
    again = load_silo_table(silo_folder(tmp_path / "fed", 2), path)[1]  # the split is seeded by (seed, silo)
    assert np.array_equal(again.train.x.numpy(), client.train.x.numpy())


@pytest.mark.parametrize("expected, write", [
    ("column 'extra' is not in the federation's schema", lambda p: write_silo_csv(p, 10, 0, 1, header=[*HEADER, "extra"])),
    ("no column 'smoker'", lambda p: write_silo_csv(p, 10, 0, 1, header=["age", "sex", "readmitted"])),
    ("column 'smoker' has value 'sometimes', outside its categories no, yes",
     lambda p: write_silo_csv(p, 10, 0, 1, smoker_values=("no", "sometimes"))),
    ("feature column 'age' is not numeric", lambda p: p.write_text("age,smoker,sex,readmitted\nold,no,F,yes\n")),
])
def test_a_silo_file_that_breaks_the_schema_stops_the_service_at_start(tmp_path, expected, write):
    write_schema_federation(table_config(), tmp_path / "fed")
    bad = tmp_path / "bad.csv"
    write(bad)
    with pytest.raises(DataError) as caught:
        SiloService(silo_folder(tmp_path / "fed", 0), tmp_path / "s.sock", table=bad)
    assert expected in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("expected, options, data", [
    ("data.options.categories: list the values of smoker", {**OPTIONS, "categories": {}}, {}),
    ("data.options.classes: list the label's classes", {k: v for k, v in OPTIONS.items() if k != "classes"}, {}),
    ("data.options.task: name it in the config", {**OPTIONS, "task": "auto"}, {}),
    ('data.standardize: "pooled" needs every silo\'s rows', OPTIONS, {"standardize": "pooled"}),
])
def test_a_schema_the_config_leaves_open_is_refused(expected, options, data):
    with pytest.raises(DataError, match=expected.replace("(", r"\(")):
        table_schema(table_config(options=options, **data))
