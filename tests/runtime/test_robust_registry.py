"""Robust aggregation against the registry: an algorithm whose messages carry a ``delta``
runs with a norm bound, and one whose messages carry none is refused in one line before
any work (it used to fail at the first aggregation)."""
from __future__ import annotations

import pytest

from fedveil.algorithms import ALGORITHMS
from fedveil.errors import ConfigError
from fedveil.runtime.simulation import Simulation

from tiny_runs import algorithm_sections, tiny_config

pytestmark = pytest.mark.usefixtures("skip_plots")


@pytest.mark.parametrize("name", ALGORITHMS.names())
def test_robust_aggregation_runs_or_is_refused_before_work(name):
    sections = algorithm_sections(name, {
        "algorithm": {"name": name}, "model": {"name": "mlp", "options": {"hidden": [8]}}, "data": {"num_clients": 4},
        "federation": {"rounds": 1, "clients_per_round": 2, "update_norm_bound": 0.5}, "checkpoint": {"every": 0},
    })
    config = tiny_config(**sections)
    if ALGORITHMS.get(name).delta_messages:
        summary = Simulation.from_config(config).record()
        assert summary["rounds"] == 1
    else:
        with pytest.raises(ConfigError, match="carry no update delta"):
            Simulation.from_config(config)
