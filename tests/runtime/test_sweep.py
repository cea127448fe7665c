"""Sweeps: planning a grid from the command line and a [sweep] table, running it into one
folder, and resuming a killed sweep to the numbers of an uninterrupted one."""
from __future__ import annotations

import json

import pytest

from fedveil.config import parse_value
from fedveil.errors import ConfigError
from fedveil.runtime import ProgressBar
from fedveil.runtime import simulation as simulation_module
from fedveil.runtime.run_dir import RunDirError, read_metrics
from fedveil.runtime.sweep import SWEEP_FILE, open_sweep, run_sweep
from fedveil.runtime.sweep_plan import plan_sweep, split_values, toml_literal

TINY = ["model.name=linear", "data.num_clients=4", "federation.rounds=3", "federation.clients_per_round=2",
        "checkpoint.every=1"]


@pytest.fixture(autouse=True)
def no_plots(monkeypatch):
    monkeypatch.setattr(simulation_module, "write_report", lambda path: [])


# ----------------------------------------------------------------------- planning


@pytest.mark.parametrize(("text", "values"), [
    ("1,4,8", ["1", "4", "8"]),
    ("1", ["1"]),
    ("[32],[64, 64]", ["[32]", "[64, 64]"]),
    ('"a,b",c', ['"a,b"', "c"]),
    ("{ width = 0.5, bases = 2 },{ width = 1 }", ["{ width = 0.5, bases = 2 }", "{ width = 1 }"]),
])
def test_values_split_on_top_level_commas_only(text, values):
    assert split_values(text) == values


def test_an_empty_value_is_refused():
    with pytest.raises(ConfigError, match="empty entry"):
        split_values("1,,2")


@pytest.mark.parametrize("value", [1, 1.5, 1e-5, -3, True, False, "dirichlet", 'say "hi"', [64, 64], float("inf"),
                                   {"width": 0.5, "bases": 2}])
def test_toml_literal_parses_back_to_the_value(value):
    assert parse_value(toml_literal(value)) == value


def test_a_grid_varies_the_last_axis_fastest_and_names_each_run():
    plan = plan_sweep(None, [*TINY, "privacy.epsilon=1,8", "seed=0,1,2"])
    points = plan.points()
    assert [p.label for p in points] == [f"epsilon={e} seed={s}" for e in (1, 8) for s in (0, 1, 2)]
    assert [p.name for p in points][:2] == ["0_epsilon=1_seed=0", "1_epsilon=1_seed=1"]
    assert points[4].overrides == (*TINY, "privacy.epsilon=8", "seed=1")
    configs = plan.configs()
    assert [(c.privacy.epsilon, c.seed) for c in configs] == [(e, s) for e in (1.0, 8.0) for s in (0, 1, 2)]
    assert all(c.federation.rounds == 3 for c in configs)


def test_zip_pairs_values_and_needs_axes_of_one_length():
    plan = plan_sweep(None, ["client.lr=0.1,0.2", "seed=5,6"], mode="zip")
    assert [(c.client.lr, c.seed) for c in plan.configs()] == [(0.1, 5), (0.2, 6)]
    with pytest.raises(ConfigError, match="one length: client.lr has 2, seed has 3"):
        plan_sweep(None, ["client.lr=0.1,0.2", "seed=5,6,7"], mode="zip")


def test_keys_sharing_a_last_name_are_named_in_full():
    plan = plan_sweep(None, ["data.partition.name=dirichlet", "data.partition.alpha=0.1,1", "algorithm.name=fedavg,local"])
    assert plan.points()[0].label == "alpha=0.1 name=fedavg"
    plan = plan_sweep(None, ["data.name=digits,mnist", "algorithm.name=fedavg,local"])
    assert plan.points()[0].label == "data.name=digits algorithm.name=fedavg"


