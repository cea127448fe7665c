"""The ``fedveil`` command line, called in-process through ``fedveil.cli.main.main``."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import fedveil.runtime.simulation as simulation
from fedveil.algorithms import ALGORITHMS
from fedveil.cli.main import main
from fedveil.data import DATASETS

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = [
    "model.name=linear",
    "data.num_clients=4",
    "federation.rounds=2",
    "federation.clients_per_round=2",
    "client.lr=0.1",
]


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    """Run every command from an empty folder (a default --out lands there)."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def skip_plots(monkeypatch):
    monkeypatch.setattr(simulation, "write_report", lambda path: [])


def cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_user_error(code, err, *fragments):
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("fedveil: error: ")
    for fragment in fragments:
        assert fragment in lines[0]


def metrics(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


# --------------------------------------------------------------------------- run


def test_run_end_to_end_writes_the_run_directory(tmp_path, capsys):
    code, out, err = cli(capsys, "run", "--algorithm", "fedavg", "--dataset", "digits", *TINY, "--out", "r", "--quiet")
    assert code == 0, err
    assert err == ""  # --quiet: no progress bar
    run_dir = tmp_path / "r"
    config = json.loads((run_dir / "config.json").read_text())
    assert config["algorithm"]["name"] == "fedavg" and config["data"]["name"] == "digits"
    assert config["model"]["name"] == "linear"
    assert config["data"]["num_clients"] == 4 and config["federation"]["rounds"] == 2
    rows = metrics(run_dir)
    assert [r["round"] for r in rows] == [1, 2]
    assert all(r["cohort_size"] == 2 for r in rows)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["rounds_completed"] == 2 and summary["num_clients"] == 4
    assert summary["global_test_accuracy"] == rows[-1]["global_test_accuracy"]
    for png in ("learning_curves.png", "client_scores.png", "label_distribution.png"):
        assert (run_dir / png).read_bytes()[:8] == PNG_MAGIC
    assert f"global model, pooled test accuracy       {summary['global_test_accuracy']:.4f}" in out
    assert "run directory: r " in out


def test_run_from_a_toml_file_with_an_override(tmp_path, capsys, skip_plots):
    toml = tmp_path / "tiny.toml"
    toml.write_text(
        """
seed = 3

[data]
name = "digits"
num_clients = 3

[data.partition]
name = "dirichlet"
alpha = 0.5

[model]
name = "linear"

[algorithm]
name = "fedprox"
mu = 0.01

[federation]
rounds = 2
clients_per_round = 2
"""
    )
    code, _, err = cli(capsys, "run", str(toml), "rounds=3", "--out", "r", "--quiet")
    assert code == 0, err
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["seed"] == 3
    assert config["data"]["partition"] == {"name": "dirichlet", "alpha": 0.5, "min_size": 10, "max_retries": 100}
    assert config["algorithm"] == {"name": "fedprox", "mu": 0.01, "weighting": "samples", "server_lr": 1.0,
                                   "adversarial": None, "buffers": "average"}  # defaults filled in
    assert config["federation"]["rounds"] == 3  # the override wins over the file
    assert [r["round"] for r in metrics(tmp_path / "r")] == [1, 2, 3]


def test_run_without_out_uses_runs_dataset_algorithm_time(tmp_path, capsys, skip_plots):
    code, out, err = cli(capsys, "run", "--algorithm", "fedavg", *TINY, "federation.rounds=1", "--quiet")
    assert code == 0, err
    made = list((tmp_path / "runs").iterdir())
    assert len(made) == 1 and made[0].name.startswith("digits-fedavg-")
    assert (made[0] / "summary.json").exists()


def test_bare_keys_may_fix_a_config_that_dotted_keys_made_invalid(tmp_path, capsys, skip_plots):
    """data.num_clients=3 alone clashes with the default 10 clients per round; the bare
    clients_per_round=2 given next to it resolves that, so the command must run."""
    code, _, err = cli(
        capsys, "run", "--dataset", "digits", "model.name=linear", "federation.rounds=1",
        "data.num_clients=3", "clients_per_round=2", "--out", "r", "--quiet",
    )
    assert code == 0, err
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert (config["data"]["num_clients"], config["federation"]["clients_per_round"]) == (3, 2)
    code, _, err = cli(
        capsys, "run", "data.partition.name=dirichlet", "data.num_clients=3", "clients_per_round=2", "alpha=0.3",
        "bogus=1", "--out", "r2", "--quiet",
    )
    assert_user_error(code, err, "unknown setting 'bogus'")


# ------------------------------------------------------------------- user errors


def nothing_written(tmp_path, *allowed):
    return sorted(p.name for p in tmp_path.iterdir()) == sorted(allowed)


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        (["data.partition.name=dirichlet", "data.partition.alpha=-1"], ["data.partition", "alpha", "greater than 0"]),
        (["data.partition.alpha=-1"], ["data.partition", "alpha"]),  # iid takes no alpha
        (["federation.rounds=0"], ["federation.rounds"]),
        (["client.lr=-0.1"], ["client.lr"]),
        (["federation.clients_per_round=20"], ["clients_per_round", "num_clients"]),
        (["federation.sampling=sometimes"], ["federation.sampling"]),
    ],
)
def test_bad_value_exits_2_with_one_line_and_no_run_dir(tmp_path, capsys, overrides, fragments):
    code, out, err = cli(capsys, "run", "--dataset", "digits", *overrides, "--out", "r", "--quiet")
    assert_user_error(code, err, *fragments)
    assert out == ""
    assert nothing_written(tmp_path)


