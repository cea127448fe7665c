"""A silo's identity is bound to its key (issue 34, item 2): a node that claims a silo id
without that silo's private key gets none of its requests, whatever its folder says."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("flwr")

from fedveil.deploy import prepare_silos  # noqa: E402
from fedveil.deploy.flower_app import FlowerTransport  # noqa: E402
from fedveil.deploy.silo_data import read_silo_keys, silo_folder  # noqa: E402
from fedveil.deploy.silo_identity import load_silo_key, sign_claim, verify_claim  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ed25519  # noqa: E402

from tests.runtime.tiny_runs import deploy_config  # noqa: E402


class FakeGrid:
    """The two Grid calls discovery makes; ``nodes`` maps a node id to how it answers a nonce."""

    def __init__(self, nodes):
        self.nodes = nodes
        self.sent = []

    def get_node_ids(self):
        return list(self.nodes)

    def send_and_receive(self, messages, timeout):
        replies = []
        for m in messages:
            node, nonce = m.metadata.dst_node_id, str(m.content["meta"]["nonce"])
            self.sent.append(node)
            meta = self.nodes[node](nonce, node)
            replies.append(SimpleNamespace(has_error=lambda: False, content={"meta": meta},
                                           metadata=SimpleNamespace(src_node_id=node)))
        return replies


def plain_message(content, dst_node_id, kind):
    """Flower's Message needs a running app; discovery only sets its content and destination."""
    return SimpleNamespace(content=content, metadata=SimpleNamespace(dst_node_id=dst_node_id, message_type=kind))


@pytest.fixture(autouse=True)
def outside_flower(monkeypatch):
    import fedveil.deploy.flower_app as flower_app

    monkeypatch.setattr(flower_app, "Message", plain_message)


def genuine(folder, cid):
    key = load_silo_key(folder)
    return lambda nonce, node: {"silo": cid, "signature": sign_claim(key, nonce, cid, node)}


def test_a_node_claiming_a_silo_without_its_key_is_refused_and_the_genuine_node_is_mapped(tmp_path):
    prepare_silos(deploy_config(data={"num_clients": 3}, federation={"clients_per_round": 3}), tmp_path / "fed")
    keys = read_silo_keys(tmp_path / "fed")
    assert sorted(keys) == [0, 1, 2] and len(set(keys.values())) == 3
    stolen_signature = {}

    def forged_no_key(nonce, node):  # a folder copied from silo 0, without its key
        return {"silo": 0}

    def forged_other_key(nonce, node):  # a key of its own
        return {"silo": 0, "signature": sign_claim(ed25519.Ed25519PrivateKey.generate(), nonce, 0, node)}

    def replaying(nonce, node):  # replays what silo 0 signed for another nonce and node
        return {"silo": 0, "signature": stolen_signature["sig"]}

    silo0 = genuine(silo_folder(tmp_path / "fed", 0), 0)
    stolen_signature["sig"] = silo0("an-old-nonce", 11)["signature"]
    # the forgers answer first: without keys, node 99 would have been mapped to silo 0
    nodes = {99: forged_no_key, 98: forged_other_key, 97: replaying, 11: silo0,
             21: genuine(silo_folder(tmp_path / "fed", 1), 1), 22: genuine(silo_folder(tmp_path / "fed", 2), 2)}
    transport = FlowerTransport(FakeGrid(nodes), 3, timeout=1.0, wait_for=0.0, silo_keys=keys)
    assert transport.node_of == {0: 11, 1: 21, 2: 22}
    assert set(transport.refused) == {99, 98, 97}
    assert all("without its key" in why for why in transport.refused.values())


def test_signatures_bind_nonce_silo_and_node(tmp_path):
    prepare_silos(deploy_config(data={"num_clients": 2}, federation={"clients_per_round": 2}), tmp_path / "fed")
    key, public = load_silo_key(silo_folder(tmp_path / "fed", 1)), read_silo_keys(tmp_path / "fed")[1]
    signature = sign_claim(key, "n1", 1, 7)
    assert verify_claim(public, signature, "n1", 1, 7)
    assert not verify_claim(public, signature, "n2", 1, 7)  # another nonce
    assert not verify_claim(public, signature, "n1", 0, 7)  # another silo
    assert not verify_claim(public, signature, "n1", 1, 8)  # another node
    assert not verify_claim(public, "zz", "n1", 1, 7)  # garbage
    assert oct((silo_folder(tmp_path / "fed", 1) / "silo_identity.key").stat().st_mode & 0o777) == "0o600"


class FlakyGrid(FakeGrid):
    """A grid whose node 21 is listed offline for the first ``offline_polls`` listings after discovery."""

    def __init__(self, nodes, offline_polls):
        super().__init__(nodes)
        self.offline_polls, self.listings = offline_polls, 0

    def get_node_ids(self):
        self.listings += 1
        if 1 < self.listings <= 1 + self.offline_polls:
            return [n for n in self.nodes if n != 21]
        return list(self.nodes)


def test_a_silo_listed_offline_for_a_moment_after_answering_is_waited_for(tmp_path, monkeypatch):
    """After a SuperLink restart Flower lists a node offline until its next heartbeat; a silo
    that has just answered is waited for (the resumed run over Flower lost it otherwise),
    one that failed its last request is not."""
    import fedveil.deploy.flower_app as flower_app

    monkeypatch.setattr(flower_app, "POLL_S", 0.0)
    prepare_silos(deploy_config(data={"num_clients": 2}, federation={"clients_per_round": 2}), tmp_path / "fed")
    keys = read_silo_keys(tmp_path / "fed")
    nodes = {11: genuine(silo_folder(tmp_path / "fed", 0), 0), 21: genuine(silo_folder(tmp_path / "fed", 1), 1)}
    grid = FlakyGrid(nodes, offline_polls=5)
    transport = FlowerTransport(grid, 2, timeout=5.0, wait_for=0.0, silo_keys=keys)
    assert transport.reachable() == [0, 1] and grid.listings == 7  # listed offline 5 times, then back
    transport.answered_last.discard(1)  # silo 1 failed its last request: no waiting for it
    grid.listings, grid.offline_polls = 1, 10**9
    assert transport.reachable() == [0] and grid.listings == 2


def test_a_silo_whose_node_was_offline_at_discovery_is_found_before_a_later_round(tmp_path):
    """A resumed run once lost a silo for good: its node was listed offline while the server
    looked for its silos, and it was never looked for again."""
    prepare_silos(deploy_config(data={"num_clients": 2}, federation={"clients_per_round": 2}), tmp_path / "fed")
    keys = read_silo_keys(tmp_path / "fed")
    nodes = {11: genuine(silo_folder(tmp_path / "fed", 0), 0), 21: genuine(silo_folder(tmp_path / "fed", 1), 1)}
    grid = FakeGrid(nodes)
    late = nodes.pop(21)
    transport = FlowerTransport(grid, 2, timeout=1.0, wait_for=0.0, silo_keys=keys)
    assert transport.node_of == {0: 11}
    nodes[21] = late  # back online
    assert transport.reachable() == [0, 1] and transport.node_of == {0: 11, 1: 21}
