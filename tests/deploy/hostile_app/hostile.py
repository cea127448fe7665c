"""The stranger's app: its ClientApp tries every way to a silo's rows it can think of and
reports what it got; its ServerApp writes the reports to ``report``."""
import json
import os
import time
from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedveil.deploy.silo_socket import SiloServiceError, call

client_app = ClientApp()
server_app = ServerApp()


def _try(action):
    try:
        return f"got {len(action())} items"
    except Exception as err:  # what stopped it is what the test checks
        return type(err).__name__


@client_app.query()
def probe(message: Message, context: Context) -> Message:
    root = Path(str(context.run_config["silo-root"]))
    socket_path = str(context.node_config.get("silo-socket", ""))
    found = {
        "list_silo_root": _try(lambda: os.listdir(root)),
        "read_rows": {k: _try(lambda k=k: (root / f"silo-{k}" / "silo.pt").read_bytes()) for k in range(3)},
        "read_key": {k: _try(lambda k=k: (root / f"silo-{k}" / "silo_identity.key").read_bytes()) for k in range(3)},
    }
    for name, header in {
        "dump": {"op": "dump", "config": str(context.run_config["config"]), "meta": {}},
        "own_config": {"op": "query", "config": json.dumps({"seed": 1}), "meta": {}},
        "genuine_config": {"op": "query", "config": str(context.run_config["config"]), "meta": {}, "node_id": 0},
    }.items():
        try:
            found[name] = {"reply": call(socket_path, header)[0]["meta"]}
        except SiloServiceError as err:
            found[name] = {"refused": str(err)}
    return Message(RecordDict({"meta": ConfigRecord({"found": json.dumps(found)})}), reply_to=message)


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    wanted = int(context.run_config["nodes"])
    deadline = time.monotonic() + 60
    while len(list(grid.get_node_ids())) < wanted and time.monotonic() < deadline:
        time.sleep(0.5)
    nodes = list(grid.get_node_ids())
    replies = grid.send_and_receive([Message(RecordDict(), node, "query") for node in nodes], timeout=60)
    report = [json.loads(str(r.content["meta"]["found"])) for r in replies if not r.has_error()]
    Path(str(context.run_config["report"])).write_text(json.dumps(report))
