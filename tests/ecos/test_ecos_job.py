"""``fedveil ecos``: one ECOS job end to end on tiny MNIST files (60 + 20 rows per domain), its
config's checks, its reuse of written stages (no second privacy release) and the CLI."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import fedveil.runtime.ecos_job as job
from fedveil.cli.main import main
from fedveil.ecos.cloud_training import CloudSGD
from fedveil.ecos.fixmatch import FixMatchSettings
from fedveil.ecos.pipeline import ECOSSettings, plan, plan_labelling
from fedveil.ecos.private_knn import KNNSettings
from fedveil.errors import ConfigError
from fedveil.privacy.ledger import PrivacyLedger
from fedveil.runtime.ecos_config import ECOSJobConfig, load_ecos_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ecos_digits.toml"
FILES = ("config.json", "selection.json", "ledger.json", "summary.json")


def tiny_config(folder: Path, data_root: Path, labels: str = "true", extra: str = "") -> Path:
    """A tiny job's TOML (root relative to the file's folder, as a user would write it)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tiny.toml"
    root = Path(os.path.relpath(data_root / "mnist-10k", folder))  # relative to the file's folder
    path.write_text(f"""
seed = 3
[data]
name = "digit_domains_synthetic"
root = "{root.as_posix()}"
options = {{ rows_per_domain = 60, test_rows_per_domain = 20, size = 16, seed = 0 }}
client_domain = "svhn_like"
cloud = "ID+OoD"
[ecos]
method = "ecos"
budget = 40
R = 10
[labels]
source = "{labels}"
k = 5
per_class = 2
[cloud]
epochs = 2
{extra}
""")
    return path


def read(folder: Path, name: str):
    return json.loads((folder / name).read_text())


def test_a_job_with_true_labels_writes_its_files_and_spends_the_planned_epsilon(tmp_path, mnist_data_root):
    config = load_ecos_config(tiny_config(tmp_path / "cfg", mnist_data_root))
    assert Path(config.data.root) == (mnist_data_root / "mnist-10k").resolve()  # read against the file's folder
    out = tmp_path / "job"
    summary = job.run_job(config, out, progress=False)
    assert all((out / name).is_file() for name in FILES) and not (out / "labels.json").exists()
    assert read(out, "config.json") == json.loads(json.dumps(config.to_dict()))
    expected = plan(config.ecos.settings).epsilon
    assert summary["epsilon"] == pytest.approx(expected, rel=1e-9) and summary["planned_epsilon"] == summary["epsilon"]
    ledger = read(out, "ledger.json")
    assert ledger["epsilon"] == pytest.approx(expected, rel=1e-9) and ledger["releases"] == ["ecos/coverage"]
    assert PrivacyLedger.from_state_dict(ledger["ledger"]).epsilon("svhn_like", 1e-5) == pytest.approx(expected)
    selection = read(out, "selection.json")
    assert selection["selected"] == len(selection["rows"]) == len(selection["indices"]) == summary["selected"] <= 40
    assert selection["client_rows"] == 30 and selection["pool_rows"] == 270  # half of domain 1; the rest of 300 rows
    assert selection["summary_bytes"] == 4 * 10 + 24 == summary["upload_bytes"]
    assert summary["client_data_bytes"] == 30 * 3 * 16 * 16 and summary["download_bytes"] > 0
    assert 0.0 <= summary["accuracy"] <= 1.0 and summary["test_rows"] == 20 and summary["client"] == "svhn_like"
    assert set(summary["seconds"]) >= {"cloud_features", "clustering", "client_summary", "selection", "labelling",
                                       "training"}
    assert summary["reused"] == []
    assert (out / "selection.png").read_bytes().startswith(b"\x89PNG")  # pool vs selection per domain, the upload