def test_unknown_keys_are_named(tmp_path, capsys):
    code, _, err = cli(capsys, "run", "bogus_setting=1", "--out", "r", "--quiet")
    assert_user_error(code, err, "'bogus_setting'")
    code, _, err = cli(capsys, "run", "client.bogus_setting=1", "--out", "r", "--quiet")
    assert_user_error(code, err, "client.bogus_setting")
    code, _, err = cli(capsys, "run", "--algorithm", "scaffold", "algorithm.mu=0.1", "--out", "r", "--quiet")
    assert_user_error(code, err, "algorithm", "mu")
    assert nothing_written(tmp_path)


def test_unknown_names_list_the_choices(tmp_path, capsys):
    code, _, err = cli(capsys, "run", "--algorithm", "fedavgg", "--out", "r", "--quiet")
    assert_user_error(code, err, "fedavgg", "did you mean 'fedavg'", "scaffold")
    code, _, err = cli(capsys, "run", "--dataset", "mnistt", "--out", "r", "--quiet")
    assert_user_error(code, err, "mnistt", "mnist")
    assert nothing_written(tmp_path)


def test_unknown_loader_option_is_a_user_error(tmp_path, capsys):
    code, _, err = cli(capsys, "run", "--dataset", "digits", "data.options.bogus=1", "--out", "r", "--quiet")
    assert_user_error(code, err, "'bogus'", "accepted: none")
    assert nothing_written(tmp_path)


def test_missing_mnist_without_download_exits_2_and_writes_nothing(tmp_path, capsys):
    missing = tmp_path / "no-mnist"
    code, out, err = cli(
        capsys, "run", "--dataset", "mnist", "data.download=false", f"data.root={json.dumps(str(missing))}",
        "--out", "r", "--quiet",
    )
    assert_user_error(code, err, "mnist", str(missing), "train-images-idx3-ubyte")
    assert not (tmp_path / "r").exists() and not (tmp_path / "runs").exists()


def test_missing_or_broken_config_files(tmp_path, capsys):
    code, _, err = cli(capsys, "run", "nope.toml", "--out", "r", "--quiet")
    assert_user_error(code, err, "nope.toml", "does not exist")
    (tmp_path / "bad.toml").write_text("[data\nname = 1\n")
    code, _, err = cli(capsys, "run", "bad.toml", "--out", "r", "--quiet")
    assert_user_error(code, err, "bad.toml", "not valid TOML")
    code, _, err = cli(capsys, "run", "a.toml", "b.toml", "--out", "r", "--quiet")
    assert_user_error(code, err, "a.toml, b.toml")
    assert nothing_written(tmp_path, "bad.toml")


def test_argparse_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["no-such-command"])
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit) as exit_info:
        main([])
    assert exit_info.value.code == 2


# ------------------------------------------------------------------------ resume


def test_existing_run_dir_is_not_overwritten(tmp_path, capsys, skip_plots):
    assert cli(capsys, "run", *TINY, "--out", "r", "--quiet")[0] == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "r").iterdir()}
    code, _, err = cli(capsys, "run", *TINY, "--out", "r", "--quiet")
    assert_user_error(code, err, "'r'", "--resume")
    assert {p.name: p.read_bytes() for p in (tmp_path / "r").iterdir()} == before


def test_resume_of_a_finished_run_keeps_its_results(tmp_path, capsys, skip_plots):
    assert cli(capsys, "run", *TINY, "--out", "r", "--quiet")[0] == 0
    rows = metrics(tmp_path / "r")
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    code, out, err = cli(capsys, "run", "--resume", "--out", "r", "--quiet")
    assert code == 0, err
    assert metrics(tmp_path / "r") == rows  # no round was trained again
    assert json.loads((tmp_path / "r" / "summary.json").read_text()) == summary
    assert "2 rounds" in out


