"""A deployed run with ``records_per_person > 1`` reports the person-level epsilon the
simulation reports: each silo sends its own with its train reply, the server summarises."""
from __future__ import annotations

import pytest

from fedveil.privacy.person_level import EXACT
from fedveil.runtime.recorder import MemoryRecorder

from tests.deploy.test_loopback import DP, MR_MTL, deployed, simulate
from tests.runtime.tiny_runs import deploy_config


@pytest.mark.filterwarnings("ignore:privacy.secure_rng is false")
def test_a_deployed_run_reports_the_simulations_person_epsilon(tmp_path):
    config = deploy_config(**{**MR_MTL, "privacy": {**DP, "records_per_person": 2}})
    sim_summary, _ = simulate(config)
    server, transport = deployed(config, tmp_path / "fed")
    summary = server.run(transport, MemoryRecorder())
    for key in ("records_per_person", "person_epsilon", "person_epsilon_method", "person_epsilon_per_client"):
        assert summary[key] == sim_summary[key], key
    assert summary["person_epsilon_method"] == EXACT
    assert all(p > e for p, e in zip(summary["person_epsilon_per_client"], summary["epsilon_per_client"]))