def test_the_selection_plot_counts_rows_per_domain(tmp_path):
    import numpy as np

    from fedveil.ecos.selection_plot import domain_counts, plot_selection

    pool, chosen = np.array([0, 0, 2, 2, 2, 3]), np.array([2, 2, 3])
    domains, in_pool, picked = domain_counts(pool, chosen, client_domain=1)  # the client's domain, none in the pool
    assert domains.tolist() == [0, 1, 2, 3] and in_pool.tolist() == [2, 0, 3, 1] and picked.tolist() == [0, 0, 2, 1]
    assert plot_selection(pool, chosen, 1, None, None, tmp_path / "s.png", "t").read_bytes().startswith(b"\x89PNG")


def test_private_knn_labels_compose_both_releases_in_the_ledger(tmp_path, mnist_data_root):
    config = load_ecos_config(tiny_config(tmp_path / "cfg", mnist_data_root, labels="private_knn"))
    out = tmp_path / "job"
    summary = job.run_job(config, out, progress=False)
    labels = read(out, "labels.json")
    assert labels["queries"] == summary["selected"] and labels["released"] == summary["labelled"] <= 20
    settings = config.ecos.settings
    releases = [*plan(settings).releases, *plan_labelling(settings, config.labels.knn, labels["queries"]).releases]
    expected = PrivacyLedger(settings.accountant).epsilon_of(releases, settings.delta)
    assert summary["epsilon"] == pytest.approx(expected, rel=1e-9) == read(out, "ledger.json")["epsilon"]
    assert read(out, "ledger.json")["releases"] == ["ecos/coverage", "ecos/private-knn"]
    assert summary["planned_epsilon"] >= summary["epsilon"]  # planned at the budget's 40 queries
    assert summary["upload_bytes"] == 4 * 10 + 24 + 5 * labels["released"]


def test_a_rerun_after_a_crash_reuses_the_selection_and_records_no_second_release(tmp_path, mnist_data_root,
                                                                                  monkeypatch):
    config = load_ecos_config(tiny_config(tmp_path / "cfg", mnist_data_root, labels="private_knn"))
    out = tmp_path / "job"

    def crash(*args, **kwargs):
        raise RuntimeError("crash in the labelling")

    with monkeypatch.context() as patch:  # the selection is written, then the job dies
        patch.setattr(job, "label", crash)
        with pytest.raises(RuntimeError, match="crash"):
            job.run_job(config, out, progress=False)
    assert (out / "selection.json").exists() and not (out / "labels.json").exists()
    after_selection = read(out, "ledger.json")
    assert after_selection["releases"] == ["ecos/coverage"]

    def no_second_selection(*args, **kwargs):
        raise AssertionError("the selection was redone")

    monkeypatch.setattr(job, "select", no_second_selection)
    summary = job.run_job(config, out, progress=False)
    assert summary["reused"] == ["selection"]
    ledger = read(out, "ledger.json")
    assert ledger["releases"] == ["ecos/coverage", "ecos/private-knn"]  # one coverage release, not two
    assert ledger["ledger"]["records"][:1] == after_selection["ledger"]["records"]

    (out / "summary.json").unlink()  # a crash in the training: both private stages are read back
    monkeypatch.setattr(job, "label", crash)
    again = job.run_job(config, out, progress=False)
    assert again["reused"] == ["selection", "labelling"]
    assert read(out, "ledger.json") == ledger and again["epsilon"] == summary["epsilon"]
    assert again["accuracy"] == summary["accuracy"]  # same labels, same seed: the same model

    done = job.run_job(config, out, progress=False)  # complete: its summary as it is
    assert done == read(out, "summary.json")


def test_a_fixmatch_job_reads_its_settings_from_cloud_fixmatch(tmp_path, mnist_data_root):
    overrides = ['cloud.trainer="fixmatch"', "cloud.epochs=1", "cloud.fixmatch.unlabeled_ratio=2"]
    config = load_ecos_config(tiny_config(tmp_path / "cfg", mnist_data_root), overrides)
    assert config.cloud.fixmatch.settings == FixMatchSettings(unlabeled_ratio=2)
    summary = job.run_job(config, tmp_path / "job", progress=False)
    assert summary["trainer"] == "fixmatch" and 0.0 <= summary["accuracy"] <= 1.0


