"""Every example config is valid (and the main job's noise schedule example plans its privacy)."""
from pathlib import Path

import pytest

from fedveil.config import load_config
from fedveil.runtime import Simulation

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.toml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_config_is_valid(path):
    load_config(str(path), [])


def test_schedule_example_plans_a_decaying_noise_within_budget():
    config = load_config(str(Path(__file__).parent.parent / "examples" / "dp_fedavg_schedule.toml"), [])
    sim = Simulation.from_config(config)
    shape = sim.privacy.shape
    assert shape[0] > shape[-1] == 1.0
    assert 0.99 * config.privacy.epsilon <= sim.privacy.planned_epsilon <= config.privacy.epsilon
