"""``fedveil pets`` (issue 36, item 6): the pandemic pipeline from a config and the CLI, into a
run directory with a summary, the predictions and a precision-recall plot; bad input is one
line and exit status 2 before any work."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from sklearn.metrics import average_precision_score

from fedveil.cli.main import main
from fedveil.pets.csv_io import write_csv_tables
from fedveil.pets.synthetic import SyntheticConfig, synthetic_pandemic

TINY = """
[data]
synthetic = { num_people = 400, num_regions = 2, seed = 3 }

[pipeline]
method = "mrmtl"
num_neighbours = 5
rounds = 2
local_epochs = 2

[train]
batch_size = 32
noise_multiplier = 1.0
"""


def cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write_config(tmp_path, text=TINY):
    path = tmp_path / "pets.toml"
    path.write_text(text)
    return path


def test_a_config_runs_into_a_run_directory_whose_numbers_check_out(tmp_path, capsys):
    code, out, _ = cli(capsys, "pets", str(write_config(tmp_path)), "--out", str(tmp_path / "run"), "--quiet")
    assert code == 0 and "average precision" in out and "not a guarantee" in out
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert (run / "precision_recall.png").stat().st_size > 0 and (run / "data").is_dir()
    with open(run / "predictions.csv") as handle:
        rows = list(csv.DictReader(handle))
    risks = np.array([float(r["risk"]) for r in rows])
    infected = np.array([int(r["infected"]) for r in rows])
    assert len(rows) == 400 == sum(s["num_people"] for s in summary["silos"])
    assert summary["ap"] == pytest.approx(average_precision_score(infected, risks), abs=1e-5)  # risks kept to 6 digits
    assert summary["positives"] == infected.sum() and summary["random_ap"] == pytest.approx(infected.mean())
    assert [s["silo"] for s in summary["silos"]] == ["region0", "region1"]
    assert all(s["steps"] > 0 and s["thm244_node_epsilon"]["thesis"] > 0 for s in summary["silos"])
    assert "not a guarantee" in summary["thm244_note"]


def test_csv_tables_and_overrides_pick_the_data_and_the_method(tmp_path, capsys):
    tables = write_csv_tables(synthetic_pandemic(SyntheticConfig(num_people=300, num_regions=2, seed=1)), tmp_path / "csv")
    config = write_config(tmp_path, TINY.replace("synthetic = { num_people = 400, num_regions = 2, seed = 3 }", 'dir = "csv"'))
    code, _, _ = cli(capsys, "pets", str(config), 'pipeline.method="sir_baseline"', "--out", str(tmp_path / "sir"), "--quiet")
    assert code == 0
    summary = json.loads((tmp_path / "sir" / "summary.json").read_text())
    assert summary["method"] == "sir_baseline" and summary["data"] == "csv tables" and "thm244_note" not in summary
    assert sum(s["num_people"] for s in summary["silos"]) == 300 and tables.is_dir()


SYNTHETIC = "synthetic = { num_people = 400, num_regions = 2, seed = 3 }"


@pytest.mark.parametrize("text, overrides, match", [
    (TINY.replace(SYNTHETIC, SYNTHETIC + '\ndir = "x"'), [], "exactly one of data.dir"),
    (TINY, ['train.lr="fast"'], "train.lr"),
    (TINY, ['pipeline.methd="local"'], "methd"),
    (TINY, ['pipeline.method="fedavg"'], "pipeline.method"),
    (TINY, ["=3"], "not of the form"),
    (TINY.replace(SYNTHETIC, 'dir = "nowhere"'), [], "is not a folder"),
])
def test_bad_input_is_one_line_before_work(tmp_path, capsys, text, overrides, match):
    code, _, err = cli(capsys, "pets", str(write_config(tmp_path, text)), *overrides, "--out", str(tmp_path / "run"))
    assert code == 2 and match in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_a_finished_run_directory_is_not_overwritten(tmp_path, capsys):
    config = str(write_config(tmp_path))
    assert cli(capsys, "pets", config, "--out", str(tmp_path / "run"), "--quiet")[0] == 0
    code, _, err = cli(capsys, "pets", config, "--out", str(tmp_path / "run"), "--quiet")
    assert code == 2 and "holds a finished PETs run" in err


def test_a_folder_without_the_tables_is_named_in_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    config = write_config(tmp_path, TINY.replace(SYNTHETIC, 'dir = "empty"'))
    code, _, err = cli(capsys, "pets", str(config), "--out", str(tmp_path / "run"), "--quiet")
    assert code == 2 and "person.csv: missing" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()
