"""The ``[log]`` tracking sinks, read back with the real libraries: TensorBoard's event reader
and MLflow's client hold the rows of ``metrics.jsonl`` (epsilon included) and the config, a
resumed run continues the same TensorBoard folder and MLflow run, and a missing library or a
bad tracking URI is a one-line error before anything is written."""
from __future__ import annotations

import itertools
import sys

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tiny_runs import WALL_CLOCK_KEYS, KillAfterRound, Killed, read_json, rows_of, tiny_config

from fedveil.cli.main import main
from fedveil.errors import ConfigError
from fedveil.runtime import Simulation

pytestmark = pytest.mark.usefixtures("skip_plots")

ROUNDS = 4
# example-level DP: every row has epsilon and epsilon_per_client (a list, one tag per client)
DP = {"level": "example", "epsilon": 5.0}


def dp_config(**log):
    """A DP run that keeps its un-noised metrics: every kind of row key reaches the trackers."""
    return tiny_config(federation={"rounds": ROUNDS}, checkpoint={"every": 2}, privacy={**DP, "keep_unnoised": True}, log=log)


def expected_series(rows, skip=()):
    """tag -> [(round, value)] from metrics.jsonl rows, lists as ``key/<index>``."""
    series = {}
    for row in rows:
        for key, value in row.items():
            items = {f"{key}/{i}": v for i, v in enumerate(value)} if isinstance(value, list) else {key: value}
            for tag, v in items.items():
                if key not in ("round", *skip):
                    series.setdefault(tag, []).append((row["round"], float(v)))
    return series


def tensorboard_series(run_dir):
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    scalars = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    config_text = [(e.step, e.tensor_proto.string_val[0].decode()) for e in events.Tensors("config/text_summary")]
    return scalars, config_text


def as_float32(series):
    return {tag: [(step, float(np.float32(v))) for step, v in points] for tag, points in series.items()}


def mlflow_run(uri, run_dir):
    client = MlflowClient(tracking_uri=uri)
    return client, client.get_run((run_dir / "mlflow_run_id.txt").read_text().strip())


def mlflow_series(client, run, tags):
    return {tag: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, tag)) for tag in tags}


def assert_epsilon_grows(points):
    steps, values = zip(*points)
    assert list(steps) == list(range(1, ROUNDS + 1))
    assert values[0] > 0 and all(a <= b for a, b in itertools.pairwise(values))


def test_tensorboard_holds_every_row_and_the_config(tmp_path):
    out = tmp_path / "run"
    Simulation.from_config(dp_config(tensorboard=True)).run(out)
    rows = rows_of(out)
    scalars, config_text = tensorboard_series(out)

    expected = expected_series(rows)
    assert {"epsilon", "epsilon_per_client/0", "train_loss", "global_test_accuracy"} <= set(expected)
    assert scalars == as_float32(expected)  # same tags, same steps, values to float32
    assert_epsilon_grows(scalars["epsilon"])
    [(step, text)] = config_text
    assert step == 0
    assert f"federation.rounds = {ROUNDS}" in text and "privacy.level = example" in text


def test_mlflow_holds_params_metrics_and_summary(tmp_path):
    uri, out = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "run"
    summary = Simulation.from_config(dp_config(mlflow_uri=uri, mlflow_experiment="tiny")).run(out)
    rows = rows_of(out)
    client, run = mlflow_run(uri, out)

    assert run.info.status == "FINISHED" and run.info.run_name == "run"
    assert client.get_experiment(run.info.experiment_id).name == "tiny"
    params = run.data.params
    assert params["federation.rounds"] == str(ROUNDS)
    assert params["privacy.level"] == "example" and params["privacy.epsilon"] == "5.0"
    assert set(params) == set(flat_keys(read_json(out / "config.json")))  # the whole config, dotted

    expected = expected_series(rows)
    assert mlflow_series(client, run, expected) == expected  # exact: MLflow keeps doubles
    assert_epsilon_grows(expected["epsilon"])
    metrics = run.data.metrics
    assert metrics["summary/epsilon"] == summary["epsilon"]
    assert metrics["summary/rounds_completed"] == ROUNDS
    assert metrics["summary/global_test_accuracy"] == summary["global_test_accuracy"]
    assert not any(key.startswith("summary/epsilon_per_client") for key in metrics)  # lists: rows only


