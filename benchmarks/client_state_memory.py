"""Peak memory of a stateful algorithm over a large population: client state in memory vs on disk.

``python benchmarks/client_state_memory.py [--clients 100000] [--per-round 100] [--rounds 100]``
(about ten minutes on 2 cores)

Runs SCAFFOLD (one control variate per client, the size of the model) with the FedAvg
MNIST MLP (64-200-200-10 here) on ``synthetic_images`` of 8x8 pixels, 20 training rows
per client (the 100,000-client workload of docs/executors.md), ``--per-round`` clients
per round on the vectorized executor, once per ``federation.client_state`` backend, each
in its own subprocess (``Simulation.run`` into a temporary run directory: checkpoints,
evaluation and report included). Each reports its peak RSS (``getrusage``), its RSS at
every round's end and the size of its ``client_states/`` folder.

A run of R rounds gives state to at most ``R x per-round`` clients; the table gives the
bytes of those states and what the memory backend would hold once every client has taken
part (clients x state bytes), and the RSS growth per round after the first.
Writes the records to ``benchmarks/results/client_state_memory.json`` (``--json``).
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROWS_PER_CLIENT = 20
SHAPE = (1, 8, 8)
TEST_ROWS = 256
MIB = 1 << 20
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "client_state_memory.json"


def raw_config(clients: int, per_round: int, rounds: int, algorithm: str, backend: str) -> dict[str, Any]:
    """The run: ``clients`` clients of 20 synthetic 8x8 images each, evaluated at the end only."""
    c, h, w = SHAPE
    return {
        "executor": "vectorized",
        "data": {
            "name": "synthetic_images", "num_clients": clients, "val_fraction": 0.0, "test_fraction": 0.0,
            "options": {"channels": c, "height": h, "width": w, "rows": clients * ROWS_PER_CLIENT, "test_rows": TEST_ROWS},
        },
        "model": {"name": "mlp"},
        "algorithm": {"name": algorithm},
        "client": {"batch_size": 10, "lr": 0.05},
        "federation": {"rounds": rounds, "clients_per_round": per_round, "client_state": backend},
        "eval": {"every": rounds},
        "checkpoint": {"every": 5},
    }


def rss_mib() -> float:
    """This process's resident set size now (Linux ``/proc``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def folder_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / MIB if path.exists() else 0.0


def tensor_bytes(value: Any) -> int:
    """Bytes of the tensors in a (nested) state."""
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    return value.numel() * value.element_size() if hasattr(value, "numel") else 0


def state_bytes(sim) -> int:
    """Bytes of one client's state."""
    return tensor_bytes(sim.algorithm.init_client(0, sim.algorithm.init_server(sim.init)))


def measure(args: argparse.Namespace, backend: str) -> dict[str, Any]:
    """One run in this process; the record of its memory, time and state on disk."""
    from fedveil.config import validate
    from fedveil.runtime import Callback, Simulation

    class RssPerRound(Callback):
        def __init__(self) -> None:
            self.rss: list[float] = []

        def on_round_end(self, row):
            self.rss.append(rss_mib())

    recorder = RssPerRound()
    started = time.perf_counter()
    sim = Simulation.from_config(validate(raw_config(args.clients, args.per_round, args.rounds, args.algorithm, backend)), [recorder])
    setup_rss = rss_mib()
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        sim.run(Path(tmp) / "run")
        rows = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
        disk = folder_mib(Path(tmp) / "run" / "client_states")
    elapsed = [r["elapsed_s"] for r in rows]
    sampled = len({int(c) for cohort in sim.schedule for c in cohort})
    return {
        "backend": backend, "algorithm": args.algorithm, "clients": args.clients, "per_round": args.per_round,
        "rounds": args.rounds, "peak_rss_mib": peak_rss_mib(), "setup_rss_mib": setup_rss,
        "round_rss_mib": recorder.rss, "seconds_per_round": statistics.median(b - a for a, b in zip([0.0] + elapsed, elapsed)),
        "total_s": time.perf_counter() - started, "clients_with_state": sampled, "state_bytes": state_bytes(sim),
        "client_states_disk_mib": disk,
    }


def run_child(args: argparse.Namespace, backend: str) -> dict[str, Any]:
    """``measure`` in a fresh subprocess, so that each backend's peak RSS is its own."""
    cmd = [sys.executable, __file__, "--child", backend, "--clients", str(args.clients), "--per-round", str(args.per_round),
           "--rounds", str(args.rounds), "--algorithm", args.algorithm]
    if args.workdir:
        cmd += ["--workdir", args.workdir]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{backend} run failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def rss_growth(rss: list[float]) -> float:
    """MiB per round: the least-squares slope of the RSS after rounds 2, 3, ... (round 1 warms up)."""
    after = rss[1:]
    if len(after) < 2:
        return float("nan")
    return statistics.linear_regression(range(len(after)), after).slope


def table(records: list[dict[str, Any]]) -> str:
    head = ("backend", "peak RSS MiB", "RSS growth MiB/round", "s/round", "clients with state", "their states GiB",
            "client_states/ MiB", "all clients' states GiB")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in records:
        held, full = (n * r["state_bytes"] / (1 << 30) for n in (r["clients_with_state"], r["clients"]))
        lines.append(" | ".join((
            r["backend"], f"{r['peak_rss_mib']:.0f}", f"{rss_growth(r['round_rss_mib']):+.1f}", f"{r['seconds_per_round']:.2f}",
            str(r["clients_with_state"]), f"{held:.2f}", f"{r['client_states_disk_mib']:.0f}", f"{full:.1f}",
        )))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=100_000, help="population size")
    parser.add_argument("--per-round", type=int, default=100, help="cohort size")
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--algorithm", default="scaffold", help="a stateful algorithm: scaffold or local")
    parser.add_argument("--backends", nargs="+", default=["disk", "memory"], choices=["disk", "memory"])
    parser.add_argument("--workdir", help="where the temporary run directories go (default: the system's temp dir)")
    parser.add_argument("--json", default=str(DEFAULT_JSON), help="write the records and machine info here")
    parser.add_argument("--child", choices=["disk", "memory"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args, args.child)))
        return
    from fedveil.bench.harness import machine_info

    records = [run_child(args, backend) for backend in args.backends]
    print(table(records))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"machine": machine_info(), "records": records}, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
