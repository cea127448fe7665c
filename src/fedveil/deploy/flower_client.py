"""fedveil's Flower ClientApp: a forwarder between the SuperNode and the silo service.

It holds no data and opens no file: each message (``query``, ``train``, ``evaluate``) goes
as it is, with the run's config and the node's id, to the silo service on the Unix socket
the node config names (``silo-socket``; :mod:`.silo_service`), and the service's reply
comes back as the reply message. A refusal comes back as a Flower error reply with the
service's one-line reason. It imports neither torch nor the rest of fedveil, so the
process Flower starts for each message is up in about the time Flower itself takes.
"""
from __future__ import annotations

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from .silo_socket import SiloServiceError, call

client_app = ClientApp()


def forward(message: Message, context: Context) -> Message:
    """Send ``message`` to the silo service; its reply as a Flower reply to ``message``."""
    path = context.node_config.get("silo-socket")
    if not isinstance(path, str) or not path:
        raise SiloServiceError("this SuperNode's node config names no silo-socket (docs/deployment.md, step 5)")
    content = message.content
    meta = dict(content["meta"]) if "meta" in content.config_records else {}
    described, blobs = [], []
    if "arrays" in content.array_records:
        for key, array in content["arrays"].items():
            described.append({"key": key, "dtype": array.dtype, "shape": list(array.shape), "stype": array.stype})
            blobs.append(array.data)
    header = {
        "op": message.metadata.message_type, "config": context.run_config.get("config"),
        "node_id": context.node_id, "meta": meta, "arrays": described,
    }
    reply, reply_blobs = call(path, header, blobs)
    records = {"meta": ConfigRecord(reply["meta"])}
    if reply["arrays"] or "arrays" in content.array_records:
        records["arrays"] = ArrayRecord(
            {a["key"]: Array(a["dtype"], tuple(a["shape"]), a["stype"], blob) for a, blob in zip(reply["arrays"], reply_blobs)}
        )
    return Message(RecordDict(records), reply_to=message)


client_app.query()(forward)
client_app.train()(forward)
client_app.evaluate()(forward)
for _stage in ("secagg_advertise", "secagg_share", "secagg_unmask"):  # secure aggregation: train.<stage>
    client_app.train(_stage)(forward)
