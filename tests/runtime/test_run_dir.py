"""RunDirectory: never overwrite a run, resume only the same config, crash-safe metrics."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from fedveil.runtime import Simulation, run
from fedveil.runtime.run_dir import (
    CONFIG_FILE,
    METRICS_FILE,
    RunDirectory,
    RunDirError,
    atomic_write,
    config_fingerprint,
    read_metrics,
)
from tiny_runs import rows_of, tiny_config, tiny_raw

CONFIG = {"seed": 0, "data": {"name": "digits", "num_clients": 4}, "federation": {"rounds": 3}}


# ------------------------------------------------------------------------- create


def test_create_writes_the_config_into_a_new_nested_directory(tmp_path):
    path = tmp_path / "a" / "b"
    run = RunDirectory.create(path, CONFIG)
    assert run.has_run
    assert json.loads((path / CONFIG_FILE).read_text()) == CONFIG
    assert sorted(p.name for p in path.iterdir()) == [CONFIG_FILE]


def test_create_accepts_an_existing_empty_directory(tmp_path):
    RunDirectory.create(tmp_path, CONFIG)
    assert json.loads((tmp_path / CONFIG_FILE).read_text()) == CONFIG


def test_create_refuses_a_non_empty_directory_and_leaves_it_alone(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(RunDirError, match="not an empty folder"):
        RunDirectory.create(tmp_path, CONFIG)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_create_refuses_an_existing_run_and_points_to_resume(tmp_path):
    RunDirectory.create(tmp_path, CONFIG)
    other = {**CONFIG, "seed": 1}
    with pytest.raises(RunDirError, match="--resume"):
        RunDirectory.create(tmp_path, other)
    assert json.loads((tmp_path / CONFIG_FILE).read_text()) == CONFIG  # not overwritten


def test_create_refuses_a_directory_holding_only_a_hidden_file(tmp_path):
    (tmp_path / ".keep").write_text("")
    with pytest.raises(RunDirError):
        RunDirectory.create(tmp_path, CONFIG)


# ------------------------------------------------------------------------ resume


def test_open_for_resume_same_config_returns_the_run(tmp_path):
    RunDirectory.create(tmp_path, CONFIG)
    reopened = RunDirectory.open_for_resume(tmp_path, json.loads(json.dumps(CONFIG)))
    assert reopened.path == tmp_path


def test_open_for_resume_without_a_run_creates_one(tmp_path):
    path = tmp_path / "fresh"
    RunDirectory.open_for_resume(path, CONFIG)
    assert json.loads((path / CONFIG_FILE).read_text()) == CONFIG


def test_open_for_resume_names_every_differing_key(tmp_path):
    RunDirectory.create(tmp_path, CONFIG)
    other = {
        "seed": 7,  # changed
        "data": {"name": "digits", "num_clients": 4, "val_fraction": 0.1},  # added nested key
        "federation": {"rounds": 5},  # changed nested key
    }
    with pytest.raises(RunDirError) as err:
        RunDirectory.open_for_resume(tmp_path, other)
    message = str(err.value)
    assert "data.val_fraction, federation.rounds, seed" in message
    assert "data.name" not in message and "data.num_clients" not in message


def test_open_for_resume_names_a_removed_key(tmp_path):
    RunDirectory.create(tmp_path, CONFIG)
    other = {"seed": 0, "data": {"name": "digits", "num_clients": 4}, "federation": {}}
    with pytest.raises(RunDirError, match=r"differs in federation\.rounds;"):
        RunDirectory.open_for_resume(tmp_path, other)


def test_key_order_does_not_change_the_fingerprint():
    reordered = {"federation": {"rounds": 3}, "data": {"num_clients": 4, "name": "digits"}, "seed": 0}
    assert config_fingerprint(reordered) == config_fingerprint(CONFIG)
    assert config_fingerprint({**CONFIG, "seed": 1}) != config_fingerprint(CONFIG)


def test_simulation_resume_with_another_config_is_refused_before_writing(tmp_path, skip_plots):
    out = tmp_path / "run"
    run(tiny_config(federation={"rounds": 2}), out, progress=False)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    changed = tiny_config(federation={"rounds": 3}, client={"lr": 0.2})
    with pytest.raises(RunDirError) as err:
        Simulation.from_config(changed).run(out, resume=True)
    assert "client.lr, federation.rounds" in str(err.value)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_a_checkpoint_of_another_config_is_refused(tmp_path, skip_plots):
    """config.json matches but checkpoint.pt came from another run (e.g. copied over)."""
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    config = tiny_config(federation={"rounds": 2})
    run(config, mine, progress=False)
    run(tiny_config(federation={"rounds": 2}, seed=1), theirs, progress=False)
    shutil.copy(theirs / "checkpoint.pt", mine / "checkpoint.pt")
    rows_before = (mine / METRICS_FILE).read_text()
    with pytest.raises(RunDirError, match="another config"):
        Simulation.from_config(config).run(mine, resume=True)
    assert (mine / METRICS_FILE).read_text() == rows_before


def test_a_damaged_checkpoint_is_reported(tmp_path, skip_plots):
    out = tmp_path / "run"
    config = tiny_config(federation={"rounds": 2})
    run(config, out, progress=False)
    (out / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(RunDirError, match="cannot be read"):
        Simulation.from_config(config).run(out, resume=True)


def test_two_writers_of_one_file_never_share_a_temporary_file(tmp_path):
    """Two processes re-scoring one finished run both rewrite its files: a second writer
    starting while the first is mid-write must not truncate or steal the first's file."""
    target = tmp_path / "model.pt"

    def first(handle):
        handle.write(b"first")
        atomic_write(target, lambda h: h.write(b"second"))  # the other writer, mid-write of the first

    atomic_write(target, first)
    assert target.read_bytes() == b"first"  # the last rename wins, whole
    assert not list(tmp_path.glob("*.tmp"))


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "summary.json"
    target.write_bytes(b"old")

    def failing(handle):
        handle.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, failing)
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_checkpoint_round_trip(tmp_path):
    run_dir = RunDirectory.create(tmp_path, CONFIG)
    assert run_dir.load_checkpoint() is None
    state = {"round": 4, "server": {"params": {"w": torch.arange(6.0).reshape(2, 3)}}, "clients": {3: {"c": torch.ones(2)}}}
    run_dir.save_checkpoint(state)
    loaded = run_dir.load_checkpoint()
    assert loaded["round"] == 4
    assert torch.equal(loaded["server"]["params"]["w"], torch.arange(6.0).reshape(2, 3))
    assert list(loaded["clients"]) == [3] and torch.equal(loaded["clients"][3]["c"], torch.ones(2))
    assert not list(tmp_path.glob("*.tmp"))


