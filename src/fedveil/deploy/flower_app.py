"""fedveil over Flower: the ServerApp running :class:`~fedveil.deploy.server.DeployedServer`
over Flower's SuperLink and SuperNodes (``pip install 'fedveil[flower]'``; docs/deployment.md
has the set-up). Its ClientApp is :mod:`.flower_client`, which forwards each message to the
silo's own service (:mod:`.silo_service`).

Messages: every request and reply is one Flower ``Message`` whose ``RecordDict`` holds
``arrays`` (an ``ArrayRecord``: the tensors of :mod:`fedveil.deploy.wire`, by key) and
``meta`` (a ``ConfigRecord``: the JSON skeleton, the round). Message types: ``query``
(which silo a node is), ``train`` and ``evaluate``.

Run config (``flwr run ... --run-config``), read by the ServerApp: ``config`` (the run's
config as JSON), ``federation`` (``federation.json``'s path), ``out`` (the server's run
directory), ``resume`` (bool), ``timeout`` (seconds a round waits for replies).
Node config (``flower-supernode --node-config``), read by the ClientApp: ``silo-socket``
(the silo service's socket); the silo's folder, state, ``max-epsilon`` and
``share-metrics`` are the service's own settings (``fedveil deploy silo``).
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from ..config import validate
from ..runtime.recorder import DirectoryRecorder
from . import wire
from .server import DeployedServer, Failure, Packed
from .silo_data import read_federation, read_silo_keys
from .silo_identity import new_nonce, verify_claim

QUERY = "query"  # message type: which silo is this node (train and evaluate are the server's request kinds)
POLL_S = 0.2  # how often a round asks the SuperLink for replies (Flower's send_and_receive: 3 s)
RECONNECT_GRACE_S = 30.0  # how long a round waits for a silo that answered last time but is listed offline
QUERY_TIMEOUT_S = 15.0  # how long one discovery pass waits for nodes to say which silo they are
LOG = logging.getLogger("fedveil.deploy")


def to_content(packed: Packed, round_idx: int | None = None) -> RecordDict:
    """A packed request or reply as a Flower ``RecordDict``: its
    tensors as arrays, the skeleton and the round in ``meta``."""
    tensors, skeleton = packed
    arrays = ArrayRecord({k: Array.from_numpy_ndarray(a) for k, a in wire.tensors_to_numpy(tensors).items()})
    meta: dict[str, Any] = {"skeleton": skeleton}
    if round_idx is not None:
        meta["round"] = round_idx
    return RecordDict({"arrays": arrays, "meta": ConfigRecord(meta)})


def from_content(content: RecordDict) -> tuple[Packed, int | None]:
    """The packed message and its round (None if absent) from a Flower ``RecordDict`` (:func:`to_content`'s inverse)."""
    arrays = content["arrays"]
    tensors = wire.tensors_from_numpy({k: a.numpy() for k, a in arrays.items()})
    meta = content["meta"]
    return (tensors, str(meta["skeleton"])), (int(meta["round"]) if "round" in meta else None)


class FlowerTransport:
    """:class:`~fedveil.deploy.server.Transport` over a Flower ``Grid``: silos are found by
    asking every connected node which silo it is, proven with the silo's key
    (:mod:`.silo_identity`) when ``silo_keys`` registers them; a round waits ``timeout``
    seconds for replies, and a node that does not answer in time, or answers with an error,
    is dropped. A silo that answered its last request but whose node Flower lists offline
    (a SuperLink restarted on its database marks nodes offline until their next heartbeat,
    up to about 20 s later) is waited for up to ``RECONNECT_GRACE_S`` before the round
    goes on without it; a silo that failed its last request is not waited for. A silo not
    found yet (its node was offline, or joined late) is looked for again before each round."""

    name = "flower"

    def __init__(
        self, grid: Grid, num_silos: int, timeout: float, wait_for: float = 60.0, silo_keys: dict[int, str] | None = None,
    ) -> None:
        self.grid, self.num_silos, self.timeout = grid, num_silos, timeout
        self.silo_keys = silo_keys or {}
        self.node_of: dict[int, int] = {}  # silo id -> node id
        self.refused: dict[int, str] = {}  # node id -> why its claim was refused
        self.answered_last: set[int] = set()  # silos whose last request (or the query) was answered
        self._discover(wait_for)

    def _discover(self, wait_for: float) -> None:
        """Ask every node which silo it is, until all silos answered or ``wait_for`` seconds passed."""
        deadline = time.monotonic() + wait_for
        while True:
            asked = [n for n in self.grid.get_node_ids() if n not in self.node_of.values() and n not in self.refused]
            if asked:
                nonces = {n: new_nonce() for n in asked}
                replies = self.grid.send_and_receive(
                    [Message(RecordDict({"meta": ConfigRecord({"nonce": nonces[n]})}), n, QUERY) for n in asked],
                    timeout=min(self.timeout, QUERY_TIMEOUT_S),
                )
                for reply in replies:
                    if not reply.has_error() and self._claim(reply, nonces):
                        self.answered_last.add(int(reply.content["meta"]["silo"]))
            if len(self.node_of) >= self.num_silos or time.monotonic() > deadline:
                return
            time.sleep(0.5)

    def _claim(self, reply: Message, nonces: dict[int, str]) -> bool:
        """Map the silo a node claims to it, if its signature proves the silo's key; whether it was mapped."""
        node, meta = reply.metadata.src_node_id, reply.content["meta"]
        try:
            cid = int(meta["silo"])
        except (KeyError, TypeError, ValueError):
            self.refused[node] = "no silo id"
            return False
        why = None
        if cid in self.node_of:
            why = f"claims silo {cid}, already served by node {self.node_of[cid]}"
        elif self.silo_keys:
            signature = str(meta.get("signature", ""))
            key = self.silo_keys.get(cid)
            if key is None or not verify_claim(key, signature, nonces.get(node, ""), cid, node):
                why = f"claims silo {cid} without its key"
        if why is not None:
            self.refused[node] = why
            LOG.warning("node %d %s: refused, it gets no request", node, why)
            return False
        self.node_of[cid] = node
        return True

    def reachable(self) -> list[int]:
        """The discovered silos whose nodes are connected, after waiting
        (a grace period at most) for silos that answered last round."""
        if len(self.node_of) < self.num_silos:
            self._discover(wait_for=0.0)  # one more pass for silos not found yet
        deadline = time.monotonic() + min(self.timeout, RECONNECT_GRACE_S)
        while True:
            connected = set(self.grid.get_node_ids())
            waiting = [cid for cid in self.answered_last if self.node_of[cid] not in connected]
            if not waiting or time.monotonic() > deadline:
                return sorted(cid for cid, node in self.node_of.items() if node in connected)
            time.sleep(POLL_S)

    def exchange(self, kind: str, round_idx: int, requests: dict[int, Packed]) -> dict[int, Packed | Failure]:
        """Pushes one ``kind`` message per silo and polls for replies
        until the timeout; a silo without a reply gets a :class:`Failure`."""
        messages = [
            Message(to_content(packed, round_idx), self.node_of[cid], kind, group_id=str(round_idx))
            for cid, packed in requests.items()
        ]
        silo_of = dict(zip(self.grid.push_messages(messages), requests))  # message id -> silo id
        out: dict[int, Packed | Failure] = {cid: Failure("timeout") for cid in requests}
        waiting, deadline = set(silo_of), time.monotonic() + self.timeout
        while waiting and time.monotonic() < deadline:
            for reply in self.grid.pull_messages(waiting):
                message_id = reply.metadata.reply_to_message_id
                if message_id not in waiting:
                    continue
                waiting.discard(message_id)
                cid = silo_of[message_id]
                if reply.has_error():
                    out[cid] = Failure(f"error {reply.error.code}: {reply.error.reason}")
                    LOG.warning("silo %d, round %d %s: %s", cid, round_idx + 1, kind, out[cid].reason)
                else:
                    out[cid] = from_content(reply.content)[0]
            if waiting:
                time.sleep(POLL_S)
        answered = {cid for cid, reply in out.items() if not isinstance(reply, Failure)}
        self.answered_last = (self.answered_last - set(requests)) | answered
        return out


server_app = ServerApp()


@server_app.main()
def server_main(grid: Grid, context: Context) -> None:
    """The ServerApp's entry point: reads the run config and federation,
    then runs :class:`DeployedServer` over the grid, recording into ``out``."""
    run = context.run_config
    config = validate(json.loads(str(run["config"])))
    shape, _ = read_federation(str(run["federation"]))
    keys = read_silo_keys(str(run["federation"]))
    if not keys:
        LOG.warning("federation.json registers no silo keys: a node's claim to be a silo is not checked")
    transport = FlowerTransport(grid, shape.num_clients, float(run.get("timeout", 120.0)), silo_keys=keys)
    server = DeployedServer(config, shape)
    recorder = DirectoryRecorder.open(str(run["out"]), server.config_dict, resume=bool(run.get("resume", False)))
    server.run(transport, recorder)
