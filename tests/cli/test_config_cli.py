"""``fedveil config show`` and the defaults a run's config.json holds."""
from __future__ import annotations

import json
import tomllib

import pytest

from fedveil.algorithms import ALGORITHMS
from fedveil.config import RunConfig, validate
from fedveil.data import PARTITIONERS
from fedveil.models import MODELS


pytestmark = pytest.mark.usefixtures("in_tmp_without_plots")


def param_names(out: str) -> list[str]:
    return [line.split()[0] for line in out.splitlines()[2:]]


def test_show_an_algorithm_lists_its_params_with_defaults(fedveil_cli):
    code, out, err = fedveil_cli("config", "show", "fedprox")
    assert code == 0, err
    assert out.startswith("fedprox: algorithm — FedProx")
    assert param_names(out) == list(ALGORITHMS.get("fedprox").Params.model_fields)
    mu = next(line for line in out.splitlines() if line.split()[0] == "mu")
    assert mu.split()[1:3] == ["float", "0.01"]


def test_show_a_partitioner_a_model_and_a_data_set(fedveil_cli):
    out = fedveil_cli("config", "show", "dirichlet")[1]
    assert param_names(out) == list(PARTITIONERS.get("dirichlet").Params.model_fields)
    out = fedveil_cli("config", "show", "mlp")[1]
    assert out.splitlines()[1].strip() == "set in [model] options = { ... }"
    assert param_names(out) == ["hidden"] and "(200, 200)" in out
    assert MODELS.get("mlp")  # the model the listing describes exists
    out = fedveil_cli("config", "show", "school")[1]
    assert param_names(out) == ["normalize_target", "scale_features", "standardize_features"]
    out = fedveil_cli("config", "show", "dynamic")[1]
    assert param_names(out) == ["gamma"]  # R and T are the run's


def test_an_unknown_name_is_one_line_with_the_nearest_names(fedveil_cli):
    code, _, err = fedveil_cli("config", "show", "fedprx")
    assert code == 2 and err.count("\n") == 1
    assert "no algorithm, partitioner, model, data set, noise schedule or job is called 'fedprx' (did you mean 'fedprox'" in err


def test_show_alone_prints_the_complete_default_config_as_toml(fedveil_cli):
    code, out, err = fedveil_cli("config", "show")
    assert code == 0, err
    assert validate(tomllib.loads(out)).model_dump() == RunConfig().model_dump()
    assert "[privacy.noise_schedule]" in out and "# epsilon = (unset)" in out


def test_config_json_holds_every_default_of_the_chosen_components(tmp_path, fedveil_cli):
    code, _, err = fedveil_cli("run", "model.name=linear", "data.num_clients=4", "federation.rounds=1",
                       "federation.clients_per_round=2", "algorithm.name=fedprox", "data.partition.name=dirichlet",
                       "--out", "r", "--quiet")
    assert code == 0, err
    saved = json.loads((tmp_path / "r" / "config.json").read_text())
    assert saved["algorithm"] == {"name": "fedprox", **ALGORITHMS.get("fedprox").Params().model_dump(mode="json")}
    assert saved["algorithm"]["mu"] == 0.01
    assert saved["data"]["partition"] == {"name": "dirichlet", "alpha": 0.5, "min_size": 10, "max_retries": 100}
    # and it is a config: the run resumes from it, and it validates to itself
    assert validate(saved).model_dump(mode="json") == saved
    assert fedveil_cli("run", "--resume", "--out", "r", "--quiet")[0] == 0


def test_data_paths_in_a_config_file_are_read_from_its_folder(tmp_path, monkeypatch):
    from fedveil.config import load_config

    (tmp_path / "project" / "configs").mkdir(parents=True)
    path = tmp_path / "project" / "configs" / "run.toml"
    path.write_text('[data]\nname = "rotated_digits"\nroot = "../data/mnist"\noptions = { base_root = "mnist" }\n')
    monkeypatch.chdir(tmp_path)
    config = load_config(str(path.relative_to(tmp_path)))
    assert config.data.root == str(tmp_path / "project" / "data" / "mnist")
    assert config.data.options["base_root"] == str(tmp_path / "project" / "configs" / "mnist")
    # on the command line, a path is the shell's: relative to the working directory
    assert load_config(str(path), ["data.root=here"]).data.root == "here"
    monkeypatch.setenv("FEDVEIL_DATA", str(tmp_path / "store"))
    path.write_text('[data]\nroot = "$FEDVEIL_DATA/mnist-10k"\n')
    assert load_config(str(path)).data.root == str(tmp_path / "store" / "mnist-10k")
    path.write_text('[data]\nroot = "~/mnist"\n')
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert load_config(str(path)).data.root == str(tmp_path / "home" / "mnist")


def test_config_show_ecos_prints_the_default_job_as_a_loadable_toml(tmp_path, capsys):
    """``fedveil config show ecos`` covers the ECOS job (issue 36, item 6): its TOML loads back
    to the defaults."""
    from fedveil.cli.main import main
    from fedveil.runtime.ecos_config import ECOSJobConfig, load_ecos_config

    assert main(["config", "show", "ecos"]) == 0
    text = capsys.readouterr().out
    assert "[ecos]" in text and "secure_rng = false" in text
    path = tmp_path / "job.toml"
    path.write_text(text)
    assert load_ecos_config(path).to_dict() == ECOSJobConfig().to_dict()


def test_every_model_option_has_a_one_line_meaning():
    """``fedveil config show MODEL`` says what each option does (issue 36, item 6): a model
    registered with an option and no line in fedveil.models.option_notes fails here."""
    import inspect

    from fedveil.models import MODELS
    from fedveil.models.option_notes import option_note

    missing = [(e.name, option) for e in MODELS.entries()
               for option in list(inspect.signature(e.obj).parameters)[2:] if not option_note(e.name, option)]
    assert missing == []


def test_config_show_pets_prints_the_default_job_as_a_loadable_toml(tmp_path, capsys):
    from fedveil.cli.main import main
    from fedveil.runtime.pets_job import PetsConfig, PetsData, PetsSynthetic, load_pets_config

    assert main(["config", "show", "pets"]) == 0
    text = capsys.readouterr().out
    assert "[data.synthetic]" in text and "[pipeline]" in text and "noise_multiplier = 0.01" in text
    path = tmp_path / "job.toml"
    path.write_text(text)
    assert load_pets_config(path) == PetsConfig(data=PetsData(synthetic=PetsSynthetic()))