def test_resume_with_a_changed_setting_names_it(tmp_path, capsys, skip_plots):
    assert cli(capsys, "run", *TINY, "--out", "r", "--quiet")[0] == 0
    rows = metrics(tmp_path / "r")
    code, _, err = cli(capsys, "run", "--resume", "--out", "r", "federation.rounds=4", "client.lr=0.5", "--quiet")
    assert_user_error(code, err, "client.lr, federation.rounds")
    assert metrics(tmp_path / "r") == rows


def test_resume_with_a_foreign_checkpoint_is_a_user_error(tmp_path, capsys, skip_plots):
    assert cli(capsys, "run", *TINY, "--out", "mine", "--quiet")[0] == 0
    assert cli(capsys, "run", *TINY, "seed=5", "--out", "theirs", "--quiet")[0] == 0
    shutil.copy(tmp_path / "theirs" / "checkpoint.pt", tmp_path / "mine" / "checkpoint.pt")
    code, _, err = cli(capsys, "run", "--resume", "--out", "mine", "--quiet")
    assert_user_error(code, err, "another config")


def test_ctrl_c_exits_130_and_resume_finishes_like_an_uninterrupted_run(tmp_path, capsys, monkeypatch, skip_plots):
    from fedveil.runtime import ProgressBar

    args = [*TINY, "federation.rounds=3", "checkpoint.every=1"]
    assert cli(capsys, "run", *args, "--out", "full", "--quiet")[0] == 0

    def interrupt(self, row):
        if row["round"] == 2:
            raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(ProgressBar, "on_round_end", interrupt)
        code, _, err = cli(capsys, "run", *args, "--out", "cut")  # with the progress bar
    assert code == 130
    # the message is a line of its own (a bar's line is ended first; off a terminal there is no bar)
    assert err.splitlines()[-1] == "fedveil: interrupted; resume with --resume (the last checkpoint is kept)"
    assert err.endswith("\n")
    assert [r["round"] for r in metrics(tmp_path / "cut")] == [1, 2]

    code, _, err = cli(capsys, "run", "--resume", "--out", "cut", "--quiet")
    assert code == 0, err
    strip = lambda rows: [{k: v for k, v in r.items() if k != "elapsed_s"} for r in rows]  # noqa: E731
    assert strip(metrics(tmp_path / "cut")) == strip(metrics(tmp_path / "full"))
    final = {n: torch.load(tmp_path / n / "checkpoint.pt", weights_only=True)["server"]["params"] for n in ("cut", "full")}
    assert final["cut"].keys() == final["full"].keys()
    assert all(torch.equal(final["cut"][k], final["full"][k]) for k in final["full"])


def test_resume_needs_out(capsys):
    code, _, err = cli(capsys, "run", "--resume", "--quiet")
    assert_user_error(code, err, "--resume needs --out")


def test_resume_of_a_folder_without_a_run_is_refused_and_writes_nothing(tmp_path, capsys):
    code, _, err = cli(capsys, "run", *TINY, "--resume", "--out", "new", "--quiet")
    assert_user_error(code, err, "--resume: 'new' holds no run to resume")
    assert not (tmp_path / "new").exists()


def test_out_on_an_existing_file_is_one_line_before_any_work(tmp_path, capsys):
    (tmp_path / "taken").write_text("not a folder")
    code, _, err = cli(capsys, "run", *TINY, "--out", "taken", "--quiet")
    assert_user_error(code, err, "--out 'taken' is a file")
    assert (tmp_path / "taken").read_text() == "not a folder"


def test_version(capsys):
    import fedveil

    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"fedveil {fedveil.__version__}"


# ------------------------------------------------------------- listing commands


def first_tokens(out):
    return [line.split()[0] for line in out.splitlines()]


def test_algorithms_lists_one_name_per_line(capsys):
    code, out, _ = cli(capsys, "algorithms")
    assert code == 0
    names = first_tokens(out)
    assert names == ALGORITHMS.names()
    assert {"fedavg", "fedprox", "scaffold", "fedavg_ft", "local", "fednova"} <= set(names)


def test_datasets_lists_one_name_per_line(capsys):
    code, out, _ = cli(capsys, "datasets")
    assert code == 0
    names = first_tokens(out)
    assert names == DATASETS.names()
    assert {"digits", "mnist", "school", "synthetic_fedprox"} <= set(names)
    digits_line = next(line for line in out.splitlines() if line.split()[0] == "digits")
    assert "no download" in digits_line


@pytest.mark.parametrize("command, expected", [("models", {"linear", "mlp", "lenet"}), ("partitions", {"iid", "dirichlet"})])
def test_other_listings(capsys, command, expected):
    code, out, _ = cli(capsys, command)
    assert code == 0 and expected <= set(first_tokens(out))


def test_reproduce_list(capsys):
    code, out, _ = cli(capsys, "reproduce", "--list")
    assert code == 0
    assert "fedavg_mnist" in first_tokens(out)
    assert cli(capsys, "reproduce")[1] == out  # no name: the same list


