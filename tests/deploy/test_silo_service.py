"""The silo service (issue 34 item 1; issue 35 item 3): the silo's own process answers only
the protocol's three requests over its socket, gives the same run as the in-process silos,
and refuses anything else with one line while it keeps serving."""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import socket
import stat
import threading
from pathlib import Path

import numpy as np
import pytest

from fedveil.deploy import DeployedServer, Failure, prepare_silos
from fedveil.deploy.silo_data import read_federation, read_silo_keys, silo_folder
from fedveil.deploy.silo_identity import new_nonce, verify_claim
from fedveil.deploy.silo_service import SiloService, arrays_to_blobs, blobs_to_arrays
from fedveil.deploy.silo_socket import MAGIC, SiloServiceError, call, recv_frame, send_frame
from fedveil.deploy import wire
from fedveil.runtime.recorder import MemoryRecorder

from tests.deploy.test_loopback import MR_MTL, assert_same_params, deployed
from tests.runtime.tiny_runs import deploy_config

pytestmark = pytest.mark.filterwarnings("ignore:privacy.secure_rng is false")


@contextlib.contextmanager
def serving(service: SiloService):
    ready, stop = threading.Event(), threading.Event()
    thread = threading.Thread(target=service.serve, kwargs={"ready": ready, "stop": stop}, daemon=True)
    thread.start()
    assert ready.wait(30)
    try:
        yield service
    finally:
        stop.set()
        thread.join(30)


class SocketTransport:
    """What the Flower ClientApp forwarder does, without Flower: each request to each silo's
    service as one frame, its reply back as a packed reply."""

    name = "socket"

    def __init__(self, sockets: dict[int, Path], config_json: str) -> None:
        self.sockets, self.config_json = sockets, config_json

    def reachable(self) -> list[int]:
        return sorted(self.sockets)

    def exchange(self, kind, round_idx, requests):
        out = {}
        for cid, (tensors, skeleton) in requests.items():
            described, blobs = arrays_to_blobs(wire.tensors_to_numpy(tensors))
            header = {"op": kind, "config": self.config_json, "node_id": cid,
                      "meta": {"skeleton": skeleton, "round": round_idx}, "arrays": described}
            try:
                reply, reply_blobs = call(str(self.sockets[cid]), header, blobs)
            except SiloServiceError as err:
                out[cid] = Failure(str(err))
                continue
            arrays = blobs_to_arrays(reply["arrays"], reply_blobs)
            out[cid] = (wire.tensors_from_numpy(arrays), reply["meta"]["skeleton"])
        return out


def config_json(config) -> str:
    return json.dumps(config.model_dump(mode="json"), sort_keys=True)


def run_through_services(config, shape, services: list[SiloService]) -> tuple[dict, MemoryRecorder]:
    """The deployed server's run of ``config`` with every silo behind its service's socket."""
    with contextlib.ExitStack() as stack:
        for service in services:
            stack.enter_context(serving(service))
        transport = SocketTransport({k: s.socket_path for k, s in enumerate(services)}, config_json(config))
        recorder = MemoryRecorder()
        summary = DeployedServer(config, shape).run(transport, recorder)
    return summary, recorder


def services_for(folder: Path, sockets: Path, count: int) -> list[SiloService]:
    return [SiloService(silo_folder(folder, k), sockets / f"s{k}.sock", share_metrics=True) for k in range(count)]


def test_a_run_through_the_silo_services_equals_the_in_process_silos(tmp_path):
    config = deploy_config(**MR_MTL)
    server, loopback = deployed(config, tmp_path / "inproc")
    expected = MemoryRecorder()
    server.run(loopback, expected)

    prepare_silos(config, tmp_path / "fed")
    shape, _ = read_federation(tmp_path / "fed")
    services = services_for(tmp_path / "fed", tmp_path, shape.num_clients)
    summary, recorder = run_through_services(config, shape, services)
    assert_same_params(recorder.model, expected.model)
    assert [r["train_loss"] for r in recorder.rows] == [r["train_loss"] for r in expected.rows]
    assert summary["deployment"]["quarantined"] == {} and summary["deployment"]["dropped"] == {}
    assert not services[0].socket_path.exists()  # removed when the service stops


@pytest.mark.skipif(importlib.util.find_spec("Crypto") is None, reason="secure aggregation needs pycryptodome")
def test_secure_aggregation_through_the_silo_services_equals_the_in_process_silos(tmp_path):
    from tests.deploy.test_secure_aggregation import deploy, secure_config

    config = secure_config(federation={"rounds": 2, "clients_per_round": 5})
    _, expected, _ = deploy(config, tmp_path / "inproc")
    prepare_silos(config, tmp_path / "fed")
    shape, _ = read_federation(tmp_path / "fed")
    _, recorder = run_through_services(config, shape, services_for(tmp_path / "fed", tmp_path, shape.num_clients))
    assert [r["survivors"] for r in recorder.rows] == [5, 5]
    assert_same_params(recorder.model, expected.model)


def raw_request(path: Path, data: bytes) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(path))
        conn.sendall(data)
        return recv_frame(conn)[0]


