"""Resume without cascade over Flower (issue 34, item 5), under secure aggregation (issue
35, item 1): FedAvg with silo DP and masked updates; the SuperLink, with the ServerApp it
runs, is SIGKILLed mid-run and started again on its database; the SuperNodes come back by
themselves, the run is submitted again with ``resume=true``, and it finishes with every
silo in every round and the uninterrupted run's model: rounds the silos had already
answered are replayed (their stored update masked afresh for the new session), none is
trained twice."""
from __future__ import annotations

import importlib.util
import json
import warnings

import pytest
import torch

pytest.importorskip("flwr")

from fedveil.config import AlgorithmConfig, SecureAggregationConfig  # noqa: E402
from fedveil.deploy.flower_project import write_flower_app  # noqa: E402
from fedveil.deploy.local_federation import LocalFederation  # noqa: E402
from fedveil.deploy.silo import Silo  # noqa: E402
from fedveil.deploy.silo_data import silo_folder  # noqa: E402
from fedveil.runtime.recorder import MemoryRecorder  # noqa: E402

from tests.deploy.test_flower_e2e import school_config, wait_for_rows  # noqa: E402
from tests.deploy.test_loopback import deployed  # noqa: E402
from tests.runtime.tiny_runs import write_school  # noqa: E402

ROUNDS = 3


@pytest.mark.filterwarnings("ignore:privacy.secure_rng is false")
@pytest.mark.skipif(importlib.util.find_spec("Crypto") is None, reason="secure aggregation needs pycryptodome")
def test_a_killed_superlink_restarts_on_its_database_and_the_resumed_run_keeps_every_silo(tmp_path):
    config = school_config(write_school(tmp_path / "data", sizes=(60, 50, 70)))
    config = config.model_copy(update={
        "federation": config.federation.model_copy(update={"rounds": ROUNDS}),
        "algorithm": AlgorithmConfig(name="fedavg"),
        "secure_aggregation": SecureAggregationConfig(enabled=True, weight_scale=100.0),
    })
    from fedveil.deploy import prepare_silos

    prepare_silos(config, tmp_path / "silos")
    server_out = tmp_path / "server"
    # A SuperNode keeps retrying the killed run's pulls for about a minute after the restart (the link
    # answers 403 "Run is finished" only then), so the resumed run's stages wait well past that.
    app = write_flower_app(tmp_path / "app", config, tmp_path / "silos" / "federation.json", server_out, timeout=240)
    with LocalFederation(tmp_path / "fed", 3, silo_root=tmp_path / "silos") as fed:
        fed.start(timeout=120)
        fed.submit(app)
        wait_for_rows(server_out / "metrics.jsonl", 2, timeout=300)
        fed.restart_link()
        resumed = fed.submit(app, {"resume": True})
        status = fed.wait(resumed, timeout=900)
        log = fed.run_log(resumed)
    assert status == "finished:completed", log[-3000:]

    rows = [json.loads(line) for line in (server_out / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == list(range(1, ROUNDS + 1))
    assert [r["survivors"] for r in rows] == [3] * ROUNDS and not any(r.get("dropped") for r in rows), log[-3000:]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ledgers = {k: Silo.from_folder(config, silo_folder(tmp_path / "silos", k)) for k in range(3)}
        server, transport = deployed(config, tmp_path / "uninterrupted", share=False)
        recorder = MemoryRecorder()
        server.run(transport, recorder)
    for k, silo in ledgers.items():  # no round trained twice: each ledger is exactly the uninterrupted silo's
        assert silo.epsilon() == pytest.approx(transport.silos[k].epsilon(), rel=1e-12)
    deployed_model = torch.load(server_out / "model.pt", weights_only=True)
    assert all(torch.equal(deployed_model[k], recorder.model[k]) for k in recorder.model)
