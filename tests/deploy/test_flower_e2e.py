"""End to end over Flower on loopback: a SuperLink with TLS and node authentication, three
SuperNodes (one per School silo), MR-MTL with silo-specific DP; one silo is SIGKILLed
mid-run. Bounded in time: every wait has a deadline, every process is stopped."""
from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr")

from fedveil.deploy import DeployedServer, Silo, prepare_silos  # noqa: E402
from fedveil.deploy.certificates import make_node_keys  # noqa: E402
from fedveil.deploy.flower_project import write_flower_app  # noqa: E402
from fedveil.deploy.local_federation import LocalFederation  # noqa: E402
from fedveil.deploy.loopback import LoopbackTransport  # noqa: E402
from fedveil.deploy.silo_data import read_federation, silo_folder  # noqa: E402
from fedveil.runtime.recorder import MemoryRecorder  # noqa: E402
from fedveil.runtime.simulation import Simulation  # noqa: E402

from tests.runtime.tiny_runs import tiny_config, write_school  # noqa: E402

KILLED = 2


def school_config(root: Path):
    return tiny_config(
        data={"name": "school", "root": str(root), "download": False, "num_clients": 3, "partition": {"name": "natural", "key": "school"}},
        model={"name": "linear"}, algorithm={"name": "mr_mtl", "lam": 0.1}, client={"lr": 0.05, "batch_size": 8},
        federation={"rounds": 3, "clients_per_round": 3}, eval={"every": 3}, checkpoint={"every": 1},
        privacy={"level": "example", "client_epsilons": [2.0, 4.0, 8.0], "delta": 1e-4, "clip": 1.0},
    )


def wait_for_rows(path: Path, count: int, timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            if len(rows) >= count:
                return rows
        time.sleep(0.2)
    raise AssertionError(f"{path} has fewer than {count} rows after {timeout} s")


@pytest.mark.filterwarnings("ignore:privacy.secure_rng is false")
def test_mr_mtl_over_flower_with_tls_and_node_auth_survives_a_killed_silo(tmp_path):
    config = school_config(write_school(tmp_path / "data", sizes=(60, 50, 70)))
    prepare_silos(config, tmp_path / "silos")
    server_out = tmp_path / "server"
    app = write_flower_app(tmp_path / "app", config, tmp_path / "silos" / "federation.json", server_out, timeout=30)
    shared = {k: {"share-metrics": True} for k in range(3)}  # the silos opt in to sending loss and scores
    with LocalFederation(tmp_path / "fed", 3, silo_root=tmp_path / "silos", node_configs=shared) as fed:
        fed.start(timeout=120)
        # a node whose key is not registered is refused and gives up
        intruder, _ = make_node_keys(tmp_path / "intruder", "intruder")
        refused = fed.start_silo(9, key=intruder)
        assert refused.wait(timeout=120) == 1
        assert "Failed to activate SuperNode" in fed.log("silo-9").read_text()
        run_id = fed.submit(app)
        wait_for_rows(server_out / "metrics.jsonl", 1, timeout=300)
        fed.kill_silo(KILLED)
        status = fed.wait(run_id, timeout=400)
    assert status == "finished:completed", fed.run_log(run_id)[-2000:]

    rows = [json.loads(line) for line in (server_out / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((server_out / "summary.json").read_text())
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert rows[0]["survivors"] == 3 and "dropped" not in rows[0]
    assert str(KILLED) in rows[-1]["dropped"] and rows[-1]["survivors"] == 2
    assert summary["evaluated_silos"] == 2 and "personal_mse_mean" in summary

    # round 1 (nothing failed yet) is the simulation's round 1, number for number
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        simulated = MemoryRecorder()  # the simulation keeps the un-noised loss the silos opted to share
        research = config.model_copy(update={"privacy": config.privacy.model_copy(update={"keep_unnoised": True})})
        Simulation.from_config(research).record(simulated)
    assert rows[0]["train_loss"] == simulated.rows[0]["train_loss"]
    assert rows[0]["epsilon_per_client"] == simulated.rows[0]["epsilon_per_client"]
    # every silo reports its own epsilon; the survivors spent their whole budgets, the killed one a round's worth
    spent = summary["epsilon_per_client"]
    assert spent[:2] == simulated.summary["epsilon_per_client"][:2]
    assert spent[0] == pytest.approx(2.0, rel=1e-4) and spent[1] == pytest.approx(4.0, rel=1e-4)
    assert 0 < spent[KILLED] == rows[0]["epsilon_per_client"][KILLED] < 8.0

    # the saved model is what the in-process transport gives with the same silos dropped in the same rounds
    faults = {(r["round"] - 1, int(cid)): "crash" for r in rows for cid in r.get("dropped", {})}
    replay = tmp_path / "replay"
    prepare_silos(config, replay)
    shape, _ = read_federation(replay)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        silos = {cid: Silo.from_folder(config, silo_folder(replay, cid)) for cid in range(3)}
        recorder = MemoryRecorder()
        DeployedServer(config, shape).run(LoopbackTransport(silos, faults), recorder)
    deployed = torch.load(server_out / "model.pt", weights_only=True)
    assert deployed.keys() == recorder.model.keys()
    assert all(torch.equal(deployed[k], recorder.model[k]) for k in deployed)
