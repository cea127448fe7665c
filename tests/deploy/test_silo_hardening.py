"""A silo's defences (issue 34, items 4 and 6), in process over the loopback transport:
its files are its own (created 0600 in folders created 0700, keys too), it learns no other
silo's row count, and it refuses a request whose numbers are not all finite before it
trains or spends anything."""
from __future__ import annotations

import contextlib
import math
import os
import stat
from pathlib import Path

import pytest
import torch

from fedveil.deploy import Silo, SiloRefused, wire
from fedveil.deploy.loopback import LoopbackTransport
from fedveil.deploy.silo import LEDGER_FILE
from fedveil.deploy.silo_data import silo_folder
from fedveil.runtime.recorder import MemoryRecorder

from tests.deploy.test_loopback import DP, MR_MTL, assert_same_params, deployed, simulate
from tests.runtime.tiny_runs import deploy_config

pytestmark = pytest.mark.filterwarnings("ignore:privacy.secure_rng is false")


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode) & 0o777


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def no_chmod(monkeypatch):
    """Make every chmod a no-op: what is left is the mode files and folders were created with."""
    monkeypatch.setattr(os, "chmod", lambda *a, **k: None)
    monkeypatch.setattr(os, "fchmod", lambda *a, **k: None)


def modes_under(root: Path) -> tuple[dict[str, int], dict[str, int]]:
    """(folders, files) under ``root``, ``root`` included, each with its permission bits."""
    folders, files = {".": mode(root)}, {}
    for where, dirs, names in os.walk(root):
        for d in dirs:
            folders[str((Path(where) / d).relative_to(root))] = mode(Path(where) / d)
        for n in names:
            files[str((Path(where) / n).relative_to(root))] = mode(Path(where) / n)
    return folders, files


# (umask, chmod allowed): a usual umask and a permissive one with chmod disabled (so only the
# creation mode counts), and a strict one that takes owner bits (the helper adds them back)
UMASKS = [(0o022, False), (0o000, False), (0o277, True)]
UMASK_IDS = ["umask-022-no-chmod", "umask-000-no-chmod", "umask-277"]


@pytest.mark.parametrize("mask, chmod", UMASKS, ids=UMASK_IDS)
def test_a_silos_rows_ledger_states_and_round_records_are_0600_in_0700_folders(tmp_path, monkeypatch, mask, chmod):
    config = deploy_config(**{**MR_MTL, "federation": {"rounds": 1, "clients_per_round": 3}})
    if not chmod:
        no_chmod(monkeypatch)
    with umask(mask):
        server, transport = deployed(config, tmp_path / "fed")
        server.run(transport, MemoryRecorder())
    fed = tmp_path / "fed"
    trained = {int(c) for c in server.schedule[0]}
    for cid in transport.silos:
        folders, files = modes_under(silo_folder(fed, cid))
        assert {"silo.pt", "federation.json"} <= set(files)
        if cid in trained:  # it trained: its ledger and round record are there too
            assert {"state/" + LEDGER_FILE, "state/round-0.pt"} <= set(files)
        assert "state" in folders
        assert all(m == 0o700 for m in folders.values()), folders
        assert all(m == 0o600 for m in files.values()), files
    assert mode(fed) == 0o700 and mode(fed / "federation.json") == 0o600
    assert not any(name.endswith(".tmp") for _, _, names in os.walk(fed) for name in names)


@pytest.mark.parametrize("mask, chmod", UMASKS, ids=UMASK_IDS)
def test_private_keys_are_created_0600_in_0700_folders(tmp_path, monkeypatch, mask, chmod):
    pytest.importorskip("cryptography")
    from fedveil.deploy.certificates import make_node_keys, make_tls_files

    if not chmod:
        no_chmod(monkeypatch)
    with umask(mask):
        tls = make_tls_files(tmp_path / "certs", ["127.0.0.1"])
        private, public = make_node_keys(tmp_path / "keys", "node-0")
        (tmp_path / "keys" / "node-1").write_bytes(b"an old key, written with the umask's mode")
        again, _ = make_node_keys(tmp_path / "keys", "node-1")  # replacing a key gives a 0600 one
    for key in (tls["ca.key"], tls["server.key"], private, again):
        assert mode(key) == 0o600, key
    assert mode(tmp_path / "certs") == mode(tmp_path / "keys") == 0o700
    assert public.read_text().startswith("ecdsa-sha2-nistp384 ")
    assert again.read_bytes().startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----")


