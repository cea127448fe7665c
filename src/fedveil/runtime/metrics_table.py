"""A run's metrics as a text table (``fedveil report``): one line per evaluated round,
thinned evenly (first and last kept) when there are many, then the summary's headline."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .run_dir import SUMMARY_FILE, read_json, read_run

MAX_LINES = 25


def columns(rows: list[dict[str, Any]], score: str) -> list[str]:
    """The per-round keys shown, those present in the rows."""
    wanted = ["train_loss", f"global_test_{score}", f"global_client_{score}_worst10", f"personal_{score}_mean",
              f"personal_{score}_worst10", f"global_val_{score}", "epsilon"]
    return [k for k in wanted if any(k in r for r in rows)]


def thin(rows: list[dict[str, Any]], limit: int = MAX_LINES) -> list[dict[str, Any]]:
    """At most ``limit`` rows spread evenly over ``rows``, the first and the last included."""
    if len(rows) <= limit:
        return rows
    picks = sorted({round(i * (len(rows) - 1) / (limit - 1)) for i in range(limit)})
    return [rows[i] for i in picks]


def format_rows(rows: list[dict[str, Any]], keys: list[str]) -> str:
    """``rows`` as a right-aligned text table: the round, then ``keys`` to 4 decimals (``-`` where absent)."""
    header = ["round", *keys]
    body = [[str(r["round"])] + [f"{r[k]:.4f}" if isinstance(r.get(k), (int, float)) else "-" for k in keys]
            for r in rows]
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in [header, *body])


def run_table(path: str | Path) -> str:
    """The metrics table of run directory ``path``."""
    run, rows, config = read_run(path)
    summary = read_json(run.file(SUMMARY_FILE)) if run.file(SUMMARY_FILE).is_file() else None
    score = summary["score"] if summary else ("mse" if any(k.endswith("_mse") for r in rows for k in r) else "accuracy")
    evaluated = [r for r in rows if any(k.endswith(score) or f"_{score}_" in k for k in r)] or rows
    shown = thin(evaluated)
    planned = config["federation"]["rounds"]
    head = f"{config['algorithm']['name']} on {config['data']['name']}: {rows[-1]['round']}/{planned} rounds"
    head += "" if summary else " (not finished)"
    note = f"\n(showing {len(shown)} of {len(evaluated)} evaluated rounds; all in metrics.jsonl)" if len(shown) < len(
        evaluated) else ""
    return f"{head}\n{format_rows(shown, columns(rows, score))}{note}"