def test_a_sweep_table_in_the_config_file(tmp_path):
    path = tmp_path / "sweep.toml"
    path.write_text(
        'seed = 3\n[federation]\nrounds = 2\n[sweep]\nmode = "grid"\nseed = [0, 1]\n'
        '[sweep.privacy]\nlevel = ["example"]\nepsilon = [1.0, 4.5]\n'
        '[sweep.model]\noptions.hidden = [[8], [16, 16]]\n'
    )
    plan = plan_sweep(path, ["model.name=mlp"])
    assert [a.key for a in plan.axes] == ["seed", "privacy.level", "privacy.epsilon", "model.options.hidden"]
    configs = plan.configs()
    assert len(configs) == 2 * 1 * 2 * 2
    assert {c.model.options["hidden"][0] for c in configs} == {8, 16}
    assert {c.privacy.epsilon for c in configs} == {1.0, 4.5}
    # a command-line axis replaces the table's axis of the same key
    plan = plan_sweep(path, ["seed=7,8,9"])
    assert [c.seed for c in plan.configs()][:3] == [7, 7, 7] and len(plan.configs()) == 3 * 2 * 2


@pytest.mark.parametrize(("items", "message"), [
    (["seed=1"], "nothing to sweep"),
    (["seed=1,1"], "repeats a value"),
    (["rounds"], "not of the form key=value"),
])
def test_plan_errors(items, message):
    with pytest.raises(ConfigError, match=message):
        plan_sweep(None, items)


def test_a_bad_value_in_one_run_names_that_run_before_anything_runs(tmp_path):
    plan = plan_sweep(None, [*TINY, "client.lr=0.1,-1"])
    with pytest.raises(ConfigError, match="sweep run lr=-1: client.lr"):
        open_sweep(plan, tmp_path / "sw", resume=False)
    assert not (tmp_path / "sw").exists()


def test_the_table_must_hold_lists(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[sweep]\nseed = 1\n")
    with pytest.raises(ConfigError, match=r"\[sweep\] seed must be a non-empty list"):
        plan_sweep(path, [])


# ------------------------------------------------------------------------ running


def rows_without_time(path):
    return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in read_metrics(path / "metrics.jsonl")]


def test_each_run_matches_a_plain_run_of_its_config(tmp_path):
    from fedveil.runtime import run

    plan = plan_sweep(None, [*TINY, "client.lr=0.05,0.2"])
    summaries = run_sweep(plan, tmp_path / "sw", progress=False, echo=lambda line: None)
    assert [s["rounds_completed"] for s in summaries] == [3, 3]
    for config, point in zip(plan.configs(), plan.points()):
        run(config, tmp_path / point.name, progress=False)
        swept = tmp_path / "sw" / "runs" / point.name
        assert rows_without_time(swept) == rows_without_time(tmp_path / point.name)
        assert json.loads((swept / "config.json").read_text()) == config.model_dump()
    assert summaries[0]["global_test_accuracy"] != summaries[1]["global_test_accuracy"]


def test_a_killed_sweep_resumes_to_the_numbers_of_an_uninterrupted_one(tmp_path, monkeypatch):
    items = [*TINY, "client.lr=0.05,0.2", "seed=0,1"]
    run_sweep(plan_sweep(None, items), tmp_path / "full", progress=False, echo=lambda line: None)

    calls = {"rounds": 0}
    real = ProgressBar.on_round_end

    def kill_in_the_third_run(self, row):  # runs 1-2 finish (3 rounds each), run 3 dies after its round 2
        calls["rounds"] += 1
        if calls["rounds"] == 3 + 3 + 2:
            raise KeyboardInterrupt
        real(self, row)

    with monkeypatch.context() as patch:
        patch.setattr(ProgressBar, "on_round_end", kill_in_the_third_run)
        with pytest.raises(KeyboardInterrupt):
            run_sweep(plan_sweep(None, items), tmp_path / "cut", progress=True)
    runs = sorted((tmp_path / "cut" / "runs").iterdir())
    assert [p.name for p in runs] == ["0_lr=0.05_seed=0", "1_lr=0.05_seed=1", "2_lr=0.2_seed=0"]
    assert [(p / "summary.json").exists() for p in runs] == [True, True, False]
    assert [r["round"] for r in read_metrics(runs[2] / "metrics.jsonl")] == [1, 2]
    kept = {p.name: (p / "summary.json").stat().st_mtime_ns for p in runs[:2]}

    lines: list[str] = []
    with pytest.raises(RunDirError, match="already holds a sweep: pass --resume"):
        run_sweep(plan_sweep(None, items), tmp_path / "cut", progress=False, echo=lines.append)
    run_sweep(None, tmp_path / "cut", resume=True, progress=False, echo=lines.append)  # the saved plan
    assert lines[:2] == ["[1/4] lr=0.05 seed=0: finished earlier, kept", "[2/4] lr=0.05 seed=1: finished earlier, kept"]
    assert lines[2].startswith("[3/4] lr=0.2 seed=0: 3 rounds, ")
    assert {p.name: (p / "summary.json").stat().st_mtime_ns for p in runs[:2]} == kept
    for name in sorted(p.name for p in (tmp_path / "full" / "runs").iterdir()):
        assert rows_without_time(tmp_path / "cut" / "runs" / name) == rows_without_time(tmp_path / "full" / "runs" / name)