def numbers(value, path=""):
    """Every non-tensor number in an unpacked message, with its path."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from numbers(v, f"{path}/{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from numbers(v, f"{path}/{i}")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield path, value


def test_no_silo_receives_another_silos_row_count(tmp_path):
    config = deploy_config(**MR_MTL)  # weighting = "samples": MR-MTL's weights are the row counts
    _, sim = simulate(config)
    server, transport = deployed(config, tmp_path / "fed")
    counts = {cid: silo.data.clients[0].num_train for cid, silo in transport.silos.items()}
    assert len(set(counts.values())) > 1
    received: list[tuple[str, int, int, dict]] = []
    for cid, silo in transport.silos.items():
        for kind in ("train", "evaluate"):
            def capture(round_idx, tensors, skeleton, _cid=cid, _kind=kind, _handler=getattr(silo, kind)):
                received.append((_kind, round_idx, _cid, wire.unpack(tensors, skeleton)))  # as the silo gets it
                return _handler(round_idx, tensors, skeleton)

            setattr(silo, kind, capture)
    recorder = MemoryRecorder()
    summary = server.run(transport, recorder)
    # the server still weighs the mean by every silo's count, and still matches the simulation
    assert_same_params(recorder.model, sim.model)
    assert summary["epsilon_per_client"] == sim.summary["epsilon_per_client"]
    assert [r["train_loss"] for r in recorder.rows] == [r["train_loss"] for r in sim.rows]
    assert sum(1 for kind, r, _, _ in received if kind == "train" and r >= 1) >= 3
    for kind, round_idx, cid, request in received:
        assert set(request["server"]) == {"params"}, (kind, round_idx, cid, sorted(request["server"]))
        others = {float(n) for c, n in counts.items() if c != cid}
        leaked = [(path, v) for path, v in numbers(request) if float(v) in others]
        assert not leaked, (kind, round_idx, cid, leaked)


def test_mr_mtl_keeps_the_weights_on_the_server():
    """The algorithm's side of the above: ``silo_view`` drops ``seen``, aggregation keeps it."""
    from fedveil.runtime.simulation import Simulation

    sim = Simulation.from_config(deploy_config(**MR_MTL))
    alg = sim.algorithm
    params = {"w": torch.zeros(2)}
    state = alg.aggregate(alg.init_server(params), [(0, {"delta": {"w": torch.ones(2)}, "weight": 7.0}),
                                                    (3, {"delta": {"w": torch.ones(2)}, "weight": 11.0})], 0)
    assert state["seen"] == {0: 7.0, 3: 11.0}
    assert set(alg.silo_view(state)) == {"params"} and alg.silo_view(state)["params"] is state["params"]
    assert "seen" in state  # the view is a copy: the server's state keeps the weights


def nan_request(server, cid: int, round_idx: int, bad: float) -> tuple[dict[str, torch.Tensor], str]:
    planned = server.algorithm.configure_round(server.algorithm.init_server(server.init), [cid], round_idx)
    params = {k: v.clone() for k, v in planned["params"].items()}
    key = sorted(params)[0]
    params[key].view(-1)[0] = bad
    return wire.pack({"round": round_idx, "client": cid, "server": {**planned, "params": params}})


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_request_with_a_non_finite_parameter_is_refused_before_training(tmp_path, bad):
    config = deploy_config(algorithm={"name": "mr_mtl", "lam": 0.1}, federation={"rounds": 2, "clients_per_round": 5},
                         privacy=DP)
    server, transport = deployed(config, tmp_path / "fed")
    cid = 1
    silo = transport.silos[cid]
    good = server.algorithm.configure_round(server.algorithm.init_server(server.init), [cid], 0)
    silo.train(0, *wire.pack({"round": 0, "client": cid, "server": good}))
    spent = silo.epsilon()
    assert spent > 0
    state = silo.state_dir
    ledger = (state / LEDGER_FILE).read_bytes()
    before = sorted(os.listdir(state))
    calls = []
    update = silo.algorithm.client_update
    silo.algorithm.client_update = lambda *a, **k: calls.append(a) or update(*a, **k)
    with pytest.raises(SiloRefused, match="non-finite") as refused:
        silo.train(1, *nan_request(server, cid, 1, bad))
    assert "\n" not in str(refused.value) and "nothing is trained" in str(refused.value)
    assert calls == []  # no training
    assert silo.epsilon() == spent  # nothing spent
    assert (state / LEDGER_FILE).read_bytes() == ledger and sorted(os.listdir(state)) == before
    assert Silo.from_folder(config, silo_folder(tmp_path / "fed", cid)).epsilon() == spent
    # over the transport, the server drops the silo with the reason and the round goes on
    reply = LoopbackTransport({cid: silo}).exchange("train", 1, {cid: nan_request(server, cid, 1, bad)})[cid]
    assert "non-finite" in reply.reason and calls == []
    # the refusal poisons nothing: the same round with finite numbers trains
    silo.train(1, *wire.pack({"round": 1, "client": cid, "server": good}))
    assert len(calls) == 1 and silo.epsilon() > spent


def test_non_finite_finds_tensors_and_floats():
    from fedveil.deploy.silo import non_finite

    assert non_finite({"server": {"params": {"a": torch.ones(3)}, "step": 2, "lr": 0.5}, "round": 1}) is None
    assert non_finite({"server": {"params": {"a": torch.tensor([1.0, math.nan])}}}) == "server/params/a"
    assert non_finite({"server": {"lr": math.inf}}) == "server/lr"
    assert non_finite({"server": {"order": torch.tensor([2, 0, 1])}}) is None  # integers are always finite
