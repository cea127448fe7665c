"""End to end over Flower on loopback: a SuperLink with TLS and node authentication, three
silos (a silo service and a SuperNode each, one per School silo), MR-MTL with silo-specific
DP; one silo is SIGKILLed mid-run. Then a stranger who reaches the SuperLink submits a
hostile app (``hostile_app/``) whose ClientApp tries to read the silos' rows. Where this
machine allows mount namespaces (root), the SuperNodes run where the silos' folder is empty,
as the deployment guide sets a silo machine up, and the hostile app must get nothing;
otherwise the test shows what the guide warns of: the app reads the files. Bounded in time:
every wait has a deadline, every process is stopped."""
from __future__ import annotations

import json
import shutil
import time
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr")

from fedveil.deploy import DeployedServer, Silo, prepare_silos  # noqa: E402
from fedveil.deploy.certificates import make_node_keys  # noqa: E402
from fedveil.deploy.flower_project import write_flower_app  # noqa: E402
from fedveil.deploy.local_federation import LocalFederation, can_hide_folders  # noqa: E402
from fedveil.deploy.loopback import LoopbackTransport  # noqa: E402
from fedveil.deploy.silo_data import read_federation, silo_folder  # noqa: E402
from fedveil.runtime.recorder import MemoryRecorder  # noqa: E402
from fedveil.runtime.run_dir import read_metrics  # noqa: E402
from fedveil.runtime.simulation import Simulation  # noqa: E402

from tests.runtime.tiny_runs import deploy_config, write_school  # noqa: E402

KILLED = 2
HOSTILE_APP = Path(__file__).parent / "hostile_app"
HIDE_SILOS = can_hide_folders()


def school_config(root: Path):
    return deploy_config(
        data={"name": "school", "root": str(root), "download": False, "num_clients": 3, "partition": {"name": "natural", "key": "school"}},
        model={"name": "linear"}, algorithm={"name": "mr_mtl", "lam": 0.1}, client={"lr": 0.05, "batch_size": 8},
        federation={"rounds": 3, "clients_per_round": 3}, eval={"every": 3}, checkpoint={"every": 1},
        privacy={"level": "example", "client_epsilons": [2.0, 4.0, 8.0], "delta": 1e-4, "clip": 1.0},
    )


def wait_for_rows(path: Path, count: int, timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = read_metrics(path)  # a line the server is still writing is not read yet
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
    shared = {k: {"share_metrics": True} for k in range(3)}  # the silos opt in to sending loss and scores
    report = tmp_path / "hostile.json"
    with LocalFederation(tmp_path / "fed", 3, silo_root=tmp_path / "silos", silo_options=shared, hide_silos=HIDE_SILOS) as fed:
        fed.start(timeout=120)
        # a node whose key is not registered is refused and gives up
        intruder, _ = make_node_keys(tmp_path / "intruder", "intruder")
        refused = fed.start_silo(9, key=intruder, with_service=False)
        assert refused.wait(timeout=120) == 1
        assert "Failed to activate SuperNode" in fed.log("silo-9").read_text()
        run_id = fed.submit(app)
        wait_for_rows(server_out / "metrics.jsonl", 1, timeout=300)
        fed.kill_silo(KILLED)
        status = fed.wait(run_id, timeout=400)
        assert status == "finished:completed", fed.run_log(run_id)[-2000:]
        hostile = fed.submit(hostile_app(tmp_path / "hostile", config), {
            "report": str(report), "silo-root": str(tmp_path / "silos"), "nodes": 2,
        })
        assert fed.wait(hostile, timeout=200) == "finished:completed", fed.run_log(hostile)[-2000:]
    check_hostile_app(json.loads(report.read_text()), separated=HIDE_SILOS)

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


def hostile_app(folder: Path, config) -> Path:
    """The hostile app, carrying the genuine run's config (as anyone who sees the genuine app has it)."""
    shutil.copytree(HOSTILE_APP, folder)
    genuine = json.dumps(json.dumps(config.model_dump(mode="json"), sort_keys=True))  # a TOML basic string
    pyproject = folder / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('config = ""', f"config = {genuine}"))
    return folder


def check_hostile_app(found: list[dict], separated: bool) -> None:
    """The stranger's ClientApp ran on both living silos. The silo service gave it nothing
    beyond a silo id for the genuine config (which the server gets too). With the silo folder
    out of the SuperNode's sight it found no file; where the SuperNode sees it, it reads it."""
    assert len(found) == 2
    for node in found:
        if separated:
            assert node["list_silo_root"] == "got 0 items"
            assert set(node["read_rows"].values()) == {"FileNotFoundError"}
            assert set(node["read_key"].values()) == {"FileNotFoundError"}
        else:  # the guide's warning, shown: a SuperNode that sees the folder gives any app the rows
            assert all(v.startswith("got") for v in node["read_rows"].values())
        assert "unknown request 'dump'" in node["dump"]["refused"]
        assert node["own_config"]["refused"].startswith("this silo's folder was prepared for another config")
        assert node["genuine_config"]["reply"].keys() == {"silo"}  # no nonce asked, none signed
