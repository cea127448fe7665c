"""Run benchmark cases, each in its own subprocess, and report seconds/round and peak memory.

``run_suite`` spawns ``python -m fedveil.bench.harness --one CASE --out FILE`` per case,
one at a time. The child times the rounds and reports its own peak RSS
(``getrusage``); the parent samples the proportional set size (PSS) of the child's whole
process tree (Ray workers included) every ``POLL_S`` seconds as ``tree_peak_mib``.

``in_process=True`` runs the cases (Flower's excepted: Ray's processes stay isolated) in
the suite's own process instead: torch, the CUDA context and fedveil are loaded once, which
on a GPU machine saves up to ~11 s a case, at the cost of per-case RSS (not recorded; a GPU
case's ``gpu_peak_mib`` is, its peak statistics reset before it) and of a hard kill (a case
stops after the round that passes its time limit).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from . import baselines
from .workloads import Case, suite

POLL_S = 1.0  # reading a tree's PSS walks its page tables (18 ms for 850 MB): at 0.2 s the runs measured were 5% slower
QUICK_TIMEOUT_S = 300
FULL_TIMEOUT_S = 3600
QUICK_THREADS = 1  # --quick: one torch thread per subprocess, steady on small or busy machines


# --- child side ---------------------------------------------------------------------------


def run_one(case: Case) -> dict[str, Any]:
    """Run ``case`` in this process: the record without memory-of-the-tree fields."""
    import torch

    if case.threads is not None:
        torch.set_num_threads(case.threads)
    device = baselines.case_device(case)
    record = {
        **case.record(), "device": str(device), "status": "ok", "note": "", "torch_threads": torch.get_num_threads(),
    }
    try:
        times = baselines.runner(case.system)(case)
    except baselines.Unavailable as err:
        return {**record, "status": "n/a", "note": str(err)}
    import resource  # Unix only: the suite runs on Linux and macOS

    measured = times[case.warmup :]
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {
        **record,
        "seconds_per_round": statistics.median(measured),
        "round_seconds": times,
        "peak_mib": peak_kib / 1024,
    }
    if device.type == "cuda":  # this process's tensors on the GPU (not other processes', e.g. Ray actors')
        out["gpu_peak_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out


def _child(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedveil.bench.harness")
    parser.add_argument("--one", required=True, help="the case as JSON")
    parser.add_argument("--out", required=True, help="where to write the record as JSON")
    args = parser.parse_args(argv)
    case = Case(**json.loads(args.one))
    try:
        record = run_one(case)
    except Exception as err:  # reported, not raised: the suite goes on
        traceback.print_exc()
        record = {**case.record(), "status": "error", "note": f"{type(err).__name__}: {err}"}
    Path(args.out).write_text(json.dumps(record))
    return 0


# --- parent side --------------------------------------------------------------------------


def tree_pss_mib(pid: int) -> float:
    """PSS (RSS where PSS is unreadable) of ``pid`` and all its descendants, in MiB."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    total_kib, stack = 0, [pid]
    while stack:
        p = stack.pop()
        stack += children.get(p, [])
        total_kib += _pss_kib(p)
    return total_kib / 1024


def _pss_kib(pid: int) -> int:
    for path, key in ((f"/proc/{pid}/smaps_rollup", "Pss:"), (f"/proc/{pid}/status", "VmRSS:")):
        try:
            for line in Path(path).read_text().splitlines():
                if line.startswith(key):
                    return int(line.split()[1])
        except (OSError, ValueError):
            continue
    return 0


ISOLATED_SYSTEMS = ("flower",)  # always in a subprocess: Ray starts processes of its own


def run_in_process(case: Case, timeout_s: float) -> dict[str, Any]:
    """Run ``case`` in this process (module doc); never raises for a failing case. Torch's
    thread count is restored after it, and the GPU's cached memory released."""
    import gc

    import torch

    device = baselines.case_device(case)
    threads = torch.get_num_threads()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    try:
        with baselines.deadline(time.monotonic() + timeout_s):
            record = run_one(case)
    except baselines.CaseTimeout as err:
        return {**case.record(), "status": "timeout", "note": str(err), "isolation": "in-process"}
    except Exception as err:  # reported, not raised: the suite goes on
        return {**case.record(), "status": "error", "note": f"{type(err).__name__}: {err}", "isolation": "in-process"}
    finally:
        torch.set_num_threads(threads)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if record["status"] == "ok":
        record["peak_mib"] = None  # the process's peak RSS spans every case run before this one
    return {**record, "isolation": "in-process"}


