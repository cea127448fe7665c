"""``[eval] metrics`` end to end: extra metric keys in metrics.jsonl / summary.json, their
values against an independent recomputation, the algorithm's predict hook, early errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedveil.algorithms import ALGORITHMS
from fedveil.algorithms.finetune import FedAvgFT
from fedveil.errors import ConfigError
from fedveil.models import build_model
from fedveil.models.functional import forward
from fedveil.registry import Entry
from fedveil.runtime import Simulation, run
from fedveil.runtime.dataset import build_dataset
from fedveil.runtime.plots import extra_metric_curves
from tiny_runs import load_checkpoint, read_json, rows_of, tiny_config

STATS = ("mean", "weighted_mean", "std", "worst10")
FAIRNESS = ["accuracy", "equalized_odds_gap", "demographic_parity_gap", "auprc", "group_accuracy",
            "worst_group_accuracy"]
COLUMNS = ["sex", "age", "age_cat", "race", "juv_fel_count", "juv_misd_count", "juv_other_count", "priors_count",
           "days_b_screening_arrest", "c_charge_degree", "is_recid", "score_text", "two_year_recid"]


def write_compas(directory, rows=400, seed=0):
    """A COMPAS-format file (the loader's required columns) whose label depends on priors
    and sex, so the groups differ in base rate."""
    rng = np.random.default_rng(seed)
    lines = [",".join(COLUMNS)]
    for _ in range(rows):
        male = rng.random() < 0.6
        age = int(rng.integers(18, 70))
        priors = int(rng.poisson(3))
        recid = int(rng.random() < 1 / (1 + np.exp(-(priors - 3 + (0.8 if male else -0.8)))))
        age_cat = "Less than 25" if age < 25 else ("25 - 45" if age <= 45 else "Greater than 45")
        race = rng.choice(["African-American", "Caucasian", "Hispanic"])
        lines.append(",".join(map(str, [
            "Male" if male else "Female", age, age_cat, race, 0, int(rng.integers(0, 2)), 0, priors,
            int(rng.integers(-5, 5)), rng.choice(["F", "M"]), recid, "Low", recid,
        ])))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "compas-scores-two-years.csv").write_text("\n".join(lines) + "\n")
    return directory


def compas_config(tmp_path, **sections):
    base = dict(
        data={"name": "compas", "root": str(write_compas(tmp_path / "compas")), "download": False, "num_clients": 4},
        model={"name": "linear"},
        federation={"rounds": 2, "clients_per_round": 4},
        eval={"metrics": FAIRNESS, "group": "sex"},
    )
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value}
    return tiny_config(**base)


def eo_gap_by_hand(y, pred, a):
    """|FPR_0 - FPR_1| + |FNR_0 - FNR_1| written out with masks (Eq. 3.9)."""
    fpr = [np.mean(pred[(y == 0) & (a == g)] == 1) for g in (0, 1)]
    fnr = [np.mean(pred[(y == 1) & (a == g)] == 0) for g in (0, 1)]
    return abs(fpr[0] - fpr[1]) + abs(fnr[0] - fnr[1])


@pytest.mark.usefixtures("skip_plots")
def test_fairness_metrics_reach_metrics_jsonl_and_summary(tmp_path):
    config = compas_config(tmp_path, algorithm={"name": "fedavg_ft"})
    out = tmp_path / "run"
    summary = run(config, out, progress=False)
    rows = rows_of(out)
    extra = ["equalized_odds_gap", "demographic_parity_gap", "auprc", "accuracy_group_0", "accuracy_group_1",
             "worst_group_accuracy"]
    expected = {"global_test_loss", "global_test_accuracy"} | {f"global_test_{k}" for k in extra}
    for prefix in ("global_client", "personal"):
        expected |= {f"{prefix}_{k}_{s}" for k in ["accuracy", *extra] for s in STATS}
    for row in rows:
        assert expected <= set(row), sorted(expected - set(row))
        assert not any(k.startswith(("global_client_loss", "personal_loss")) for k in row)  # loss not listed
    for key in expected:
        assert summary[key] == rows[-1][key]
    assert summary == read_json(out / "summary.json")
    clients = read_json(out / "client_metrics.json")
    assert {"global_equalized_odds_gap", "personal_auprc", "personal_accuracy_group_1"} <= set(clients[0])

    # independent recomputation on the pooled test set from the final checkpoint
    data = build_dataset(config.data, config.seed)
    model = build_model("linear", data.input_shape, data.num_classes)
    params = load_checkpoint(out)["server"]["params"]
    with torch.no_grad():
        logits = torch.func.functional_call(model, params, (data.test.x,))
    y, pred, a = data.test.y.numpy(), logits.argmax(1).numpy(), data.test.groups["sex"].numpy()
    assert summary["global_test_accuracy"] == np.mean(pred == y)
    assert summary["global_test_equalized_odds_gap"] == pytest.approx(eo_gap_by_hand(y, pred, a), abs=1e-12)
    positive_rate = [np.mean(pred[a == g] == 1) for g in (0, 1)]
    assert summary["global_test_demographic_parity_gap"] == pytest.approx(abs(positive_rate[0] - positive_rate[1]))
    group_acc = [np.mean(pred[a == g] == y[a == g]) for g in (0, 1)]
    assert [summary["global_test_accuracy_group_0"], summary["global_test_accuracy_group_1"]] == pytest.approx(group_acc)
    assert summary["global_test_worst_group_accuracy"] == pytest.approx(min(group_acc))
    assert 0 < summary["global_test_auprc"] <= 1
    # per-client summaries of a gap: worst10 of 4 clients is the largest gap (lower is better)
    gaps = [c["global_equalized_odds_gap"] for c in clients if "global_equalized_odds_gap" in c]
    assert summary["global_client_equalized_odds_gap_worst10"] == pytest.approx(max(gaps))
    assert summary["global_client_equalized_odds_gap_mean"] == pytest.approx(np.mean(gaps))


def test_extra_metrics_are_plotted(tmp_path):
    out = tmp_path / "run"
    run(compas_config(tmp_path, federation={"rounds": 1}), out, progress=False)
    curves = [key for key, _ in extra_metric_curves(rows_of(out), "accuracy")]
    assert "global_test_equalized_odds_gap" in curves and "global_test_auprc" in curves
    assert "global_test_accuracy" not in curves and "global_test_loss" not in curves
    assert (out / "learning_curves.png").stat().st_size > 0


class AlwaysZero(FedAvgFT):
    """Predicts class 0 for every row, for the global and the personal models."""

    def predict(self, model, state, x):
        out = forward(model, state, x)
        zero = torch.zeros_like(out)
        zero[:, 0] = 1.0
        return zero


@pytest.mark.usefixtures("skip_plots")
def test_evaluation_goes_through_the_algorithms_predict_hook(tmp_path, monkeypatch):
    monkeypatch.setitem(ALGORITHMS._entries, "always_zero", Entry("always_zero", AlwaysZero, "test"))
    config = compas_config(tmp_path, algorithm={"name": "always_zero"})
    out = tmp_path / "run"
    summary = run(config, out, progress=False)
    data = build_dataset(config.data, config.seed)
    # predicting 0 everywhere: accuracy = share of label 0; every rate equal across groups
    zeros = float((data.test.y == 0).double().mean())
    assert summary["global_test_accuracy"] == pytest.approx(zeros, abs=1e-12)
    assert summary["global_test_equalized_odds_gap"] == 0.0  # FPR 0 and FNR 1 in both groups
    assert summary["global_test_demographic_parity_gap"] == 0.0
    assert summary["global_test_auprc"] == pytest.approx(1 - zeros, abs=1e-12)  # tied scores: the prevalence
    per_client = [float((c.test.y == 0).double().mean()) for c in data.clients]
    assert summary["personal_accuracy_mean"] == pytest.approx(np.mean(per_client), abs=1e-12)
    assert summary["global_client_accuracy_mean"] == pytest.approx(np.mean(per_client), abs=1e-12)


@pytest.mark.usefixtures("skip_plots")
def test_default_eval_reports_the_same_numbers_as_listing_the_defaults(tmp_path):
    plain = run(tiny_config(federation={"rounds": 2}), tmp_path / "a", progress=False)
    listed = run(tiny_config(federation={"rounds": 2}, eval={"metrics": ["accuracy"]}), tmp_path / "b", progress=False)
    for key in ("global_test_loss", "global_test_accuracy", "global_client_accuracy_mean"):
        assert plain[key] == listed[key]
    with_loss = run(tiny_config(federation={"rounds": 2}, eval={"metrics": ["loss"]}), tmp_path / "c", progress=False)
    assert with_loss["global_test_loss"] == plain["global_test_loss"]
    assert {f"global_client_loss_{s}" for s in STATS} <= set(with_loss)


def test_unknown_metric_gets_a_did_you_mean(tmp_path):
    with pytest.raises(ConfigError, match="unknown metric 'equalised_odds_gap' .did you mean 'equalized_odds_gap'"):
        tiny_config(eval={"metrics": ["equalised_odds_gap"], "group": "sex"})


def test_group_metric_without_group_key_fails_validation():
    with pytest.raises(ConfigError, match="'demographic_parity_gap' needs eval.group"):
        tiny_config(eval={"metrics": ["demographic_parity_gap"]})


def test_group_metric_on_data_without_groups_fails_before_the_run(tmp_path):
    config = tiny_config(eval={"metrics": ["equalized_odds_gap"], "group": "sex"})  # digits has no groups
    with pytest.raises(ConfigError, match=r"eval.group: 'equalized_odds_gap' reads group 'sex'.*'digits'.*groups: none"):
        Simulation.from_config(config)


def test_wrong_group_key_names_the_available_ones(tmp_path):
    config = compas_config(tmp_path, eval={"group": "gender"})
    with pytest.raises(ConfigError, match="no such group .its groups: race, sex"):
        Simulation.from_config(config)


def test_classification_metric_on_regression_fails_before_the_run(tmp_path):
    from test_metrics_keys import write_school

    root = write_school(tmp_path / "school")
    config = tiny_config(data={"name": "school", "root": str(root), "download": False, "num_clients": 3},
                         model={"name": "auto"}, eval={"metrics": ["auprc"]})
    with pytest.raises(ConfigError, match="eval.metrics: 'auprc' needs a classification task; 'school' is regression"):
        Simulation.from_config(config)


@pytest.mark.usefixtures("skip_plots")
def test_the_example_config_of_docs_evaluation_runs(tmp_path):
    import re
    import tomllib
    from pathlib import Path

    from fedveil.config import validate

    doc = (Path(__file__).resolve().parents[2] / "docs" / "evaluation.md").read_text()
    raw = tomllib.loads(re.search(r"```toml\n(.*?)```", doc, re.S).group(1))
    raw["data"].update(root=str(write_compas(tmp_path / "compas")), download=False)
    raw["federation"]["rounds"] = 1
    summary = run(validate(raw), tmp_path / "run", progress=False)
    for key in ("global_test_equalized_odds_gap", "global_test_accuracy_group_1", "global_test_auprc",
                "personal_worst_group_accuracy_mean"):
        assert key in summary