def test_a_folder_of_another_config_is_refused(tmp_path, mnist_data_root):
    path = tiny_config(tmp_path / "cfg", mnist_data_root)
    out = tmp_path / "job"
    job.run_job(load_ecos_config(path), out, progress=False)
    before = {name: (out / name).read_text() for name in FILES}
    with pytest.raises(ConfigError, match=r"holds an ECOS job of another config \(ecos\.budget: 40 there, 20 here\)"):
        job.run_job(load_ecos_config(path, ["ecos.budget=20"]), out, progress=False)
    assert {name: (out / name).read_text() for name in FILES} == before
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="holds no ECOS job"):
        job.run_job(load_ecos_config(path), tmp_path / "other", progress=False)


def test_a_plan_over_the_epsilon_budget_is_refused_before_any_work(tmp_path, mnist_data_root):
    config = load_ecos_config(tiny_config(tmp_path / "cfg", mnist_data_root), ["ecos.epsilon_budget=0.01"])
    with pytest.raises(ConfigError, match=r"^ecos\.epsilon_budget: .*over the budget 0\.01"):
        job.run_job(config, tmp_path / "job", progress=False)
    assert not (tmp_path / "job").exists()


def test_config_errors_are_one_line_and_name_the_dotted_key(tmp_path, mnist_data_root):
    path = tiny_config(tmp_path / "cfg", mnist_data_root, extra="[ecos.x]\n")
    typo = tmp_path / "typo.toml"
    typo.write_text("[ecos]\nbudjet = 10\n")
    with pytest.raises(ConfigError) as err:
        load_ecos_config(typo)
    message = str(err.value)
    assert message.startswith("ecos.budjet: Extra inputs are not permitted") and "did you mean 'ecos.budget'?" in message
    assert "\n" not in message
    cases = {
        "ecos.R=0": r"^ecos\.R: Input should be greater than or equal to 1 \(got 0\)",
        "data.cloud=\"IID\"": r"^data\.cloud: Input should be 'ID', 'ID\+OoD' or 'OoD' \(got 'IID'\)",
        "labels.sample_rate=2": r"^labels\.sample_rate: Input should be less than or equal to 1",
        "cloud.fixmatch.threshold=2": r"^cloud\.fixmatch\.threshold: Input should be less than or equal to 1",
        "cloud.model_options.widht=1": r"^cloud\.model_options: model 'lenet' has no option 'widht' \(did you mean 'width'\?\)",
        "ecos.extractor_options.cell=3": (
            r"^ecos\.extractor_options: extractor 'hog_color' has no option 'cell' \(did you mean 'cells'\?\)"
        ),
        "data.options.rows=3": r"^data\.options: data set 'digit_domains_synthetic' has no option 'rows'",
        "data.options.root=\"x\"": r"^data\.options: set root as data\.root",
        "ecos.sigma=inf": r"^ecos\.sigma: Input should be a finite number",
        "labels.per_class=0": r'^labels\.per_class: must be an integer >= 1 or "all"; got 0',
        "data.client_domain=\"\"": r"^data\.client_domain: must be a domain index >= 0 or a non-empty domain name",
        "sample_rate=0.5": r"'sample_rate' is ambiguous: write one of ecos\.sample_rate, labels\.sample_rate",
        "budjet=7": r"^budjet: Extra inputs are not permitted \(got 7\); accepted: seed, data, ecos, labels, cloud",
        "ecos.budjet=7": r"^ecos\.budjet: Extra inputs are not permitted \(got 7\) \(did you mean 'ecos\.budget'\?\)",
        "ecos.budget=\"many\"": r"^ecos\.budget: Input should be a valid integer, unable to parse .* \(got 'many'\)",
    }
    clean = tiny_config(tmp_path / "clean", mnist_data_root)
    for override, pattern in cases.items():
        with pytest.raises(ConfigError, match=pattern) as err:
            load_ecos_config(clean, [override])
        assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"^ecos\.x: Extra inputs are not permitted"):
        load_ecos_config(path)
    assert load_ecos_config(clean, ["budget=7"]).ecos.budget == 7  # a bare key of one setting
    assert load_ecos_config(clean, ['labels.per_class="all"']).labels.knn.per_class is None
    assert load_ecos_config(clean, ["seed=5"]).data.split_seed == 5  # data.split_seed follows the seed
    assert load_ecos_config(clean, ["seed=5", "data.split_seed=2"]).data.split_seed == 2


