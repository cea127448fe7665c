"""Resume without cascade (issue 34, item 5): the server is killed after silos answered
rounds past its last checkpoint, and on resume a silo that had missed one of those rounds
answers it fresh, so the aggregate and every later request change. Every silo that
answered a round replays its reply, so no silo trains a round twice, no ledger goes above
its plan, and every honest silo is in every round."""
from __future__ import annotations

import pytest

from fedveil.deploy.loopback import LoopbackTransport
from fedveil.runtime.recorder import DirectoryRecorder

from tests.deploy.test_loopback import deployed
from tests.runtime.tiny_runs import deploy_config

DP = {"level": "example", "epsilon": 3.0, "delta": 1e-5, "clip": 1.0}
CONFIG = dict(algorithm={"name": "mr_mtl", "lam": 0.1}, federation={"rounds": 5, "clients_per_round": 5},
              checkpoint={"every": 2}, privacy=DP)
MISSING = 3  # the silo that is down in round 3 before the kill


class Killed(RuntimeError):
    pass


def kill_after(round_number):
    def hook(row):
        if row["round"] == round_number:
            raise Killed

    return hook


@pytest.mark.filterwarnings("ignore:privacy.secure_rng is false", "ignore:silo .* asked again")
def test_a_resumed_server_whose_aggregate_changed_keeps_every_honest_silo(tmp_path):
    config = deploy_config(**CONFIG)
    server, transport = deployed(config, tmp_path / "fed", {(2, MISSING): "down"})
    server.on_round.append(kill_after(4))  # rounds 3 and 4 answered, the last checkpoint is round 2's
    out = tmp_path / "server"
    with pytest.raises(Killed):
        server.run(transport, DirectoryRecorder.open(out, server.config_dict))
    spent_before = {cid: silo.epsilon() for cid, silo in transport.silos.items()}

    server.on_round.clear()
    summary = server.run(LoopbackTransport(transport.silos), DirectoryRecorder.open(out, server.config_dict, resume=True))
    rows = [r for r in DirectoryRecorder.open(out, server.config_dict, resume=True).rows_through(5)]
    assert [r["survivors"] for r in rows] == [5, 5, 5, 5, 5]  # the missing silo answered round 3 after the resume
    assert not any(r.get("dropped") for r in rows)
    for cid, silo in transport.silos.items():
        assert silo.epsilon() <= silo.planned_epsilon_through(4) * (1 + 1e-9)  # no round trained twice
        assert silo.epsilon() >= spent_before[cid]
    assert summary["deployment"]["quarantined"] == {}
