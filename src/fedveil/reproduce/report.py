"""What a reproduction returns and writes: rows of measured numbers beside the paper's,
with a verdict each, notes on what differs from the paper, raw measurements and figures.
:func:`write_results` turns a report into ``results.md`` and ``results.json``.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any


@dataclass
class ResultRow:
    """One compared quantity: what was measured and what the paper reports or claims."""

    setting: str
    metric: str
    measured: float | str
    paper: float | str
    verdict: str = ""  # e.g. "meets claim", "below paper by 1.2 points"


@dataclass
class ReproductionReport:
    """A reproduction's outcome: its rows, what was scaled down or substituted, raw data, figures."""

    title: str
    source: str  # paper / spec section the numbers come from
    rows: list[ResultRow]
    scale_notes: list[str] = field(default_factory=list)  # what was scaled down or substituted
    extra: dict[str, Any] = field(default_factory=dict)  # raw measurements (per seed, curves...)
    figures: list[str] = field(default_factory=list)  # PNG files written next to results.md


def _cell(value: float | str) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


QUICK_BANNER = (
    "**Quick mode: a smoke test, not a reproduction.** Fewer seeds, rounds and rows than the "
    "protocol, so the numbers say nothing about the paper's claims: no verdicts are given. "
    "Run without `--quick` for the reproduction."
)
SINGLE_SEED_SPREAD = re.compile(r"\s*±\s*[-+0-9.eE]+\s*\(n=1\)")  # a spread over one seed means nothing


def quick_report(report: ReproductionReport) -> ReproductionReport:
    """``report`` as a smoke test shows it: no verdicts, no '± 0 (n=1)' spreads."""
    rows = [replace(r, verdict="", measured=_no_spread(r.measured), paper=_no_spread(r.paper)) for r in report.rows]
    return replace(report, rows=rows)


def _no_spread(value: float | str) -> float | str:
    return SINGLE_SEED_SPREAD.sub("", value) if isinstance(value, str) else value


def results_markdown(report: ReproductionReport, quick: bool) -> str:
    """``results.md``: the rows beside the paper's (verdicts unless quick), what differs, the figures."""
    lines = [f"# {report.title}", "", f"Source: {report.source}", ""]
    if quick:
        lines += [QUICK_BANNER, "", "| setting | metric | measured | paper |", "|---|---|---|---|"]
        lines += [f"| {r.setting} | {r.metric} | {_cell(r.measured)} | {_cell(r.paper)} |" for r in report.rows]
    else:
        lines += ["| setting | metric | measured | paper | verdict |", "|---|---|---|---|---|"]
        lines += [f"| {r.setting} | {r.metric} | {_cell(r.measured)} | {_cell(r.paper)} | {r.verdict} |" for r in report.rows]
    if report.scale_notes:
        lines += ["", "## What differs from the paper", ""] + [f"- {n}" for n in report.scale_notes]
    if report.figures:
        lines += ["", "## Figures", ""] + [f"![{f}]({f})" for f in report.figures]
    return "\n".join(lines) + "\n"


QUICK_ROOT = Path("runs") / "reproduce-quick"  # where --quick writes by default: never over committed results


def output_folder(name: str, out: str | None, quick: bool) -> Path:
    """Where ``fedveil reproduce NAME`` writes: ``--out``, else ``results/NAME`` (full) or
    ``runs/reproduce-quick/NAME`` (quick). A quick run into a folder holding full results is
    refused (ValueError): they would be overwritten by a smoke test."""
    folder = Path(out) if out else (QUICK_ROOT / name if quick else Path("results") / name)
    saved = folder / "results.json"
    if quick and saved.is_file() and json.loads(saved.read_text()).get("quick") is False:
        raise ValueError(
            f"'{folder}' holds the full results of {name}; a --quick run would overwrite them: "
            f"leave out --out (quick runs go to {QUICK_ROOT / name}) or choose another folder"
        )
    return folder


def write_results(report: ReproductionReport, out_dir: Path, quick: bool) -> tuple[Path, Path]:
    """Write ``results.md`` and ``results.json`` into ``out_dir`` (a quick report without
    verdicts: :func:`quick_report`)."""
    if quick:
        report = quick_report(report)
    out_dir.mkdir(parents=True, exist_ok=True)
    md, js = out_dir / "results.md", out_dir / "results.json"
    md.write_text(results_markdown(report, quick))
    js.write_text(json.dumps({"quick": quick, **asdict(report)}, indent=2) + "\n")
    return md, js
