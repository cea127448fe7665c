"""``fedveil evaluate RUN_DIR [--width W]``: a saved model re-evaluated, customised at test time."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from fedveil.cli.main import main
from fedveil.config import validate
from fedveil.models.complexity import count_macs, count_params
from fedveil.runtime import run
from fedveil.runtime.saved_model import evaluate_saved, load_saved_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from tiny_runs import tiny_config  # noqa: E402

torch.set_num_threads(1)

SPLIT_MIX = {
    "data": {"name": "digits", "num_clients": 4},
    "model": {"name": "digit_cnn", "options": {"width": 0.5, "bases": 4}},
    "algorithm": {"name": "split_mix", "budgets": [0.125, 0.5]},
    "client": {"batch_size": 16, "lr": 0.05, "steps": 2},
    "federation": {"rounds": 2, "clients_per_round": 4},
    "eval": {"batch_size": 128},
}


@pytest.fixture(scope="module")
def split_mix_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "split_mix"
    run(tiny_config(**SPLIT_MIX), out, progress=False)
    return out


def test_each_width_is_its_mixed_bases_accuracy_and_cost(split_mix_run):
    sim, params = load_saved_run(split_mix_run)
    rows = evaluate_saved(split_mix_run, [0.25, 0.5])
    test = sim.data.test
    for row, bases in zip(rows, (2, 4)):
        # batch statistics at test time: the same batches of eval.batch_size = 128 rows
        correct = sum(
            int((sim.algorithm.predict_bases(params, test.x[i : i + 128], bases).argmax(1) == test.y[i : i + 128]).sum())
            for i in range(0, len(test), 128)
        )
        assert row["accuracy"] == pytest.approx(correct / len(test), abs=1e-12)
        module = sim.algorithm.mixers[bases]
        assert row["params"] == count_params(module) == bases * count_params(sim.algorithm.mixers[1])
        assert row["macs"] == count_macs(module, (1, 8, 8)) == bases * count_macs(sim.algorithm.mixers[1], (1, 8, 8))
    # the width the run evaluated is its last global_test_accuracy
    summary = evaluate_saved(split_mix_run)[0]
    assert summary["width"] is None and summary["accuracy"] == pytest.approx(rows[1]["accuracy"])


def test_cli_prints_one_row_per_width(split_mix_run, capsys):
    assert main(["evaluate", str(split_mix_run), "--width", "all"]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert lines[0].split() == ["width", "lambda", "accuracy", "loss", "params", "MACs"]
    assert [line.split()[0] for line in lines[1:5]] == ["x0.125", "x0.25", "x0.375", "x0.5"]
    # then what the run itself measured: Split-Mix's own signals at its last round
    assert "method signals" in out and "bases trained per client (mean)" in out
    assert main(["evaluate", str(split_mix_run), "--width", "0.25"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[1].split()[0] == "x0.25"


@pytest.mark.parametrize("width, message", [
    ("2", "not in (0, 1]"), ("wide", "not a number"), ("0.1", "not one the model serves"),
    ("0.3", "valid widths: 0.125, 0.25, 0.375, 0.5"),
])
def test_bad_widths_are_one_line_errors(split_mix_run, capsys, width, message):
    assert main(["evaluate", str(split_mix_run), "--width", width]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_algorithms_without_widths_and_unfinished_runs_are_refused(tmp_path, capsys):
    out = tmp_path / "fedavg"
    run(validate({"data": {"name": "digits", "num_clients": 2}, "federation": {"rounds": 1, "clients_per_round": 2}}), out, progress=False)
    assert main(["evaluate", str(out)]) == 0
    assert main(["evaluate", str(out), "--width", "0.5"]) == 2
    assert "has no test-time width" in capsys.readouterr().err
    assert main(["evaluate", str(out), "--lam", "0.5"]) == 2
    assert "mixes dual batch norms" in capsys.readouterr().err
    assert main(["evaluate", str(out), "--lam", "1.5"]) == 2
    assert "not in [0, 1]" in capsys.readouterr().err
    assert main(["evaluate", str(tmp_path / "nothing")]) == 2
    assert "not a finished fedveil run" in capsys.readouterr().err


def test_refresh_bn_needs_tracked_statistics_and_recomputes_them(split_mix_run, tmp_path, capsys):
    assert main(["evaluate", str(split_mix_run), "--refresh-bn", "2"]) == 2
    assert "no BatchNorm with running statistics" in capsys.readouterr().err
    tracked = dict(SPLIT_MIX, model={"name": "digit_cnn", "options": {"width": 0.5, "bases": 4, "norm": "batch_tracked"}})
    out = tmp_path / "tracked"
    run(tiny_config(**tracked), out, progress=False)
    before, after = evaluate_saved(out)[0], evaluate_saved(out, refresh_bn=2)[0]
    assert before["loss"] != after["loss"]
