"""The documented metric keys of metrics.jsonl and summary.json, checked against values
recomputed here from client_metrics.json, partition.json and the final checkpoint."""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.io
import torch
from torch.func import functional_call

from fedveil.runtime.dataset import build_dataset
from fedveil.models import build_model
from fedveil.runtime import run
from fedveil.runtime.sampling import client_schedule
from tiny_runs import load_checkpoint, read_json, rows_of, tiny_config, write_school

pytestmark = pytest.mark.usefixtures("skip_plots")

RUN_KEYS = {"round", "cohort_size", "lr", "train_loss", "elapsed_s"}
STATS = ("mean", "weighted_mean", "std", "worst10")
SUMMARY_FACTS = {
    "algorithm", "dataset", "model", "task", "score", "num_clients", "rounds",
    "rounds_completed", "seed", "wall_time_s", "final_round", "best", "device", "torch_threads", "executor",
}


def global_keys(score):
    return {"global_test_loss", f"global_test_{score}"} | {f"global_client_{score}_{s}" for s in STATS}


def personal_keys(score):
    return {f"personal_{score}_{s}" for s in STATS}


def summary_of_clients(values, weights, higher_is_better):
    """Independent restatement of the documented per-client summaries."""
    n = len(values)
    k = math.ceil(n / 10)
    worst = sorted(values, reverse=not higher_is_better)[:k]
    mean = sum(values) / n
    return {
        "mean": mean,
        "weighted_mean": sum(v * w for v, w in zip(values, weights)) / sum(weights),
        "std": math.sqrt(sum((v - mean) ** 2 for v in values) / n),
        "worst10": sum(worst) / k,
    }


# ----------------------------------------------------------------- classification


