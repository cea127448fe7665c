"""Secure mode and resume (issue: privacy at the edges, item 4): a secure run checkpoints
its ledger before any round's row leaves the process, so a run killed between the
configured checkpoints never re-executes, with fresh noise, a round whose output was seen."""
from __future__ import annotations

import pytest

from fedveil.runtime import Simulation, run

from tiny_runs import KillAfterRound, Killed, load_checkpoint, rows_of, tiny_config, without_wall_clock

pytestmark = pytest.mark.usefixtures("skip_plots")

SECTIONS = {
    "federation": {"rounds": 5}, "checkpoint": {"every": 2},
    "privacy": {"level": "example", "noise_multiplier": 1.0, "secure_rng": True},
}


def test_a_secure_run_killed_between_checkpoints_resumes_after_its_last_seen_round(tmp_path):
    config = tiny_config(**SECTIONS)
    out = tmp_path / "run"
    with pytest.raises(Killed):
        Simulation.from_config(config, [KillAfterRound(3)]).run(out)
    seen = rows_of(out)
    assert [r["round"] for r in seen] == [1, 2, 3]
    assert load_checkpoint(out)["round"] == 3  # every round, not every 2: round 3's row left the process
    summary = run(config, out, resume=True, progress=False)
    rows = rows_of(out)
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5]
    assert without_wall_clock(rows[:3]) == without_wall_clock(seen)  # nothing re-executed with fresh noise
    # the ledger holds each round once: the epsilon of an uninterrupted secure run of the same plan
    assert summary["epsilon"] == pytest.approx(run(config, tmp_path / "whole", progress=False)["epsilon"], rel=1e-12)


def test_a_seeded_run_keeps_its_checkpoint_interval():
    config = tiny_config(**{**SECTIONS, "privacy": {**SECTIONS["privacy"], "secure_rng": False}})
    assert not Simulation.from_config(config).checkpoints_every_round
    assert Simulation.from_config(tiny_config(**SECTIONS)).checkpoints_every_round
