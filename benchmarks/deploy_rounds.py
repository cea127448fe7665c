"""Rounds per second of MR-MTL with silo-specific DP: simulation vs the in-process
deployment (every message through the wire format) vs Flower on loopback.

``python benchmarks/deploy_rounds.py [--data-root ../shared/data] [--rounds 5] [--repeats 2]``
(a few minutes on 2 cores: the Flower runs dominate)

The run: School rows (real ``school.mat`` from ``--data-root``) over 3 silos (IID split of
the students), linear model, MR-MTL lambda 0.1, example-level DP with epsilon 2 / 4 / 8 per
silo, evaluation only after the last round. Each system runs the same config ``--repeats``
times, one after the other (A B C A B C ...), so machine noise hits them alike; the table
gives the median seconds per round (wall time of the rounds / rounds; for Flower without
the federation's start-up, which is reported apart). Writes
``benchmarks/results/deploy_rounds.json``. Flower rounds go through each silo's warm silo
service, and pay for Flower's per-message path: the SuperNode's message poll (3 s when
idle), a new forwarder ClientApp process per message (Python and Flower) and TLS.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "deploy_rounds.json"


def make_config(data_root: str, rounds: int):
    from fedveil.config import validate

    return validate({
        "seed": 0,
        "data": {"name": "school", "root": str(Path(data_root) / "school"), "download": False, "num_clients": 3,
                 "options": {"normalize_target": True, "scale_features": True}},
        "model": {"name": "linear"},
        "algorithm": {"name": "mr_mtl", "lam": 0.1},
        "client": {"lr": 0.05, "batch_size": 64},
        "federation": {"rounds": rounds, "clients_per_round": 3},
        "eval": {"every": rounds},
        "privacy": {"level": "example", "client_epsilons": [2.0, 4.0, 8.0], "delta": 1e-5, "clip": 1.0},
    })


def simulation(config, work: Path) -> dict:
    from fedveil.runtime.recorder import MemoryRecorder
    from fedveil.runtime.simulation import Simulation

    start = time.perf_counter()
    recorder = MemoryRecorder()
    summary = Simulation.from_config(config).record(recorder)
    return {"rounds_s": summary["wall_time_s"], "total_s": time.perf_counter() - start, "mse": summary.get("personal_mse_mean")}


def loopback(config, work: Path) -> dict:
    from fedveil.deploy import DeployedServer, Silo, prepare_silos
    from fedveil.deploy.loopback import LoopbackTransport
    from fedveil.deploy.silo_data import silo_folder
    from fedveil.runtime.recorder import MemoryRecorder

    start = time.perf_counter()
    shape = prepare_silos(config, work / "silos")
    silos = {k: Silo.from_folder(config, silo_folder(work / "silos", k), share_metrics=True) for k in range(shape.num_clients)}
    summary = DeployedServer(config, shape).run(LoopbackTransport(silos), MemoryRecorder())
    return {"rounds_s": summary["wall_time_s"], "total_s": time.perf_counter() - start, "mse": summary.get("personal_mse_mean")}


def flower(config, work: Path) -> dict:
    from fedveil.deploy import prepare_silos
    from fedveil.deploy.flower_project import write_flower_app
    from fedveil.deploy.local_federation import LocalFederation

    start = time.perf_counter()
    shape = prepare_silos(config, work / "silos")
    app = write_flower_app(work / "app", config, work / "silos" / "federation.json", work / "server", timeout=120)
    share = {k: {"share_metrics": True} for k in range(shape.num_clients)}
    with LocalFederation(work / "flower", shape.num_clients, silo_root=work / "silos", silo_options=share) as fed:
        fed.start(timeout=120)
        up = time.perf_counter() - start
        status = fed.wait(fed.submit(app), timeout=1200)
    summary = json.loads((work / "server" / "summary.json").read_text())
    if status != "finished:completed":
        raise RuntimeError(f"the Flower run ended {status}")
    return {"rounds_s": summary["wall_time_s"], "total_s": time.perf_counter() - start, "startup_s": up,
            "mse": summary.get("personal_mse_mean")}


SYSTEMS = {"simulation": simulation, "loopback": loopback, "flower": flower}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", default="../shared/data")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", default=str(DEFAULT_JSON))
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # the seeded-noise warning: this benchmark is not a deployment
    config = make_config(args.data_root, args.rounds)
    records: dict[str, list[dict]] = {name: [] for name in SYSTEMS}
    for repeat in range(args.repeats):
        for name, system in SYSTEMS.items():
            with tempfile.TemporaryDirectory() as work:
                records[name].append(system(config, Path(work)))
            print(f"repeat {repeat + 1}: {name} {records[name][-1]['rounds_s'] / args.rounds:.3f} s/round", flush=True)
    base = statistics.median(r["rounds_s"] for r in records["simulation"]) / args.rounds
    print(f"\n{'system':<12} {'s/round':>9} {'rounds/s':>9} {'x simulation':>13} {'personal MSE':>13}")
    table = []
    for name, runs in records.items():
        per_round = statistics.median(r["rounds_s"] for r in runs) / args.rounds
        mse = runs[-1]["mse"]
        table.append({"system": name, "s_per_round": per_round, "rounds_per_s": 1 / per_round,
                      "vs_simulation": per_round / base, "personal_mse_mean": mse, "runs": runs})
        print(f"{name:<12} {per_round:>9.3f} {1 / per_round:>9.2f} {per_round / base:>13.1f} {mse:>13.5f}")
    startup = statistics.median(r["startup_s"] for r in records["flower"])
    print(f"Flower federation start-up (SuperLink + 3 SuperNodes, TLS, node auth): {startup:.1f} s (median)")
    out = {"machine": platform.platform(), "python": sys.version.split()[0], "rounds": args.rounds,
           "repeats": args.repeats, "table": table, "flower_startup_s": startup}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