def run_case(case: Case, timeout_s: float) -> dict[str, Any]:
    """Run ``case`` in a fresh subprocess; never raises for a failing case."""
    with tempfile.TemporaryDirectory(prefix="fedveil-bench-") as tmp:
        out, log = Path(tmp) / "record.json", Path(tmp) / "log.txt"
        cmd = [sys.executable, "-m", "fedveil.bench.harness", "--one", json.dumps(case.to_dict()), "--out", str(out)]
        with open(log, "w") as log_file:
            proc = subprocess.Popen(
                cmd, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True, env=_child_env()
            )
            try:
                tree_peak, timed_out = _watch(proc, timeout_s)
            except BaseException:  # Ctrl-C: the child is in its own session, stop it too
                os.killpg(proc.pid, signal.SIGKILL)
                raise
        if timed_out:
            return {**case.record(), "status": "timeout", "note": f"killed after {timeout_s:.0f} s"}
        if not out.exists():
            tail = log.read_text()[-500:].strip().replace("\n", " | ")
            return {**case.record(), "status": "error", "note": f"exit code {proc.returncode}: {tail}"}
        record = json.loads(out.read_text())
    if record["status"] == "ok":
        record["tree_peak_mib"] = max(tree_peak, record["peak_mib"])
    return record


def _watch(proc: subprocess.Popen, timeout_s: float) -> tuple[float, bool]:
    """Wait for ``proc``, sampling its tree's memory; kill its process group at the deadline."""
    tree_peak, deadline = 0.0, time.monotonic() + timeout_s
    while proc.poll() is None:
        if os.path.isdir("/proc"):
            tree_peak = max(tree_peak, tree_pss_mib(proc.pid))
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return tree_peak, True
        try:
            proc.wait(timeout=POLL_S)
        except subprocess.TimeoutExpired:
            pass
    return tree_peak, False


