"""Run fedveil's benchmark suite: ``python benchmarks/run_suite.py [--quick] [--json PATH]``.

A thin wrapper of :func:`fedveil.bench.run_suite` (the same as ``fedveil bench``); see
benchmarks/README.md for what is measured.
"""
from __future__ import annotations

import argparse

from fedveil.bench import run_suite
from fedveil.bench.workloads import SYSTEMS, WORKLOADS


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small subset, about a minute on 2 cores")
    parser.add_argument("--json", metavar="PATH", help="write the records and machine info here")
    parser.add_argument("--systems", nargs="+", metavar="NAME", help=f"subset of: {' '.join(SYSTEMS)} (or fedveil-<executor>)")
    parser.add_argument("--workloads", nargs="+", metavar="NAME", choices=sorted(WORKLOADS), help="subset of the workloads")
    parser.add_argument("--clients", nargs="+", type=int, metavar="N", help="cohort sizes (default 10 100 1000; quick: 10)")
    parser.add_argument("--rounds", type=int, help="measured rounds per case (after one warm-up round)")
    parser.add_argument("--dp", choices=("yes", "no"), help="only the DP-SGD (yes) or the non-private (no) variants")
    parser.add_argument("--threads", type=int, help="torch threads per subprocess (default: 1 with --quick, else torch's default; 0: torch's default)")
    parser.add_argument("--timeout", type=float, help="seconds before a case is killed")
    parser.add_argument("--device", default="auto", help="where every system computes: auto (CUDA when available), cpu, cuda, cuda:N")
    parser.add_argument("--in-process", action="store_true",
                        help="run the cases in this process (no per-case RSS; Flower stays in a subprocess)")
    args = parser.parse_args(argv)
    run_suite(
        args.quick, args.json, args.systems, args.workloads,
        cohorts=args.clients, rounds=args.rounds, timeout_s=args.timeout,
        dp=None if args.dp is None else args.dp == "yes", threads=args.threads, device=args.device,
        in_process=args.in_process,
    )


if __name__ == "__main__":
    main()
