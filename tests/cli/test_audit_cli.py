"""``fedveil audit``: exit status 0 for an honest run, 3 when noise is forced off, 2 for user errors."""
from __future__ import annotations

import json

import pytest

from fedveil.cli.main import main

CONFIG = """
seed = 0
[data]
name = "digits"
num_clients = 5
[model]
name = "mlp"
options = { hidden = [16] }
[client]
batch_size = 32
lr = 0.5
[federation]
rounds = 2
clients_per_round = 5
[privacy]
level = "example"
epsilon = 1.0
"""
CLIENT_LEVEL = [
    "data.num_clients=20", "federation.rounds=5", "federation.sampling=poisson", "privacy.level=client", "client.batch_size=16",
]


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.toml").write_text(CONFIG)


def audit(capsys, *argv):
    """``fedveil audit run.toml [overrides] --quiet [options]`` (overrides come before options)."""
    overrides = [a for a in argv if "=" in a]
    code = main(["audit", "run.toml", *overrides, "--quiet", *[a for a in argv if "=" not in a]])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("level", ["example", "client"])
def test_honest_run_passes_and_noise_forced_off_exits_3(capsys, level):
    extra = CLIENT_LEVEL if level == "client" else ["--executor", "vectorized"]
    code, out, _ = audit(capsys, *extra, "--trials", "100", "--json", "honest.json")
    assert code == 0, out
    assert f"{level}-level audit" in out and "verdict                consistent" in out
    honest = json.loads(open("honest.json").read())
    assert honest["epsilon_lower_bound"] <= honest["accounted_epsilon"] == pytest.approx(1.0, rel=1e-3)
    assert honest["trials"] == 100 and honest["noise"] == "as planned" and not honest["violated"]

    code, out, _ = audit(capsys, *extra, "--trials", "100", "--no-noise", "--json", "broken.json")
    assert code == 3, out
    assert "FORCED OFF" in out and "VIOLATION: the run leaks more than accounted" in out
    broken = json.loads(open("broken.json").read())
    assert broken["epsilon_lower_bound"] > broken["accounted_epsilon"] and broken["violated"]


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["privacy.epsilon=-1"], "privacy.epsilon"),
        (["privacy.level=none"], "nothing to audit"),
        (["--trials", "3"], "--trials must be an even number"),
        (["--client", "9"], "--client must be in [0, 4]"),
        (["--rounds", "5"], "--rounds 5"),
    ],
)
def test_user_errors_exit_2_with_one_line(capsys, argv, fragment):
    code, out, err = audit(capsys, *argv)
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedveil: error: ") and fragment in lines[0], err
