"""Seconds per round of one bench case in this process, for before/after comparisons of two
checkouts: run it alternately against each (``PYTHONPATH=CHECKOUT/src``) and compare medians.

    python benchmarks/round_times.py resnet 10 auto [--dp] [--rounds 4] [--json out.json]

Prints ``median`` (of the rounds after the first, untimed warm-up), every round's seconds
and the process's peak RSS; with ``--json`` appends one record to that file (a JSON list).
The case is :func:`fedveil.bench.workloads.fedveil_config`'s, timed inside
``Simulation.training_settings`` as the suite does.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import time
from pathlib import Path

import fedveil
from fedveil.bench.workloads import Case, fedveil_config
from fedveil.config import validate
from fedveil.runtime import Simulation


def checkout_commit() -> str:
    """The commit of the fedveil being timed (its source folder's git HEAD), or ``unknown``."""
    src = Path(fedveil.__file__).resolve().parents[2]
    done = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload")
    parser.add_argument("clients", type=int)
    parser.add_argument("executor")
    parser.add_argument("--dp", action="store_true")
    parser.add_argument("--rounds", type=int, default=4, help="timed rounds after the warm-up one")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    case = Case(workload=args.workload, system=f"fedveil-{args.executor}", clients=args.clients, dp=args.dp,
                rounds=args.rounds, warmup=1, device="cpu")
    sim = Simulation.from_config(validate(fedveil_config(case, args.executor)))
    state = sim.fresh_state()
    seconds = []
    settings = getattr(sim, "training_settings", None) or sim.training_threads  # its name before 2026-11-28
    with settings():
        for r in range(args.rounds + 1):
            start = time.perf_counter()
            sim.train_round(state, r)
            seconds.append(time.perf_counter() - start)
    record = {
        "workload": args.workload, "clients": args.clients, "executor": args.executor, "dp": args.dp,
        "commit": checkout_commit(), "median": statistics.median(seconds[1:]), "round_seconds": seconds,
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    }
    print(f"{args.workload} x{args.clients} {args.executor}{' dp' if args.dp else ''} @ {record['commit']}: "
          f"median {record['median']:.4f} s, rounds {[round(s, 3) for s in seconds]}, peak {record['peak_mib']} MiB")
    if args.json:
        records = json.loads(args.json.read_text()) if args.json.exists() else []
        args.json.write_text(json.dumps(records + [record], indent=1) + "\n")


if __name__ == "__main__":
    main()
