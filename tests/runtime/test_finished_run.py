"""A finished run read back: each client's personal model scores again exactly what the
run's last evaluation recorded, with the client states in memory or on disk."""
from __future__ import annotations

import json

import pytest
import torch

from fedveil.errors import ConfigError
from fedveil.runtime import Simulation, run
from fedveil.runtime.callbacks import Callback
from fedveil.runtime.evaluation import evaluate
from fedveil.runtime.finished_run import FinishedRun

from tiny_runs import tiny_config

MR_MTL = {"algorithm": {"name": "mr_mtl", "lam": 0.5}, "federation": {"rounds": 4, "clients_per_round": 3}}


@pytest.mark.parametrize("store", ["memory", "disk"])
def test_personal_models_score_what_the_run_recorded(tmp_path, store):
    config = tiny_config(algorithm=MR_MTL["algorithm"], federation={**MR_MTL["federation"], "client_state": store})
    run(config, tmp_path / "run", progress=False)
    recorded = json.loads((tmp_path / "run" / "client_metrics.json").read_text())
    finished = FinishedRun.load(tmp_path / "run")
    sim = finished.sim
    rescored = [evaluate(sim.trainer.model, finished.personal_params(cid), client.test, sim.data.task)["accuracy"]
                for cid, client in enumerate(sim.data.clients)]
    assert rescored == pytest.approx([row["personal_accuracy"] for row in recorded], abs=1e-12)
    assert len(set(rescored)) > 1  # five clients' own models, not one model five times
    saved = torch.load(tmp_path / "run" / "model.pt", weights_only=True)
    assert all(torch.equal(saved[k], v) for k, v in finished.global_params().items())


class StopAfter(Callback):
    def on_round_end(self, row):
        if row["round"] == 3:
            raise KeyboardInterrupt


def test_an_unfinished_or_model_less_run_is_refused_with_one_line(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        Simulation.from_config(tiny_config(**MR_MTL), [StopAfter()]).run(tmp_path / "stopped")
    with pytest.raises(ConfigError, match="stopped after round 2 of 4: resume it first"):
        FinishedRun.load(tmp_path / "stopped")
    with pytest.raises(ConfigError, match="no config.json"):
        FinishedRun.load(tmp_path / "nowhere")
    run(tiny_config(algorithm={"name": "local"}, federation={"rounds": 2}), tmp_path / "local", progress=False)
    with pytest.raises(ConfigError, match="'local' has no global model"):
        FinishedRun.load(tmp_path / "local").global_params()
    run(tiny_config(federation={"rounds": 2}), tmp_path / "fedavg", progress=False)
    with pytest.raises(ConfigError, match="'fedavg' has no personal models"):
        FinishedRun.load(tmp_path / "fedavg").personal_params(0)