def npy(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def test_anything_but_the_protocol_is_refused_in_one_line_and_the_service_keeps_serving(tmp_path):
    config = deploy_config(**MR_MTL)
    prepare_silos(config, tmp_path / "fed")
    genuine = config_json(config)
    service = SiloService(silo_folder(tmp_path / "fed", 0), tmp_path / "s.sock", max_bytes=1 << 20)
    path = str(service.socket_path)
    train_meta = {"skeleton": "{}", "round": 0}
    refusals = {
        "unknown request 'dump'": ({"op": "dump", "config": genuine, "meta": {}}, []),
        "no run config": ({"op": "query", "meta": {}}, []),
        "not a valid fedveil config": ({"op": "query", "config": "{not json", "meta": {}}, []),
        "prepared for another config": ({"op": "query", "config": config_json(config.model_copy(update={"seed": 7})), "meta": {}}, []),
        "round number >= 0": ({"op": "train", "config": genuine, "meta": {"skeleton": "{}", "round": -1}, "arrays": []}, []),
        "Object arrays cannot be loaded": ({"op": "train", "config": genuine, "meta": train_meta,  # a pickle: never loaded
                                            "arrays": [{"key": "x", "stype": "numpy.ndarray"}]}, [npy(np.array([{"a": 1}], dtype=object))]),
        "only numbers cross": ({"op": "train", "config": genuine, "meta": train_meta,
                                "arrays": [{"key": "x", "stype": "numpy.ndarray"}]}, [npy(np.array(["rows"]))]),
        "does not match its blobs": ({"op": "train", "config": genuine, "meta": train_meta, "arrays": []}, [b"x"]),
        "more than the limit": ({"op": "train", "config": genuine, "meta": train_meta, "arrays": []}, [bytes(2 << 20)]),
    }
    with serving(service):
        for expected, (header, blobs) in refusals.items():
            with pytest.raises(SiloServiceError, match=expected) as caught:
                call(path, header, blobs)
            assert "\n" not in str(caught.value)
            assert str(tmp_path) not in str(caught.value)  # the caller does not learn where the silo's files are
        assert "bad magic" in raw_request(service.socket_path, b"GET / HTTP/1.1\r\n\r\n")["error"]
        assert "not JSON" in raw_request(service.socket_path, MAGIC + (5).to_bytes(4, "big") + b"{oops")["error"]
        # after all that, a genuine query is still answered
        assert call(path, {"op": "query", "config": genuine, "meta": {}})[0]["meta"] == {"silo": 0}
    assert not (silo_folder(tmp_path / "fed", 0) / "state" / "round-0.pt").exists()  # nothing was trained


def test_the_query_is_signed_with_the_silos_key_for_the_servers_nonce_and_node(tmp_path):
    config = deploy_config(**MR_MTL)
    prepare_silos(config, tmp_path / "fed")
    keys = read_silo_keys(tmp_path / "fed" / "federation.json")
    service = SiloService(silo_folder(tmp_path / "fed", 1), tmp_path / "s.sock")
    nonce = new_nonce()
    with serving(service):
        claim = call(str(service.socket_path), {"op": "query", "config": config_json(config), "meta": {"nonce": nonce}, "node_id": 42})[0]["meta"]
    assert claim["silo"] == 1
    assert verify_claim(keys[1], claim["signature"], nonce, 1, 42)
    assert not verify_claim(keys[1], claim["signature"], nonce, 1, 43)  # bound to the node that asked
    assert not verify_claim(keys[0], claim["signature"], nonce, 1, 42)


def test_a_plan_over_the_silos_max_epsilon_is_refused_at_the_query(tmp_path):
    config = deploy_config(**MR_MTL)
    prepare_silos(config, tmp_path / "fed")
    service = SiloService(silo_folder(tmp_path / "fed", 0), tmp_path / "s.sock", max_epsilon=1.0)
    with serving(service), pytest.raises(SiloServiceError, match=r"plan spends epsilon=3 > its max-epsilon 1.0"):
        call(str(service.socket_path), {"op": "query", "config": config_json(config), "meta": {}})


def test_the_socket_is_the_owners_alone_unless_a_group_is_given(tmp_path):
    config = deploy_config(**MR_MTL)
    prepare_silos(config, tmp_path / "fed")
    folder = silo_folder(tmp_path / "fed", 0)
    own = SiloService(folder, tmp_path / "own.sock").bind()
    shared = SiloService(folder, tmp_path / "group.sock", socket_group=os.getgid()).bind()
    try:
        assert stat.S_IMODE(os.stat(tmp_path / "own.sock").st_mode) == 0o600
        assert stat.S_IMODE(os.stat(tmp_path / "group.sock").st_mode) == 0o660
        assert os.stat(tmp_path / "group.sock").st_gid == os.getgid()
    finally:
        own.close()
        shared.close()
    # a stale socket left by a killed service is replaced; any other file is not touched
    SiloService(folder, tmp_path / "own.sock").bind().close()
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(Exception, match="is not a socket"):
        SiloService(folder, tmp_path / "notes.txt").bind()
    assert (tmp_path / "notes.txt").read_text() == "keep me"


def test_frames_round_trip_and_refuse_an_oversized_header(tmp_path):
    left, right = socket.socketpair()
    with left, right:
        send_frame(left, {"op": "x"}, [b"ab", b""])
        header, blobs = recv_frame(right)
        assert header == {"op": "x", "blobs": [2, 0]} and blobs == [b"ab", b""]
        left.sendall(MAGIC + (64 << 20).to_bytes(4, "big"))
        with pytest.raises(ValueError, match="header of 67108864 bytes exceeds"):
            recv_frame(right)
