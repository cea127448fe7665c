"""Bad input found in a trial (issue 36, item 7): each stops with one clear line before any
work (exit status 2 from the command line, nothing written), or is skipped where it is harmless."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedveil.cli.main import main
from fedveil.pets import TrainConfig
from tests.cli.test_cli import in_tmp, skip_plots  # noqa: F401  (fixtures: an empty cwd, no PNGs)
from tests.test_examples import _tiny_adult

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def refused(code: int, err: str, *fragments: str) -> str:
    """The one error line, after checking exit status 2 and that it names ``fragments``."""
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedveil: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def tiny_adult(folder: Path) -> Path:
    """48 training and 12 test rows in the UCI Adult format (the examples test's files)."""
    _tiny_adult(folder)
    return folder


def fade_adult(tmp_path: Path, *overrides: str) -> list[str]:
    """``fedveil run`` arguments of the FADE Adult example (8 clients, data.test_fraction = 0), tiny."""
    root = tiny_adult(tmp_path / "adult")
    return ["run", str(EXAMPLES / "fade_adult.toml"), f"data.root={root}", "data.download=false",
            "federation.rounds=2", "eval.every=1", *overrides, "--out", "r", "--quiet"]


# 1. FADE client ids outside [0, num_clients)
@pytest.mark.parametrize("key, ids", [("unlabelled_clients", "[12]"), ("opt_out_clients", "[99]")])
def test_fade_refuses_client_ids_outside_the_federation(tmp_path, capsys, key, ids):
    code, _, err = cli(capsys, *fade_adult(tmp_path, f"algorithm.{key}={ids}"))
    line = refused(code, err, f"algorithm.{key}", "[0, 8)", ids)
    assert line == f"fedveil: error: algorithm.{key}: client ids must lie in [0, 8) for 8 clients, got {ids}"
    assert not (tmp_path / "r").exists()


# 2. a log-normal budget distribution with s <= 0 or scale <= 0
@pytest.mark.parametrize("value", ["[-1,0.4]", "[0.5,0]"])
def test_lognormal_budgets_are_refused_as_a_config_error(tmp_path, capsys, value):
    code, _, err = cli(capsys, "run", str(EXAMPLES / "split_mix_digits.toml"), f"algorithm.lognormal={value}",
                       "--out", "r", "--quiet")
    refused(code, err, "algorithm: lognormal:", "(s, scale) must both lie in (0, inf)")
    assert not (tmp_path / "r").exists()


# 3. fedveil evaluate --width that the Split-Mix model does not serve
def test_evaluate_refuses_a_width_the_model_does_not_serve(tmp_path, capsys, skip_plots):
    split_mix = ["--algorithm", "split_mix", "--dataset", "digits", "model.name=digit_cnn", "model.options.width=0.5",
                 "model.options.bases=4", "algorithm.budgets=[0.125,0.5]", "data.num_clients=2",
                 "federation.rounds=1", "federation.clients_per_round=2", "client.steps=1"]
    assert cli(capsys, "run", *split_mix, "--out", "r", "--quiet")[0] == 0
    code, out, err = cli(capsys, "evaluate", "r", "--width", "0.25", "--width", "0.3")
    refused(code, err, "split_mix: width 0.3 is not one the model serves; valid widths: 0.125, 0.25, 0.375, 0.5")
    assert out == ""  # refused before the first row
    code, out, err = cli(capsys, "evaluate", "r", "--width", "0.375")
    assert code == 0, err
    assert "x0.375" in out


# 4. FedFed phase 2 on another partition than phase 1
def test_fedfed_phase_two_refuses_a_phase_one_run_on_other_data(tmp_path, capsys, skip_plots):
    tiny = ["--dataset", "digits", "data.num_clients=4", "federation.rounds=1", "federation.clients_per_round=2",
            "client.steps=1"]
    assert cli(capsys, "run", "--algorithm", "fedfed_distill", *tiny, "model.name=fedfed_vae",
               "model.options.latent=4", "model.options.width=4", "--out", "phase1", "--quiet")[0] == 0
    phase2 = ["run", "--algorithm", "fedfed_fedavg", *tiny, "model.name=linear", "algorithm.distiller=phase1"]
    code, _, err = cli(capsys, *phase2, "data.partition.name=dirichlet", "seed=1", "--out", "other", "--quiet")
    refused(code, err, "algorithm.distiller: 'phase1' ran on other data than this run:",
            "data.partition.name 'iid' there, 'dirichlet' here", "seed 0 there, 1 here")
    assert not (tmp_path / "other").exists()
    assert cli(capsys, *phase2, "--out", "same", "--quiet")[0] == 0  # the same data runs


# 5. PETs TrainConfig with a value of the wrong type or range
@pytest.mark.parametrize("field, value, rule", [
    ("lr", "fast", "a number > 0"),
    ("batch_size", 2.5, "an integer >= 1"),
    ("clip", 0.0, "a number > 0"),
    ("alpha", 2, "None or a number in [0, 1] (focal loss)"),
])
def test_pets_train_config_names_the_bad_field(field, value, rule):
    with pytest.raises(ValueError, match=rf"^TrainConfig\.{field} must be {re.escape(rule)}, got "):
        TrainConfig(**{field: value})


# 6. FADE with data.test_fraction = 0: no empty per-client plot
def test_no_client_scores_plot_without_client_test_splits(tmp_path, capsys):
    code, _, err = cli(capsys, *fade_adult(tmp_path))
    assert code == 0, err
    written = {p.name for p in (tmp_path / "r").iterdir()}
    assert "learning_curves.png" in written and "client_scores.png" not in written
    code, out, _ = cli(capsys, "report", "r")
    assert code == 0 and "client_scores.png" not in out