def test_the_config_sections_hold_every_setting_of_the_ecos_dataclasses_with_their_defaults():
    """A field added to ECOSSettings, KNNSettings, CloudSGD or FixMatchSettings must be a key of
    its section (else the job silently runs at its default)."""
    config = ECOSJobConfig()
    sections = ((config.ecos, ECOSSettings, {"extractor", "extractor_options"}), (config.labels, KNNSettings, set()),
                (config.cloud, CloudSGD, set()), (config.cloud.fixmatch, FixMatchSettings, set()))
    for section, cls, own_defaults in sections:  # the job's phi is hog_color on 4x4 cells, not the dataclass's
        assert set(cls.__dataclass_fields__) <= set(type(section).model_fields)
        defaults = cls()
        for name in set(cls.__dataclass_fields__) - own_defaults:
            assert getattr(section, name) == getattr(defaults, name), (cls.__name__, name)


def test_the_cli_runs_a_job_and_reports_bad_values_on_one_line(tmp_path, mnist_data_root, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = str(tiny_config(tmp_path / "cfg", mnist_data_root))
    assert main(["ecos", path, "ecos.R=0", "--out", "bad"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fedveil: error: ecos.R: Input should be greater than or equal to 1")
    assert main(["ecos", path, "cloud.epoch=3", "--out", "bad"]) == 2  # an unknown key
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fedveil: error: cloud.epoch: Extra inputs are not permitted")
    assert "did you mean 'cloud.epochs'?" in err
    assert not (tmp_path / "bad").exists()
    # a value only the ecos modules refuse (HOG blocks larger than the cells): one line too
    assert main(["ecos", path, "ecos.extractor_options.block=9", "--out", "bad_block", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ecos.extractor_options: block (9 cells) cannot exceed cells" in err
    assert not (tmp_path / "bad_block").exists()
    assert main(["ecos", path, "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "ECOS job: ecos on digit_domains_synthetic, client svhn_like" in out and "[ecos]" not in out
    (folder,) = (tmp_path / "runs").iterdir()
    assert folder.name.startswith("ecos-svhn_like-ecos-") and all((folder / n).is_file() for n in FILES)
    assert main(["ecos", path, "--out", str(folder)]) == 0  # complete: read back
    assert "holds this job, complete" in capsys.readouterr().out


def test_the_example_validates_and_runs_shrunk(tmp_path, mnist_data_root):
    config = load_ecos_config(EXAMPLE)
    assert (config.data.client_domain, config.data.cloud, config.ecos.method, config.ecos.budget) == (1, "ID+OoD",
                                                                                                   "ecos", 1000)
    assert (config.labels.source, config.cloud.trainer, config.cloud.model) == ("true", "supervised", "lenet")
    settings = config.ecos.settings
    assert (settings.extractor, settings.extractor_options, settings.R, settings.sigma, settings.sample_rate) == (
        "hog_color", {"cells": 4, "bins": 9, "block": 1}, 100, 25.0, 0.8)
    assert Path(config.data.root) == (EXAMPLE.parent / "../../shared/data/mnist-10k").resolve()
    assert job.plan_job(config).epsilon <= settings.epsilon_budget
    shrunk = load_ecos_config(EXAMPLE, [
        f'data.root="{mnist_data_root / "mnist-10k"}"', "data.options.rows_per_domain=60",
        "data.options.test_rows_per_domain=20", "ecos.budget=40", "ecos.R=10", "cloud.epochs=1",
    ])
    summary = job.run_job(shrunk, tmp_path / "job", progress=False)
    assert summary["client"] == "svhn_like" and summary["cloud"] == "ID+OoD" and 0 < summary["selected"] <= 40