def _child_env() -> dict[str, str]:
    """This environment, with this fedveil first on the path (also when not installed)."""
    import fedveil

    src = str(Path(fedveil.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": src if not path else src + os.pathsep + path}


def precheck(case: Case) -> str | None:
    """Why ``case`` cannot run here (reported as n/a without a subprocess), else None."""
    if case.system.startswith("fedveil-"):
        return baselines.fedveil_executor_available(case.system.removeprefix("fedveil-"))
    baselines.runner(case.system)  # unknown names raise ValueError before anything runs
    missing = baselines.missing_dependency(case.system)
    return None if missing is None else f"{missing} not installed"


def machine_info(device: str = "auto") -> dict[str, Any]:
    """What the timings ran on: CPU and cores, torch threads and versions, platform and the resolved ``device``."""
    import torch

    from ..runtime.device import resolve_device

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(
            line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    resolved = resolve_device(device)
    return {
        "cpu": cpu, "cores": os.cpu_count(), "torch_default_threads": torch.get_num_threads(),
        "torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": str(resolved), "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(resolved) if resolved.type == "cuda" else None,
    }


def run_suite(
    quick: bool,
    json_path: str | None,
    systems: list[str] | None = None,
    workloads: list[str] | None = None,
    *,
    cohorts: list[int] | None = None,
    rounds: int | None = None,
    dp: bool | None = None,
    threads: int | None = None,
    timeout_s: float | None = None,
    echo: Callable[[str], None] | None = print,
    device: str = "auto",
    budget_s: float | None = None,
    in_process: bool = False,
) -> list[dict[str, Any]]:
    """Run the quick or full suite (optionally restricted), print a table, write JSON.

    ``cohorts``, ``rounds`` and ``dp`` (only the non-private / DP-SGD variants) restrict
    the suite further; ``threads`` fixes torch's threads in every subprocess (default: 1
    for the quick suite, torch's default for the full one; 0: torch's default); ``device``
    (auto, cpu, cuda, cuda:N) is where every system computes, checked here before any case
    runs (:class:`~fedveil.errors.ConfigError` for CUDA on a machine without it);
    ``budget_s`` caps the suite's wall time: no case starts once it is spent, none runs past
    it, and those left are recorded as ``skipped``; ``in_process`` runs the cases in this
    process (module doc). Returns one
    record per (workload, system, clients, dp): ``seconds_per_round`` (median of the
    measured rounds), ``peak_mib`` (the subprocess's max RSS), ``tree_peak_mib``,
    ``status`` (ok, n/a, error, timeout, skipped) and ``note``, plus ``ref_speedup``.
    """
    timeout_s = timeout_s or (QUICK_TIMEOUT_S if quick else FULL_TIMEOUT_S)
    machine = machine_info(device)  # resolves the device: fails early without CUDA
    if threads is None:
        threads = QUICK_THREADS if quick else None
    planned = suite(quick, systems, workloads, cohorts, rounds, dp, threads or None, device)
    cases = [c for c in planned if baselines.supports(c.system, c.dp)]
    records, deadline = [], None if budget_s is None else time.monotonic() + budget_s
    for case in cases:
        left = math.inf if deadline is None else deadline - time.monotonic()
        reason = precheck(case)
        if reason:
            record = {**case.record(), "status": "n/a", "note": reason}
        elif left <= 0:
            record = {**case.record(), "status": "skipped", "note": f"the suite's budget of {budget_s:.0f} s was spent"}
        elif in_process and case.system not in ISOLATED_SYSTEMS:
            record = run_in_process(case, min(timeout_s, left))
        else:
            record = run_case(case, min(timeout_s, left))
        records.append(record)
        if echo is not None:
            print(_progress(record), file=sys.stderr, flush=True)
    records = with_ratios(records)
    if echo is not None:
        echo(format_table(records))
    if json_path is not None:
        payload = {"machine": machine, "quick": quick, "records": records}
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(payload, indent=2) + "\n")
    return records


def _progress(r: dict[str, Any]) -> str:
    what = f"{r['workload']}{'+dp' if r['dp'] else ''} x{r['clients']} {r['system']}"
    if r["status"] == "ok":
        return f"[bench] {what}: {r['seconds_per_round']:.3f} s/round, {r['peak_mib']:.0f} MiB"
    return f"[bench] {what}: {r['status']} ({short(r['note'])})"


# --- report ---------------------------------------------------------------------------------

REFERENCES = ("fedveil-vectorized", "fedveil-serial")  # the first that ran is a group's reference


def with_ratios(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add ``ref_system`` and ``ref_speedup`` (system's s/round / reference's s/round) per
    (workload, clients, dp) group: how many times faster fedveil is than that system."""
    ok = {(r["workload"], r["clients"], r["dp"], r["system"]): r for r in records if r["status"] == "ok"}
    out = []
    for r in records:
        group = (r["workload"], r["clients"], r["dp"])
        ref = next((ok[(*group, s)] for s in REFERENCES if (*group, s) in ok), None)
        r = dict(r)
        if ref is not None and r["status"] == "ok":
            r["ref_system"] = ref["system"]
            r["ref_speedup"] = r["seconds_per_round"] / ref["seconds_per_round"]
        out.append(r)
    return out


COLUMNS = (("workload", 9), ("dp", 3), ("clients", 7), ("steps", 5), ("system", 18), ("s/round", 9), ("peak MiB", 8),
           ("tree MiB", 8), ("ref speedup", 11))


def short(note: str, width: int = 100) -> str:
    """The first line of ``note``, cut to ``width`` characters (the JSON keeps it whole)."""
    line = note.strip().splitlines()[0] if note.strip() else ""
    return line if len(line) <= width else line[: width - 3] + "..."


def format_table(records: list[dict[str, Any]]) -> str:
    """A fixed-width table of the records, with a legend."""
    lines = ["  ".join(f"{name:>{w}}" if i > 4 else f"{name:<{w}}" for i, (name, w) in enumerate(COLUMNS)) + "  note"]
    lines.append("-" * len(lines[0]))
    for r in records:
        ok = r["status"] == "ok"
        speedup = ""
        if "ref_speedup" in r:
            mark = "" if r["ref_system"] == REFERENCES[0] else "*"
            speedup = f"{r['ref_speedup']:.2f}x{mark}"
        cells = [
            r["workload"], "yes" if r["dp"] else "no", str(r["clients"]), str(r["steps"]), r["system"],
            f"{r['seconds_per_round']:.4f}" if ok else r["status"],
            f"{r['peak_mib']:.0f}" if ok and r["peak_mib"] is not None else "",
            f"{r['tree_peak_mib']:.0f}" if "tree_peak_mib" in r else "",
            speedup,
        ]
        row = "  ".join(f"{c:>{w}}" if i > 4 else f"{c:<{w}}" for i, (c, (_, w)) in enumerate(zip(cells, COLUMNS)))
        lines.append(row + ("  " + short(r["note"]) if r.get("note") else ""))
    lines += [
        "",
        "steps: local SGD steps per client per round (batch 32, 4 for tiny). s/round: median wall-clock seconds",
        "of the measured rounds after one warm-up round. peak MiB: max RSS of the system's subprocess;",
        "tree MiB: peak PSS of its whole process tree (Ray workers included), sampled every 1 s;",
        "both blank for a case run in the suite's own process (in_process=True).",
        f"ref speedup: system's s/round / {REFERENCES[0]}'s in the same (workload, dp, clients) group,",
        f"i.e. how many times faster fedveil is; * = relative to {REFERENCES[1]} ({REFERENCES[0]} did not run).",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
