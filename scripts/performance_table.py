"""Print the README's performance table from benchmark suite records.

    python scripts/performance_table.py benchmarks/results/suite_2026-11-28b.json

One row per (workload, DP or not, cohort size) found in the records, one column per
system (seconds per round, the median of the measured rounds); `-` where a system did not
run for that row. Below the table, the ratios issue 38 asks for, each from one record pair
of the same file: fedveil (auto) against the plain loop (Opacus under DP), the MLP at
100 clients against Flower, and each DP round against its non-private round.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

COLUMNS = [
    ("fedveil-auto", "fedveil auto (default)"),
    ("fedveil-vectorized", "vectorized"),
    ("fedveil-threads", "threads"),
    ("fedveil-serial", "serial"),
    ("plain-loop", "plain PyTorch loop"),
    ("opacus", "Opacus"),
    ("flower", "Flower"),
    ("centralised", "centralised limit"),
]
NAMES = {"mlp": "MLP 784-200-200-10", "lenet": "LeNet (FedAvg CNN)", "resnet": "ResNet-8 (GroupNorm)"}


def load(paths: list[Path]) -> dict[tuple, float]:
    """``{(workload, dp, clients, system): seconds per round}`` of the records that ran."""
    out = {}
    for path in paths:
        for r in json.loads(path.read_text())["records"]:
            if r.get("status") == "ok":
                out[(r["workload"], bool(r["dp"]), int(r["clients"]), r["system"])] = float(r["seconds_per_round"])
    return out


def table(times: dict[tuple, float]) -> str:
    rows = sorted({k[:3] for k in times}, key=lambda k: (list(NAMES).index(k[0]) if k[0] in NAMES else 9, k[1], k[2]))
    used = [(s, title) for s, title in COLUMNS if any(k[3] == s for k in times)]
    lines = ["| workload | DP-SGD | clients | " + " | ".join(t for _, t in used) + " |",
             "|---|---|---|" + "---|" * len(used)]
    for w, dp, n in rows:
        cells = [_fmt(times.get((w, dp, n, s))) for s, _ in used]
        lines.append(f"| {NAMES.get(w, w)} | {'yes' if dp else 'no'} | {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratios(times: dict[tuple, float]) -> str:
    lines = []
    for w, dp, n in sorted({k[:3] for k in times}):
        auto = times.get((w, dp, n, "fedveil-auto"))
        base_name = "opacus" if dp else "plain-loop"
        base = times.get((w, dp, n, base_name))
        if auto and base:
            lines.append(f"- {w} {'DP ' if dp else ''}x{n}: auto / {base_name} = {auto / base:.2f}")
    for n in (10, 100, 1000):
        vec, flower = times.get(("mlp", False, n, "fedveil-vectorized")), times.get(("mlp", False, n, "flower"))
        if vec and flower:
            lines.append(f"- mlp x{n}: Flower / vectorized = {flower / vec:.2f}")
        private = times.get(("mlp", True, n, "fedveil-vectorized"))
        if vec and private:
            lines.append(f"- mlp x{n}: DP round / non-private round (vectorized) = {private / vec:.2f}")
    return "\n".join(lines)


def _fmt(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    return f"{seconds:.3f}" if seconds < 1 else f"{seconds:.2f}" if seconds < 10 else f"{seconds:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("records", nargs="+", type=Path, help="suite JSON files (run_suite.py --json)")
    args = parser.parse_args()
    times = load(args.records)
    print(table(times))
    print()
    print(ratios(times))


if __name__ == "__main__":
    main()
