"""``fedveil sweep`` and ``fedveil compare`` from the command line."""
from __future__ import annotations

import json

import pytest


TINY = ["model.name=linear", "data.num_clients=4", "federation.rounds=2", "federation.clients_per_round=2",
        "client.lr=0.1"]


pytestmark = pytest.mark.usefixtures("in_tmp_without_plots")


def one_line_error(code, err, fragment):
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("fedveil: error: ") and fragment in err, err


def test_sweep_then_compare(tmp_path, fedveil_cli):
    code, out, err = fedveil_cli("sweep", *TINY, "privacy.level=example", "privacy.epsilon=2,6", "seed=0,1",
                         "--out", "sw", "--quiet")
    assert code == 0, err
    lines = out.splitlines()
    assert [line.split(":")[0] for line in lines[:4]] == [
        "[1/4] epsilon=2 seed=0", "[2/4] epsilon=2 seed=1", "[3/4] epsilon=6 seed=0", "[4/4] epsilon=6 seed=1"]
    spent = [float(line.rsplit("epsilon ", 1)[1]) for line in lines[:4]]
    assert spent == pytest.approx([2, 2, 6, 6], abs=0.01)  # calibrated to spend at most the target
    assert lines[-1] == "4 runs in sw; compare them with: fedveil compare sw"

    code, out, err = fedveil_cli("compare", "sw")
    assert code == 0, err
    table = out.splitlines()
    assert table[0].split()[:2] == ["epsilon", "n"]
    assert [t.split()[:2] for t in table[1:3]] == [["2.0", "2"], ["6.0", "2"]]
    summaries = {eps: [json.loads((tmp_path / "sw" / "runs" / f"{i}_epsilon={eps}_seed={s}" / "summary.json").read_text())
                       for i, s in ((0 if eps == 2 else 2, 0), (1 if eps == 2 else 3, 1))] for eps in (2, 6)}
    mean2 = sum(s["global_test_accuracy"] for s in summaries[2]) / 2
    assert table[1].split()[2] == f"{mean2:.4f}"
    for name in ("compare.md", "compare.json", "compare_curves.png", "compare_epsilon.png"):
        assert (tmp_path / "sw" / name).is_file()
        assert str(tmp_path.joinpath("sw", name).relative_to(tmp_path)) in out


def test_resume_continues_and_a_rerun_without_it_is_refused(tmp_path, fedveil_cli):
    assert fedveil_cli("sweep", *TINY, "seed=0,1", "--out", "sw", "--quiet")[0] == 0
    code, _, err = fedveil_cli("sweep", *TINY, "seed=0,1", "--out", "sw", "--quiet")
    one_line_error(code, err, "already holds a sweep: pass --resume")
    code, out, err = fedveil_cli("sweep", "--resume", "--out", "sw", "--quiet")
    assert code == 0, err
    assert out.splitlines()[:2] == ["[1/2] seed=0: finished earlier, kept", "[2/2] seed=1: finished earlier, kept"]
    code, _, err = fedveil_cli("sweep", *TINY, "seed=0,1,2", "--resume", "--out", "sw", "--quiet")
    one_line_error(code, err, "differ from its sweep.json")


@pytest.mark.parametrize(("argv", "fragment"), [
    (["sweep", "seed=0,1", "--resume"], "--resume needs --out"),
    (["sweep", "seed=1", "--out", "x"], "nothing to sweep"),
    (["sweep", *TINY, "client.lr=0.1,-2", "--out", "x"], "sweep run lr=-2: client.lr"),
    (["sweep", "federation.roundz=1,2", "--out", "x"], "did you mean 'federation.rounds'"),
    (["sweep", "seed=0,1", "--resume", "--out", "x"], "holds no sweep to resume"),
    (["compare", "nowhere"], "'nowhere' is neither a run directory"),
])
def test_errors_are_one_line_and_write_nothing(tmp_path, argv, fragment, fedveil_cli):
    code, _, err = fedveil_cli(*argv)
    one_line_error(code, err, fragment)
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_table_in_a_config_file(tmp_path, fedveil_cli):
    (tmp_path / "grid.toml").write_text(
        '[model]\nname = "linear"\n[data]\nnum_clients = 4\n[federation]\nrounds = 1\nclients_per_round = 2\n'
        "[sweep]\nclient.lr = [0.05, 0.1]\nseed = [3, 4]\n"
    )
    code, out, err = fedveil_cli("sweep", "grid.toml", "--zip", "--out", "sw", "--quiet")
    assert code == 0, err
    assert [line.split(":")[0] for line in out.splitlines()[:2]] == ["[1/2] lr=0.05 seed=3", "[2/2] lr=0.1 seed=4"]
    assert json.loads((tmp_path / "sw" / "runs" / "1_lr=0.1_seed=4" / "config.json").read_text())["seed"] == 4


def test_compare_of_run_directories_writes_into_compare(tmp_path, fedveil_cli):
    for lr in ("0.05", "0.2"):
        assert fedveil_cli("run", *TINY, f"client.lr={lr}", "--out", f"lr{lr}", "--quiet")[0] == 0
    code, out, err = fedveil_cli("compare", "lr0.05", "lr0.2")
    assert code == 0, err
    assert out.splitlines()[0].split()[:2] == ["lr", "n"]
    assert (tmp_path / "compare" / "compare_curves.png").is_file()
    assert not (tmp_path / "compare" / "compare_epsilon.png").exists()
