"""Progress: a tqdm bar on a terminal, a few plain lines elsewhere, nothing with progress=False."""
from __future__ import annotations

import io

from fedveil.runtime import ProgressBar, run
from fedveil.runtime import simulation as simulation_module
from tiny_runs import tiny_config


def drive(bar: ProgressBar, total: int) -> None:
    bar.on_run_start(total, 0)
    for r in range(1, total + 1):
        bar.on_round_end({"round": r, "train_loss": 1.0 / r, "global_test_accuracy": r / total, "epsilon": 0.1 * r})
    bar.on_run_end({})


def test_off_a_terminal_the_bar_is_evenly_spaced_plain_lines():
    stream = io.StringIO()
    drive(ProgressBar("fedavg/digits", lines=10, stream=stream), 30)
    lines = stream.getvalue().splitlines()
    assert [line.split()[2] for line in lines] == [f"{r}/30" for r in range(3, 31, 3)]
    assert lines[-1] == "fedavg/digits: round 30/30  acc 1  eps 3  loss 0.03333"


def test_one_line_per_run_and_fewer_rounds_than_lines():
    stream = io.StringIO()
    drive(ProgressBar("[1/9] eps=1", lines=1, stream=stream), 7)
    assert stream.getvalue().splitlines() == ["[1/9] eps=1: round 7/7  acc 1  eps 0.7  loss 0.1429"]
    stream = io.StringIO()
    drive(ProgressBar("r", lines=10, stream=stream), 3)
    assert [line.split()[2] for line in stream.getvalue().splitlines()] == ["1/3", "2/3", "3/3"]


def test_on_a_terminal_it_is_a_tqdm_bar():
    stream = io.StringIO()
    drive(ProgressBar("fedavg/digits", stream=stream, interactive=True), 5)
    text = stream.getvalue()
    assert "\r" in text and "5/5" in text and "acc=1" in text


def test_progress_false_prints_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(simulation_module, "write_report", lambda path: [])
    run(tiny_config(federation={"rounds": 2}), tmp_path / "r", progress=False)
    out, err = capsys.readouterr()
    assert out == "" and err == ""
    run(tiny_config(federation={"rounds": 2}), tmp_path / "r2")  # default: plain lines off a terminal
    assert capsys.readouterr().err.splitlines()[-1].startswith("fedavg/digits: round 2/2  acc ")
