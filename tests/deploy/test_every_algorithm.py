"""Every registered algorithm runs deployed (server half and silos apart, every message
through the wire format) with the simulation's numbers; those deployment refuses say so in
one line. The list comes from the registry, so a new algorithm is covered when it registers."""
from __future__ import annotations

import warnings

import pytest
import torch

from fedveil.algorithms import ALGORITHMS
from fedveil.errors import ConfigError
from fedveil.runtime.recorder import MemoryRecorder
from fedveil.runtime.simulation import Simulation

from tests.deploy.test_loopback import deployed
from tests.runtime.tiny_runs import algorithm_sections, deploy_config

SECTIONS = {"federation": {"rounds": 2, "clients_per_round": 3}, "checkpoint": {"every": 1}}


@pytest.mark.parametrize("name", ALGORITHMS.names())
def test_deployed_equals_simulated(tmp_path, name):
    config = deploy_config(**algorithm_sections(name, SECTIONS))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if ALGORITHMS.get(name).has_setup:
            with pytest.raises(ConfigError, match="setup phase"):
                deployed(config, tmp_path / "fed")
            return
        simulated = MemoryRecorder()
        sim_summary = Simulation.from_config(config).record(simulated)
        server, transport = deployed(config, tmp_path / "fed")
        recorder = MemoryRecorder()
        summary = server.run(transport, recorder)
    assert [r.get("train_loss") for r in recorder.rows] == [r.get("train_loss") for r in simulated.rows]
    if simulated.model is not None:
        assert recorder.model.keys() == simulated.model.keys()
        for key in simulated.model:
            assert torch.equal(recorder.model[key], simulated.model[key]), key
    score = sim_summary["score"]
    for key in (f"personal_{score}_mean", f"global_client_{score}_mean"):
        assert summary.get(key) == sim_summary.get(key), key