def test_reproduce_unknown_experiment(capsys, tmp_path):
    code, _, err = cli(capsys, "reproduce", "no_such_paper", "--out", "x")
    assert_user_error(code, err, "no_such_paper", "fedavg_mnist")
    assert not (tmp_path / "x").exists()


# ------------------------------------------------------------------------ report


def test_report_regenerates_the_plots(tmp_path, capsys, skip_plots):
    assert cli(capsys, "run", *TINY, "--out", "r", "--quiet")[0] == 0
    run_dir = tmp_path / "r"
    assert not (run_dir / "learning_curves.png").exists()  # skipped during the run
    code, out, err = cli(capsys, "report", "r")
    assert code == 0, err
    expected = ["learning_curves.png", "client_scores.png", "label_distribution.png"]
    lines = out.splitlines()
    assert lines[0] == "fedavg on digits: 2/2 rounds"  # the metrics table, then the files
    assert lines[1].split()[:3] == ["round", "train_loss", "global_test_accuracy"]
    assert [line.split()[0] for line in lines[2:4]] == ["1", "2"]
    assert lines[-3:] == [str(Path("r") / name) for name in expected]
    for name in expected:
        assert (run_dir / name).read_bytes()[:8] == PNG_MAGIC


def test_report_of_a_run_without_a_finished_round(tmp_path, capsys):
    from fedveil.runtime.run_dir import RunDirectory

    RunDirectory.create(tmp_path / "started", {"algorithm": {"name": "fedavg"}, "data": {"name": "digits"}})
    code, _, err = cli(capsys, "report", "started")
    assert_user_error(code, err, "no finished round")
    assert sorted(p.name for p in (tmp_path / "started").iterdir()) == ["config.json"]


def test_report_of_a_folder_without_a_run(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code, _, err = cli(capsys, "report", "empty")
    assert_user_error(code, err, "'empty'", "not a fedveil run directory")
    code, _, err = cli(capsys, "report", "missing")
    assert_user_error(code, err, "'missing'")


def test_an_unreadable_checkpoint_is_one_line(tmp_path, capsys, skip_plots):
    code, _, err = cli(capsys, "run", *TINY, "--out", "run", "--quiet")
    assert code == 0, err
    (tmp_path / "run" / "checkpoint.pt").write_bytes(b"\x00 not a checkpoint\n")
    code, _, err = cli(capsys, "run", "--resume", "--out", "run", "--quiet")
    assert_user_error(code, err, "checkpoint", "cannot be read: it is damaged or not a fedveil checkpoint")


def test_help_and_version_import_neither_torch_nor_the_data_sets():
    """What made `fedveil --help` take seconds: the CLI module pulled in torch and every loader."""
    import subprocess
    import sys

    probe = ("import sys\nfrom fedveil.cli.main import main\nfor argv in (['--help'], ['--version'], ['run', '--help']):\n"
             "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
             "print(sorted(m for m in ('torch', 'fedveil.data', 'sklearn', 'flwr') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize("override, hint", [
    ("federation.roundz=3", "federation.roundz: Extra inputs are not permitted (got 3) (did you mean 'federation.rounds'?)"),
    ("data.partition.name=dirichlet data.partition.alpah=0.1", "(did you mean 'alpha'?)"),
    ("data.partition.alpah=0.1", "data.partition: alpah: Extra inputs are not permitted (got 0.1); it takes no parameters"),
    ("federation.epsilon=3", "(did you mean 'privacy.epsilon'?)"),  # the right name in another section
    ("algorithm.muu=0.1", "algorithm: muu: Extra inputs are not permitted (got 0.1); accepted: weighting, server_lr"),
    ("roundz=3", "unknown setting 'roundz' (did you mean 'federation.rounds'?)"),
])
def test_a_typo_gets_a_did_you_mean_from_the_real_names(capsys, override, hint):
    code, _, err = cli(capsys, "run", *TINY, *override.split(), "--quiet")
    assert_user_error(code, err, hint)


def test_a_misspelt_section_gets_the_real_one(tmp_path, capsys):
    (tmp_path / "typo.toml").write_text('[dataa]\nname = "digits"\n')
    code, _, err = cli(capsys, "run", "typo.toml", "--quiet")
    assert_user_error(code, err, "dataa: Extra inputs are not permitted (did you mean 'data'?)")


def test_overrides_may_follow_the_options(tmp_path, capsys, skip_plots):
    code, _, err = cli(capsys, "run", "--out", "r", *TINY[:-1], "--quiet", "client.lr=0.2")
    assert code == 0, err
    assert json.loads((tmp_path / "r" / "config.json").read_text())["client"]["lr"] == 0.2
    with pytest.raises(SystemExit):
        main(["run", "--out", "r2", "--no-such-flag"])
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err