def flat_keys(tree, prefix=""):
    keys = []
    for key, value in tree.items():
        keys += flat_keys(value, f"{prefix}{key}.") if isinstance(value, dict) and value else [f"{prefix}{key}"]
    return keys


def test_resumed_run_continues_the_same_tensorboard_folder_and_mlflow_run(tmp_path):
    uri, out = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "run"
    config = dp_config(tensorboard=True, mlflow_uri=uri)
    # killed once round 4's row is written, before the trackers (called after) log it and before
    # its checkpoint: they hold rounds 1..3, the checkpoint round 2
    with pytest.raises(Killed):
        Simulation.from_config(config, [KillAfterRound(4)]).run(out)
    client, crashed = mlflow_run(uri, out)
    assert crashed.info.status == "FAILED"  # the crash ended the MLflow run instead of leaving it RUNNING
    assert [step for step, _ in tensorboard_series(out)[0]["epsilon"]] == [1, 2, 3]

    Simulation.from_config(config).run(out, resume=True)  # rounds 3 and 4 again
    rows = rows_of(out)
    assert [r["round"] for r in rows] == [1, 2, 3, 4]

    scalars, config_text = tensorboard_series(out)
    assert scalars == as_float32(expected_series(rows))  # round 3 of the crashed session purged
    assert len(config_text) == 1

    _, run = mlflow_run(uri, out)
    assert run.info.run_id == crashed.info.run_id and run.info.status == "FINISHED"
    assert len(client.search_runs([run.info.experiment_id])) == 1
    # round 3 kept from the first session (recomputed identically: only its wall clock differs)
    expected = expected_series(rows, skip=WALL_CLOCK_KEYS)
    assert mlflow_series(client, run, expected) == expected
    assert [step for step, _ in mlflow_series(client, run, ["elapsed_s"])["elapsed_s"]] == [1, 2, 3, 4]
    assert_epsilon_grows(expected["epsilon"])

    # resuming the finished run again (it only re-scores) logs nothing twice
    Simulation.from_config(config).run(out, resume=True)
    assert tensorboard_series(out)[0] == scalars
    assert mlflow_series(client, run, expected) == expected
    assert len(client.get_metric_history(run.info.run_id, "summary/epsilon")) == 1
    assert client.get_run(run.info.run_id).info.status == "FINISHED"


@pytest.mark.parametrize("key, value, module", [
    ("tensorboard", True, "torch.utils.tensorboard"),
    ("mlflow_uri", "sqlite:///mlflow.db", "mlflow"),
])
def test_a_missing_library_is_a_one_line_error_before_any_work(tmp_path, capsys, monkeypatch, key, value, module):
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=rf"^log.{key} needs .*: pip install 'fedveil\[tracking\]'$"):
        Simulation.from_config(tiny_config(log={key: value}))

    setting = f"log.{key}={str(value).lower()}"

    code = main(["run", "model.name=linear", "data.num_clients=4", "clients_per_round=2", setting, "--out", "r", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith(f"fedveil: error: log.{key} needs ") and "fedveil[tracking]" in err
    assert not (tmp_path / "r").exists() and not (tmp_path / "mlflow.db").exists()


def test_a_bad_mlflow_uri_is_refused_before_the_run_directory_is_made(tmp_path):
    sim = Simulation.from_config(dp_config(mlflow_uri="nosuch://host"))
    with pytest.raises(ConfigError, match="log.mlflow_uri 'nosuch://host': .*unsupported URI"):
        sim.run(tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_cli_run_writes_tensorboard_events(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = main([
        "run", "model.name=linear", "data.num_clients=4", "clients_per_round=2", "federation.rounds=2",
        "log.tensorboard=true", "--out", "r", "--quiet",
    ])
    assert code == 0, capsys.readouterr().err
    scalars, _ = tensorboard_series(tmp_path / "r")
    assert scalars == as_float32(expected_series(rows_of(tmp_path / "r")))
    assert [step for step, _ in scalars["global_test_accuracy"]] == [1, 2]