def test_fedavg_rows_and_summary_keys(tmp_path):
    out = tmp_path / "run"
    summary = run(tiny_config(federation={"rounds": 3}), out, progress=False)
    rows = rows_of(out)
    assert [r["round"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert set(row) == RUN_KEYS | global_keys("accuracy")
        assert row["cohort_size"] == 3 and row["lr"] == 0.1
    assert set(summary) == SUMMARY_FACTS | global_keys("accuracy")
    assert summary == read_json(out / "summary.json")
    assert (summary["algorithm"], summary["dataset"], summary["model"]) == ("fedavg", "digits", "linear")
    assert (summary["task"], summary["score"], summary["num_clients"]) == ("classification", "accuracy", 5)
    assert (summary["rounds"], summary["rounds_completed"], summary["final_round"], summary["seed"]) == (3, 3, 3, 0)
    assert summary["best"] is None  # no validation split
    for key in global_keys("accuracy"):
        assert summary[key] == rows[-1][key]
    assert summary["wall_time_s"] == rows[-1]["elapsed_s"]


def test_summary_values_match_an_independent_recomputation(tmp_path):
    config = tiny_config(federation={"rounds": 2})
    out = tmp_path / "run"
    summary = run(config, out, progress=False)
    clients = read_json(out / "client_metrics.json")
    partition = read_json(out / "partition.json")

    assert [c["client"] for c in clients] == [0, 1, 2, 3, 4]
    assert [c["num_test"] for c in clients] == partition["test_sizes"]
    assert [c["num_train"] for c in clients] == partition["train_sizes"]
    assert sum(partition["train_sizes"]) + sum(partition["test_sizes"]) == 1797  # all of sklearn's digits
    assert partition["pooled_test_size"] == sum(partition["test_sizes"])  # digits has no own test split
    assert np.asarray(partition["label_counts"]).sum(axis=1).tolist() == partition["train_sizes"]

    expected = summary_of_clients([c["global_accuracy"] for c in clients], [c["num_test"] for c in clients], True)
    for stat, value in expected.items():
        assert summary[f"global_client_accuracy_{stat}"] == pytest.approx(value, abs=1e-12)

    # the pooled test set is the union of the client test splits: its accuracy is the
    # test-size-weighted mean of the clients' accuracies
    assert summary["global_test_accuracy"] == pytest.approx(expected["weighted_mean"], abs=1e-12)

    # ... and it is the accuracy of the final checkpointed global model
    data = build_dataset(config.data, config.seed)
    model = build_model("linear", data.input_shape, data.num_classes)
    params = load_checkpoint(out)["server"]["params"]
    with torch.no_grad():
        logits = functional_call(model, params, (data.test.x,))
        correct = int((logits.argmax(1) == data.test.y).sum())
        loss = float(torch.nn.functional.cross_entropy(logits, data.test.y))
    assert len(data.test) == partition["pooled_test_size"]
    assert summary["global_test_accuracy"] == correct / len(data.test)
    assert summary["global_test_loss"] == pytest.approx(loss, rel=1e-5)


@pytest.mark.parametrize("algorithm", ["fedavg_ft", "local"])
def test_personal_keys_for_algorithms_with_personal_models(tmp_path, algorithm):
    out = tmp_path / "run"
    summary = run(tiny_config(algorithm={"name": algorithm}, federation={"rounds": 2}), out, progress=False)
    expected = RUN_KEYS | personal_keys("accuracy")
    if algorithm == "fedavg_ft":
        expected |= global_keys("accuracy")  # local has no global model: no global_* keys at all
    for row in rows_of(out):
        assert set(row) == expected
    assert set(summary) == SUMMARY_FACTS | (expected - RUN_KEYS)
    clients = read_json(out / "client_metrics.json")
    values = [c["personal_accuracy"] for c in clients]
    stats = summary_of_clients(values, [c["num_test"] for c in clients], True)
    for stat, value in stats.items():
        assert summary[f"personal_accuracy_{stat}"] == pytest.approx(value, abs=1e-12)
    assert ("global_accuracy" in clients[0]) == (algorithm == "fedavg_ft")


def test_eval_personal_false_drops_personal_keys(tmp_path):
    out = tmp_path / "run"
    run(tiny_config(algorithm={"name": "fedavg_ft"}, federation={"rounds": 1}, eval={"personal": False}), out,
        progress=False)
    assert set(rows_of(out)[0]) == RUN_KEYS | global_keys("accuracy")


def test_eval_every_scores_only_those_rounds_and_the_last(tmp_path):
    out = tmp_path / "run"
    summary = run(tiny_config(federation={"rounds": 5}, eval={"every": 2}), out, progress=False)
    rows = rows_of(out)
    assert [bool(global_keys("accuracy") & set(r)) for r in rows] == [False, True, False, True, True]
    assert set(rows[0]) == RUN_KEYS
    assert summary["final_round"] == 5 and summary["rounds_completed"] == 5
    assert summary["global_test_accuracy"] == rows[-1]["global_test_accuracy"]


def test_best_round_only_with_a_validation_split(tmp_path):
    out = tmp_path / "run"
    summary = run(
        tiny_config(algorithm={"name": "fedavg_ft"}, federation={"rounds": 4}, data={"val_fraction": 0.2}),
        out, progress=False,
    )
    rows = rows_of(out)
    for row in rows:
        assert set(row) == RUN_KEYS | global_keys("accuracy") | personal_keys("accuracy") | {
            "global_val_accuracy", "personal_val_accuracy"}
    best_row = max(rows, key=lambda r: r["global_val_accuracy"])  # first maximum, like max()
    best = summary["best"]
    assert best["selected_by"] == "global_val_accuracy"
    assert best["round"] == best_row["round"]
    assert best["global_test_accuracy"] == best_row["global_test_accuracy"]
    assert best["personal_val_accuracy"] == best_row["personal_val_accuracy"]
    assert "train_loss" not in best and "elapsed_s" not in best
    partition = read_json(out / "partition.json")
    assert all(v > 0 for v in partition["val_sizes"])


def test_local_best_round_is_selected_by_personal_validation(tmp_path):
    out = tmp_path / "run"
    summary = run(
        tiny_config(algorithm={"name": "local"}, federation={"rounds": 3}, data={"val_fraction": 0.2}),
        out, progress=False,
    )
    rows = rows_of(out)
    assert all("global_val_accuracy" not in r and "personal_val_accuracy" in r for r in rows)
    assert summary["best"]["selected_by"] == "personal_val_accuracy"
    assert summary["best"]["round"] == max(rows, key=lambda r: r["personal_val_accuracy"])["round"]


# --------------------------------------------------------------------- regression




def test_regression_reports_mse_keys_and_selects_the_lowest_validation_mse(tmp_path):
    root = write_school(tmp_path / "school")
    out = tmp_path / "run"
    config = tiny_config(
        data={"name": "school", "root": str(root), "download": False, "num_clients": 3, "val_fraction": 0.2},
        model={"name": "auto"},
        algorithm={"name": "fedavg_ft"},
        client={"lr": 0.05, "batch_size": 8},
        federation={"rounds": 4, "clients_per_round": 2},
    )
    summary = run(config, out, progress=False)
    rows = rows_of(out)
    expected = RUN_KEYS | global_keys("mse") | personal_keys("mse") | {"global_val_mse", "personal_val_mse"}
    for row in rows:
        assert set(row) == expected
        assert not any("accuracy" in k for k in row)
        # the pooled test loss of a regression model is its MSE
        assert row["global_test_mse"] == row["global_test_loss"]
    assert (summary["task"], summary["score"], summary["model"]) == ("regression", "mse", "linear")
    assert set(summary) == SUMMARY_FACTS | (expected - RUN_KEYS)
    best_row = min(rows, key=lambda r: r["global_val_mse"])
    assert summary["best"]["round"] == best_row["round"]
    assert summary["best"]["selected_by"] == "global_val_mse"
    assert rows[-1]["global_test_mse"] < rows[0]["global_test_mse"]  # it learns: lower is better

    # worst10 of an error is the highest per-client MSE (3 clients: ceil(0.3) = 1 client)
    clients = read_json(out / "client_metrics.json")
    stats = summary_of_clients([c["global_mse"] for c in clients], [c["num_test"] for c in clients], False)
    assert summary["global_client_mse_worst10"] == pytest.approx(max(c["global_mse"] for c in clients), abs=1e-12)
    for stat, value in stats.items():
        assert summary[f"global_client_mse_{stat}"] == pytest.approx(value, rel=1e-12)
    partition = read_json(out / "partition.json")
    assert "label_counts" not in partition
    assert sum(partition["train_sizes"]) + sum(partition["val_sizes"]) + sum(partition["test_sizes"]) == 90


# ------------------------------------------------------------------ poisson cohorts


def seed_with_empty_round(num_clients, expected, rounds):
    """A seed whose Poisson schedule has an empty cohort after a non-empty first round."""
    for seed in range(100):
        schedule = client_schedule(num_clients, expected, rounds, "poisson", seed)
        sizes = [len(s) for s in schedule]
        if sizes[0] > 0 and 0 in sizes[1:]:
            return seed, sizes
    raise AssertionError("no such seed below 100")


@pytest.mark.parametrize("algorithm", ["fedavg", "scaffold", "fedavg_ft"])
def test_poisson_empty_cohort_runs_and_leaves_the_model_unchanged(tmp_path, algorithm):
    seed, sizes = seed_with_empty_round(num_clients=10, expected=1, rounds=4)
    out = tmp_path / "run"
    config = tiny_config(
        seed=seed,
        algorithm={"name": algorithm},
        data={"num_clients": 10},
        federation={"rounds": 4, "clients_per_round": 1, "sampling": "poisson"},
    )
    summary = run(config, out, progress=False)
    rows = rows_of(out)
    assert [r["cohort_size"] for r in rows] == sizes
    assert summary["rounds_completed"] == 4
    for prev, row in zip(rows, rows[1:]):
        if row["cohort_size"] == 0:
            assert "train_loss" not in row
            # nobody trained, so the global model and its scores did not move
            for key in global_keys("accuracy"):
                assert row[key] == prev[key]
        else:
            assert "train_loss" in row


def test_poisson_run_where_every_cohort_is_empty(tmp_path):
    seed = next(
        s for s in range(500)
        if all(len(c) == 0 for c in client_schedule(10, 1, 2, "poisson", s))
    )
    out = tmp_path / "run"
    summary = run(
        tiny_config(seed=seed, data={"num_clients": 10}, federation={"rounds": 2, "clients_per_round": 1,
                                                                      "sampling": "poisson"}),
        out, progress=False,
    )
    rows = rows_of(out)
    assert [r["cohort_size"] for r in rows] == [0, 0]
    assert all("train_loss" not in r for r in rows)
    assert rows[0]["global_test_accuracy"] == rows[1]["global_test_accuracy"] == summary["global_test_accuracy"]
