"""What the per-round privacy ledger check costs, as a share of the round.

``python benchmarks/ledger_check_cost.py [--repeats 3] [--config examples/quickstart.toml] [key=value ...]``
(about a minute on 2 cores for the quickstart)

Runs the config ``--repeats`` times in-process (plots off) with the round loop's two
calls timed by wrapping them: ``Simulation.train_round`` (the whole round: training,
recording, aggregation and the check) and ``RunPrivacy.check_round`` (the check alone).
Both are timed in the same runs, so machine noise hits them alike. Prints a table and
writes ``benchmarks/results/ledger_check_cost.json``.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "ledger_check_cost.json"


def timed(owner, name: str, sink: list[float]):
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            sink.append(time.perf_counter() - start)

    setattr(owner, name, wrapper)
    return original


def one_run(config) -> dict[str, float]:
    import fedveil.runtime.simulation as simulation
    from fedveil.runtime import Simulation
    from fedveil.runtime.run_privacy import RunPrivacy

    rounds, checks = [], []
    originals = (timed(Simulation, "train_round", rounds), timed(RunPrivacy, "check_round", checks))
    report, simulation.write_report = simulation.write_report, lambda path: []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            Simulation.from_config(config).run(Path(tmp) / "run")
    finally:
        Simulation.train_round, RunPrivacy.check_round = originals
        simulation.write_report = report
    return {
        "rounds": len(rounds), "round_s": sum(rounds), "check_s": sum(checks),
        "check_share": sum(checks) / sum(rounds), "check_ms_per_round": 1e3 * sum(checks) / len(checks),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("overrides", nargs="*", help="key=value overrides of the config")
    parser.add_argument("--config", default="examples/quickstart.toml")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=str(DEFAULT_JSON))
    args = parser.parse_args(argv)
    from fedveil.config import load_config

    config = load_config(args.config, args.overrides)
    runs = [one_run(config) for _ in range(args.repeats)]
    print(f"{'run':>4} {'rounds':>7} {'round s (sum)':>14} {'check s (sum)':>14} {'check ms/round':>15} {'share':>8}")
    for i, r in enumerate(runs):
        print(f"{i:>4} {r['rounds']:>7} {r['round_s']:>14.3f} {r['check_s']:>14.4f} {r['check_ms_per_round']:>15.3f} "
              f"{100 * r['check_share']:>7.3f}%")
    median = statistics.median(r["check_share"] for r in runs)
    print(f"median share of a round spent in the ledger check: {100 * median:.3f}%")
    record = {
        "benchmark": "ledger_check_cost", "config": args.config, "overrides": args.overrides, "runs": runs,
        "median_check_share": median, "python": sys.version.split()[0], "machine": platform.processor() or platform.machine(),
        "date": time.strftime("%Y-%m-%d"),
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