def test_resume_refuses_another_plan_and_a_folder_without_a_sweep(tmp_path):
    plan = plan_sweep(None, [*TINY, "seed=0,1"])
    open_sweep(plan, tmp_path / "sw", resume=False)
    assert json.loads((tmp_path / "sw" / SWEEP_FILE).read_text())["axes"] == [["seed", ["0", "1"]]]
    with pytest.raises(RunDirError, match="the config or the axes differ"):
        open_sweep(plan_sweep(None, [*TINY, "seed=0,1,2"]), tmp_path / "sw", resume=True)
    with pytest.raises(RunDirError, match="holds no sweep to resume"):
        open_sweep(plan, tmp_path / "other", resume=True)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("x")
    with pytest.raises(RunDirError, match="is not empty"):
        open_sweep(plan, tmp_path / "busy", resume=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunDirError, match="is a file"):
        open_sweep(plan, tmp_path / "file", resume=False)


def test_progress_is_one_plain_line_per_run_off_a_terminal(tmp_path, capsys):
    run_sweep(plan_sweep(None, [*TINY, "seed=0,1"]), tmp_path / "sw", progress=True)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert err[0].startswith("[1/2] seed=0: round 3/3  acc ")
    assert err[1].startswith("[2/2] seed=1: round 3/3  acc ")


def test_a_ray_sweep_gives_the_sequential_numbers(tmp_path, monkeypatch):
    """Both sides single-threaded: torch's float reductions depend on the thread count, and
    Ray workers keep a user's OMP_NUM_THREADS (e.g. 2) where an unset one becomes 1."""
    import ray
    import torch

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    threads = torch.get_num_threads()
    items = [*TINY, "seed=0,1"]
    lines: list[str] = []
    try:
        torch.set_num_threads(1)
        run_sweep(plan_sweep(None, items), tmp_path / "seq", progress=False, echo=lambda line: None)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        run_sweep(plan_sweep(None, items), tmp_path / "ray", progress=False, use_ray=True, echo=lines.append)
    finally:
        ray.shutdown()
        torch.set_num_threads(threads)
    assert sorted(line.split(":")[0] for line in lines) == ["[1/2] seed=0", "[2/2] seed=1"]
    for name in ("0_seed=0", "1_seed=1"):
        assert rows_without_time(tmp_path / "ray" / "runs" / name) == rows_without_time(tmp_path / "seq" / "runs" / name)


def test_a_ray_sweep_refuses_runs_that_use_the_ray_executor(tmp_path):
    plan = plan_sweep(None, [*TINY, "executor=ray", "seed=0,1"])
    with pytest.raises(RunDirError, match="executor must be serial or vectorized"):
        run_sweep(plan, tmp_path / "sw", use_ray=True, progress=False)


def test_data_paths_in_the_config_file_are_read_from_its_folder(tmp_path):
    (tmp_path / "cfg").mkdir()
    path = tmp_path / "cfg" / "grid.toml"
    path.write_text('[data]\nroot = "../data/digits"\n[sweep]\nseed = [0, 1]\n')
    plan = plan_sweep(path, [])
    assert plan.base["data"]["root"] == str(tmp_path / "data" / "digits")
