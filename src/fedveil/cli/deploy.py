"""``fedveil deploy``: run a config over the network with Flower (docs/deployment.md).

* ``prepare CONFIG --out DIR``: one folder per silo (its rows only) and ``federation.json``;
* ``schema CONFIG --out DIR``: the same for silos that read their own CSV or Parquet file
  (a ``table`` config): ``federation.json`` with the schema, a folder per silo without rows;
* ``certs --out DIR``: a CA, the SuperLink's TLS certificate and the SuperNodes' key pairs;
* ``app CONFIG --federation F --server-out D --out APP``: the Flower app folder for ``flwr run``;
* ``silo --silo-dir D --socket S``: silo k's own service, the only process that opens its
  folder; its SuperNode's ClientApp forwards every message to it over the socket ``S``;
* ``local CONFIG --out DIR``: all of it on this machine's loopback (a SuperLink, one
  SuperNode per silo, TLS and node authentication), then the run and its summary.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def add_parser(sub) -> None:
    """Adds ``fedveil deploy`` and its steps (prepare, schema, certs, app, silo, local) to the subparsers ``sub``."""
    deploy = sub.add_parser(
        "deploy", help="deploy a run over the network with Flower (prepare, certs, app, local)",
        description=__doc__.split("\n\n")[0],
    )
    steps = deploy.add_subparsers(dest="step", required=True, metavar="STEP")
    prepare = steps.add_parser("prepare", help="write each silo's folder and federation.json")
    prepare.add_argument("items", nargs="+", metavar="CONFIG.toml [key=value ...]")
    prepare.add_argument("--out", required=True, help="folder for silo-<k>/ and federation.json")

    schema = steps.add_parser("schema", help="federation.json and silo folders from a table config alone (no rows)")
    schema.add_argument("items", nargs="+", metavar="CONFIG.toml [key=value ...]")
    schema.add_argument("--out", required=True, help="folder for silo-<k>/ (id and key, no rows) and federation.json")

    certs = steps.add_parser("certs", help="TLS certificates and SuperNode key pairs")
    certs.add_argument("--out", required=True, help="folder for ca.crt, server.crt/.key and node-<k>[.pub]")
    certs.add_argument("--host", action="append", help="SuperLink host name or address (repeatable; default 127.0.0.1, localhost)")
    certs.add_argument("--nodes", type=int, default=0, help="SuperNode key pairs to make (default 0)")

    app = steps.add_parser("app", help="the Flower app folder to `flwr run`")
    app.add_argument("items", nargs="+", metavar="CONFIG.toml [key=value ...]")
    app.add_argument("--federation", required=True, help="federation.json (on the server machine)")
    app.add_argument("--server-out", required=True, help="the server's run directory (on the server machine)")
    app.add_argument("--timeout", type=float, default=120.0, help="seconds a round waits for silos (default 120)")
    app.add_argument("--out", required=True, help="app folder to write")

    silo = steps.add_parser("silo", help="serve one silo's folder to its SuperNode over a local socket")
    silo.add_argument("--silo-dir", required=True, help="the silo's folder from `fedveil deploy prepare`")
    silo.add_argument("--socket", required=True, help="Unix socket path the SuperNode's node config names as silo-socket")
    silo.add_argument("--socket-group", help="group allowed to connect (the SuperNode's account); default: this account only")
    silo.add_argument("--state-dir", help="where its state and ledger persist (default SILO_DIR/state)")
    silo.add_argument("--max-epsilon", type=float, help="refuse a run whose plan spends more epsilon")
    silo.add_argument("--table", help="the silo's own CSV or Parquet file, encoded by the schema of `fedveil deploy schema`")
    silo.add_argument("--share-metrics", choices=["true", "false"],
                      help="send training loss and test scores (not noised); default: only without DP")

    local = steps.add_parser("local", help="the whole federation on this machine's loopback, then the run")
    local.add_argument("items", nargs="+", metavar="CONFIG.toml [key=value ...]")
    local.add_argument("--out", required=True, help="folder for silos/, flower/ (logs, certificates), app/ and server/")
    local.add_argument("--insecure", action="store_true", help="no TLS and no node authentication")
    local.add_argument("--timeout", type=float, default=60.0, help="seconds a round waits for silos (default 60)")
    local.add_argument("--kill-silo", type=int, metavar="K", help="SIGKILL silo K's SuperNode and service after the first round")


def _config(items: list[str]):
    from ..config import load_config
    from .items import split_items

    return load_config(*split_items(items))


def cmd_deploy(args: argparse.Namespace) -> int:
    """One step; a federation that does not come up or a silo that refuses is one line, exit 2."""
    from ..deploy.local_federation import FederationError
    from ..deploy.silo import SiloRefused

    try:
        steps = {"prepare": _prepare, "schema": _schema, "certs": _certs, "app": _app, "silo": _silo, "local": _local}
        return steps[args.step](args)
    except (FederationError, SiloRefused) as err:
        print(f"fedveil: error: {err}", file=sys.stderr)
        return 2


def _prepare(args: argparse.Namespace) -> int:
    from ..deploy.silo_data import prepare_silos

    shape = prepare_silos(_config(args.items), args.out)
    print(f"wrote {shape.num_clients} silo folders and federation.json under {args.out}: give silo-<k>/ to silo k only")
    return 0


def _schema(args: argparse.Namespace) -> int:
    from ..deploy.silo_table import write_schema_federation

    shape = write_schema_federation(_config(args.items), args.out)
    print(f"wrote federation.json and {shape.num_clients} silo folders (id and key, no rows) under {args.out}: "
          "give silo-<k>/ to silo k, which starts with `fedveil deploy silo --table ITS_FILE`")
    return 0


def _certs(args: argparse.Namespace) -> int:
    from ..deploy.certificates import make_node_keys, make_tls_files

    make_tls_files(args.out, args.host or ["127.0.0.1", "localhost"])
    for k in range(args.nodes):
        make_node_keys(args.out, f"node-{k}")
    print(f"wrote ca.crt, ca.key (keep it offline), server.crt, server.key and {args.nodes} node key pair(s) to {args.out}")
    return 0


def _app(args: argparse.Namespace) -> int:
    from ..deploy.flower_project import write_flower_app

    write_flower_app(args.out, _config(args.items), args.federation, args.server_out, args.timeout)
    print(f"wrote {Path(args.out) / 'pyproject.toml'}; start it with: flwr run {args.out} <superlink>")
    return 0


def _silo(args: argparse.Namespace) -> int:
    import logging

    from ..deploy.silo_service import SiloService

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    share = None if args.share_metrics is None else args.share_metrics == "true"
    group = int(args.socket_group) if args.socket_group and args.socket_group.isdigit() else args.socket_group
    service = SiloService(args.silo_dir, args.socket, args.state_dir, args.max_epsilon, share, group, table=args.table)
    try:
        service.serve()
    except KeyboardInterrupt:
        pass
    return 0


def _local(args: argparse.Namespace) -> int:
    from ..deploy.flower_project import write_flower_app
    from ..deploy.local_federation import LocalFederation
    from ..deploy.silo_data import prepare_silos

    config, out = _config(args.items), Path(args.out)
    if out.exists() and any(out.iterdir()):
        from ..runtime.run_dir import RunDirError

        raise RunDirError(f"'{out}' is not empty; give a new --out folder")
    shape = prepare_silos(config, out / "silos")
    app = write_flower_app(out / "app", config, out / "silos" / "federation.json", out / "server", args.timeout)
    secure = not args.insecure
    started = time.perf_counter()
    with LocalFederation(out / "flower", shape.num_clients, tls=secure, auth=secure, silo_root=out / "silos") as fed:
        fed.start(timeout=120)
        print(f"SuperLink on 127.0.0.1:{fed.port} ({'TLS, node authentication' if secure else 'insecure'}), "
              f"{shape.num_clients} SuperNodes active after {time.perf_counter() - started:.1f} s", flush=True)
        run_id = fed.submit(app)
        metrics = out / "server" / "metrics.jsonl"
        shown = 0
        while not fed.status(run_id).startswith("finished"):
            rows = metrics.read_text().splitlines() if metrics.exists() else []
            for line in rows[shown:]:
                row = json.loads(line)
                eps = f", epsilon {row['epsilon']:.3g}" if "epsilon" in row else ""
                dropped = f", dropped {row['dropped']}" if row.get("dropped") else ""
                print(f"round {row['round']}: {row['survivors']}/{row['cohort_size']} silos{eps}{dropped} "
                      f"({row['elapsed_s']:.1f} s)", flush=True)
                if args.kill_silo is not None and row["round"] == 1:
                    fed.kill_silo(args.kill_silo)
                    print(f"killed silo {args.kill_silo}'s SuperNode and silo service", flush=True)
            shown = len(rows)
            time.sleep(1.0)
        status = fed.status(run_id)
    print(f"run {run_id}: {status}; server run directory {out / 'server'}; logs in {out / 'flower' / 'logs'}")
    return 0 if status == "finished:completed" else 1
