"""Compare two folders of reproduction outputs (e.g. every ``fedveil reproduce NAME --quick``
run before and after a refactor) and print every number that differs.

    python scripts/compare_reproductions.py BEFORE_DIR AFTER_DIR

JSON and JSONL files are compared value by value (floats exactly; wall-clock and device
keys, keys named in seconds and report rows of timings skipped; each side's own folder
path read as ``<root>``); markdown and CSV tables line by line, ignoring lines that report timings.
Keys present on one side only are listed too (e.g. a config field added by the change).
Exit status 1 when a number or a file differs.
"""
from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

SKIP_KEYS = {"elapsed_s", "wall_time_s", "seconds", "time_s", "device"}
# timings named by unit: train_seconds, cloud_features_s, ... (scale_s is ECOS's score scale, not a time)
TIMED_KEY = re.compile(r"(_seconds|(?<!scale)_s)$")
SUFFIXES = (".json", ".jsonl", ".md", ".csv")


def _walk(a, b, where: str, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        if str(a.get("metric", "")).startswith("seconds"):  # a report row of timings
            return
        for key in sorted(set(a) | set(b)):
            if key in SKIP_KEYS or TIMED_KEY.search(key):
                continue
            if key not in a or key not in b:
                out.append(f"{where}.{key}: only {'after' if key in b else 'before'}")
            else:
                _walk(a[key], b[key], f"{where}.{key}", out)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{where}: {len(a)} vs {len(b)} entries")
        for i, (x, y) in enumerate(zip(a, b)):
            _walk(x, y, f"{where}[{i}]", out)
    elif isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return
    elif a != b:
        out.append(f"{where}: {a!r} vs {b!r}")


def _untimed(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if not re.search(r"time|seconds", line.lower()) and " s)" not in line]


def _rooted(path: Path, root: Path) -> str:
    """The file's text with its output folder's own path written as ``<root>`` (a run's config
    names other runs of the same reproduction by absolute path)."""
    return path.read_text().replace(str(root.resolve()), "<root>").replace(str(root), "<root>")


def compare(before: Path, after: Path) -> tuple[list[str], list[str]]:
    """(differences in numbers or files, keys present on one side only)."""
    numbers, one_sided = [], []
    files = sorted(p.relative_to(before) for p in before.rglob("*") if p.suffix in SUFFIXES)
    for rel in files:
        a, b = before / rel, after / rel
        if not b.exists():
            numbers.append(f"{rel}: missing after")
            continue
        found: list[str] = []
        texts = [_rooted(a, before), _rooted(b, after)]
        if rel.suffix == ".json":
            _walk(json.loads(texts[0]), json.loads(texts[1]), str(rel), found)
        elif rel.suffix == ".jsonl":
            rows = [[json.loads(line) for line in text.splitlines()] for text in texts]
            _walk(rows[0], rows[1], str(rel), found)
        elif _untimed(a) != _untimed(b):
            found.append(f"{rel}: table lines differ")
        for line in found:
            (one_sided if ": only " in line else numbers).append(line)
    return numbers, one_sided


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    numbers, one_sided = compare(Path(sys.argv[1]), Path(sys.argv[2]))
    for line in one_sided:
        print("key:", line)
    for line in numbers:
        print("DIFF:", line)
    print(f"{len(numbers)} differing numbers or files, {len(one_sided)} one-sided keys")
    return 1 if numbers else 0


if __name__ == "__main__":
    sys.exit(main())