# ----------------------------------------------------------------------- metrics


def rows(*rounds):
    return [{"round": r, "train_loss": 1.0 / r, "cohort_size": r % 3, "note": f"r{r}"} for r in rounds]


def test_metrics_append_and_read_round_trip(tmp_path):
    run_dir = RunDirectory.create(tmp_path, CONFIG)
    assert run_dir.metrics() == []
    for row in rows(1, 2, 3):
        run_dir.append_metrics(row)
    assert run_dir.metrics() == rows(1, 2, 3)
    lines = (tmp_path / METRICS_FILE).read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[1]) == {"round": 2, "train_loss": 0.5, "cohort_size": 2, "note": "r2"}


def test_read_metrics_skips_a_torn_last_line(tmp_path):
    path = tmp_path / METRICS_FILE
    path.write_text("".join(json.dumps(r) + "\n" for r in rows(1, 2)) + '{"round": 3, "train_lo')
    assert read_metrics(path) == rows(1, 2)
    assert read_metrics(tmp_path / "missing.jsonl") == []


def test_keep_metrics_through_truncates_the_file(tmp_path):
    run_dir = RunDirectory.create(tmp_path, CONFIG)
    for row in rows(1, 2, 3, 4, 5):
        run_dir.append_metrics(row)
    assert run_dir.keep_metrics_through(2) == rows(1, 2)
    assert run_dir.metrics() == rows(1, 2)
    assert (tmp_path / METRICS_FILE).read_text() == "".join(json.dumps(r) + "\n" for r in rows(1, 2))
    run_dir.append_metrics(rows(3)[0])  # appending after a truncation continues the file
    assert run_dir.metrics() == rows(1, 2, 3)


def test_keep_metrics_through_zero_empties_and_drops_a_torn_line(tmp_path):
    run_dir = RunDirectory.create(tmp_path, CONFIG)
    for row in rows(1, 2):
        run_dir.append_metrics(row)
    with open(tmp_path / METRICS_FILE, "a") as handle:
        handle.write('{"round": 3')
    assert run_dir.keep_metrics_through(5) == rows(1, 2)
    assert (tmp_path / METRICS_FILE).read_text().endswith("}\n")  # the torn line is gone
    assert run_dir.keep_metrics_through(0) == []
    assert (tmp_path / METRICS_FILE).read_text() == ""


def test_keep_metrics_through_without_a_metrics_file(tmp_path):
    run_dir = RunDirectory.create(tmp_path, CONFIG)
    assert run_dir.keep_metrics_through(3) == []
    assert run_dir.metrics() == []


def test_metrics_rows_written_by_a_run_have_consecutive_rounds(tmp_path, skip_plots):
    run(tiny_config(federation={"rounds": 3}), tmp_path / "run", progress=False)
    assert [r["round"] for r in rows_of(tmp_path / "run")] == [1, 2, 3]
    assert json.loads((tmp_path / "run" / CONFIG_FILE).read_text()) == tiny_config(
        federation={"rounds": 3}
    ).model_dump(mode="json")
    assert tiny_raw()["federation"]["rounds"] == 6  # the helper's default was not mutated


def test_reporting_settings_do_not_block_a_resume(tmp_path):
    """[log] changes where a run is reported, not what it computes: a resume may turn tracking on."""
    from fedveil.runtime.run_dir import RunDirectory, config_fingerprint

    base = {"seed": 0, "federation": {"rounds": 3}, "log": {"tensorboard": False}}
    tracked = {**base, "log": {"tensorboard": True}}
    assert config_fingerprint(base) == config_fingerprint(tracked)
    assert config_fingerprint(base) != config_fingerprint({**base, "seed": 1})
    RunDirectory.create(tmp_path / "r", base)
    RunDirectory.open_for_resume(tmp_path / "r", tracked)
    with pytest.raises(RunDirError, match="differs in seed"):
        RunDirectory.open_for_resume(tmp_path / "r", {**tracked, "seed": 1})
