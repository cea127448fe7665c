"""A deployed run (server half and silos in separate objects, every message through the
wire format) gives the simulation's numbers, and survives silo and server faults."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedveil.deploy import DeployedServer, Silo, prepare_silos
from fedveil.deploy.loopback import LoopbackTransport
from fedveil.deploy.silo_data import read_federation, silo_folder
from fedveil.runtime.recorder import DirectoryRecorder, MemoryRecorder
from fedveil.runtime.simulation import Simulation

from tests.runtime.tiny_runs import deploy_config

DP = {"level": "example", "epsilon": 3.0, "delta": 1e-5, "clip": 1.0}
# the silos share their metrics (share=True below); the simulation keeps its un-noised ones to compare
MR_MTL = dict(algorithm={"name": "mr_mtl", "lam": 0.1}, federation={"rounds": 4, "clients_per_round": 3},
              checkpoint={"every": 1}, privacy={**DP, "keep_unnoised": True})


def deployed(config, where: Path, faults=None, share=True):
    prepare_silos(config, where)
    shape, _ = read_federation(where)
    silos = {cid: Silo.from_folder(config, silo_folder(where, cid), share_metrics=share) for cid in range(shape.num_clients)}
    return DeployedServer(config, shape), LoopbackTransport(silos, faults or {})


def simulate(config):
    recorder = MemoryRecorder()
    summary = Simulation.from_config(config).record(recorder)
    return summary, recorder


def assert_same_params(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.filterwarnings("ignore:privacy.secure_rng is false")
def test_mr_mtl_with_silo_dp_deployed_equals_the_simulation(tmp_path):
    config = deploy_config(**MR_MTL)
    sim_summary, sim = simulate(config)
    server, transport = deployed(config, tmp_path / "fed")
    recorder = MemoryRecorder()
    summary = server.run(transport, recorder)
    assert_same_params(recorder.model, sim.model)
    for ours, theirs in zip(recorder.rows, sim.rows):
        assert ours["train_loss"] == theirs["train_loss"]
        assert ours["epsilon_per_client"] == theirs["epsilon_per_client"]
    for key in ("personal_accuracy_mean", "personal_accuracy_worst10", "global_client_accuracy_weighted_mean"):
        assert summary[key] == sim_summary[key], key
    assert summary["epsilon_per_client"] == sim_summary["epsilon_per_client"]
    assert 0 < summary["epsilon"] <= 3.0 * (1 + 1e-6)
    assert summary["deployment"] == {"transport": "loopback", "dropped": {}, "quarantined": {}}
    assert [r["survivors"] for r in recorder.rows] == [3, 3, 3, 3]
    assert len({round(e, 6) for e in summary["epsilon_per_client"]}) > 1  # silos spend what their own plan says


@pytest.mark.filterwarnings("ignore:privacy.secure_rng is false")
def test_a_silo_lost_mid_round_is_dropped_and_keeps_its_spend(tmp_path):
    config = deploy_config(algorithm={"name": "fedavg"}, federation={"rounds": 2, "clients_per_round": 3}, privacy=DP)
    cohort = [int(c) for c in Simulation.from_config(config).schedule[1]]
    lost, down = cohort[0], cohort[1]
    server, transport = deployed(config, tmp_path / "fed", {(1, lost): "lost", (1, down): "crash"})
    recorder = MemoryRecorder()
    summary = server.run(transport, recorder)
    assert recorder.rows[1]["survivors"] == 1
    assert recorder.rows[1]["dropped"] == {str(lost): "timeout", str(down): "silo crashed"}
    # the aggregate is FedAvg over the one survivor: its sample-weighted mean of one message
    survivor = cohort[2]
    planned = [p for kind, r, cid, p in transport.log if kind == "train" and r == 1 and cid == survivor][0]
    from fedveil.deploy.wire import unpack

    start = unpack(*planned)["server"]["params"]
    delta = unpack(*transport.silos[survivor].train(1, *planned))["message"]["delta"]
    for k, v in recorder.model.items():
        assert torch.allclose(v, start[k] + delta[k], atol=1e-7), k
    # the lost silo trained and spent; the crashed one did not train in round 2
    spent_lost = transport.silos[lost].epsilon()
    spent_down = transport.silos[down].epsilon()
    round_one = 1 if lost in [int(c) for c in server.schedule[0]] else 0
    assert spent_lost > 0
    assert transport.silos[lost].planned_epsilon_through(1) == pytest.approx(spent_lost, rel=1e-9)
    if down not in [int(c) for c in server.schedule[0]]:
        assert spent_down == 0.0
    assert summary["deployment"]["dropped"] == {"2": {str(lost): "timeout", str(down): "silo crashed"}}
    del round_one


class Killed(RuntimeError):
    pass


@pytest.mark.filterwarnings("ignore:privacy.secure_rng is false")
def test_a_killed_server_and_a_restarted_silo_resume_to_the_same_numbers(tmp_path):
    config = deploy_config(**MR_MTL)
    _, sim = simulate(config)
    server, transport = deployed(config, tmp_path / "fed")

    def kill_after_round_two(row):
        if row["round"] == 2:
            raise Killed

    server.on_round.append(kill_after_round_two)
    out = tmp_path / "server"
    with pytest.raises(Killed):
        server.run(transport, DirectoryRecorder.open(out, server.config_dict))
    # every silo process restarts from its folder, the server from its run directory
    shape, _ = read_federation(tmp_path / "fed")
    silos = {cid: Silo.from_folder(config, silo_folder(tmp_path / "fed", cid), share_metrics=True) for cid in transport.silos}
    server.on_round.clear()
    recorder = DirectoryRecorder.open(out, server.config_dict, resume=True)
    summary = server.run(LoopbackTransport(silos), recorder)
    final = torch.load(out / "model.pt", weights_only=True)
    assert_same_params(final, sim.model)
    # killed before round 2's checkpoint: the resumed server asks round 2 again, the silos that
    # answered it send the same reply from their folders, and no spend is counted twice
    assert summary["epsilon_per_client"] == [sim.summary["epsilon_per_client"][c] for c in range(5)]


@pytest.mark.filterwarnings("ignore:privacy.secure_rng is false")
def test_the_same_request_twice_gets_the_same_reply_and_costs_nothing(tmp_path):
    config = deploy_config(**MR_MTL)
    server, transport = deployed(config, tmp_path / "fed")
    cid = int(server.schedule[0][0])
    from fedveil.deploy import wire

    request = wire.pack({"round": 0, "client": cid, "server": server.algorithm.configure_round(
        server.algorithm.init_server(server.init), [cid], 0)})
    silo = transport.silos[cid]
    first = silo.train(0, *request)
    spent = silo.epsilon()
    again = Silo.from_folder(config, silo_folder(tmp_path / "fed", cid)).train(0, *request)
    assert first[1] == again[1] and all(torch.equal(first[0][k], again[0][k]) for k in first[0])
    assert Silo.from_folder(config, silo_folder(tmp_path / "fed", cid)).epsilon() == spent > 0


def test_a_silo_refuses_a_config_it_was_not_prepared_for(tmp_path):
    config = deploy_config(**MR_MTL)
    prepare_silos(config, tmp_path / "fed")
    greedy = deploy_config(**{**MR_MTL, "privacy": {**DP, "epsilon": 30.0}})
    from fedveil.deploy.silo_data import SiloDataError

    with pytest.raises(SiloDataError, match="prepared for another config"):
        Silo.from_folder(greedy, silo_folder(tmp_path / "fed", 0))


@pytest.mark.filterwarnings("ignore:privacy.secure_rng is false")
def test_under_dp_a_silo_sends_no_loss_or_score_unless_it_opts_in(tmp_path):
    config = deploy_config(**{**MR_MTL, "federation": {"rounds": 1, "clients_per_round": 3}})
    server, transport = deployed(config, tmp_path / "fed", share=None)
    recorder = MemoryRecorder()
    summary = server.run(transport, recorder)
    assert "train_loss" not in recorder.rows[0] and not any(k.startswith(("personal_", "global_client")) for k in summary)
    from fedveil.deploy.wire import unpack

    for kind, _, _, request in transport.log:
        assert set(unpack(*request)) <= {"round", "client", "server"}
    reply = unpack(*transport.silos[0].evaluate(0, *transport.log[-1][3]))
    assert set(reply) == {"client", "num_train", "num_test", "epsilon"}
