"""fedveil on a GPU end to end, in a few minutes: the CUDA tests, the quickstart with and
without DP, and the benchmark suite on the device.

``python benchmarks/gpu_check.py [--device cuda] [--out benchmarks/results/gpu_check] [--budget 420]``

Three stages, each recorded in ``OUT/gpu_check.json`` as soon as it ends (a kill keeps
what was done):

1. ``tests``: ``pytest -m cuda`` on the files holding CUDA-marked tests (every algorithm on
   both executors, DP at both levels, a CNN under DP-SGD, a GPU run resumed on the CPU);
2. ``quickstart``: ``fedveil run examples/quickstart.toml device=DEVICE``, with DP
   (as shipped) and ``privacy.level=none``, and the DP run again on the CPU: accuracy,
   epsilon, wall time, the device recorded in ``summary.json``;
3. ``bench``: the suite (``fedveil.bench.run_suite``) on the device for MLP, LeNet and
   ResNet-8, cohorts of 10, 100 and 1000 clients, every system that is installed, smallest
   cohorts first, under a wall-time budget: cases that would start after it are recorded
   as ``skipped``. The cases run in this process (one CUDA context for all; ``--isolate``:
   a subprocess each, as the CPU suite does). Written to ``OUT/bench_<device>.json`` in ``fedveil bench --json``'s
   format.

``--device cpu`` with small sizes proves the script on a machine without a GPU
(``--clients 10 --workloads mlp --budget 60``). The run directories go to a temporary
folder; only the JSON and the log are kept.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "benchmarks" / "results" / "gpu_check"
CUDA_TEST_FILES = ("tests/runtime/test_cuda.py", "tests/runtime/test_device.py")
QUICKSTART = "examples/quickstart.toml"
SUMMARY_KEYS = ("device", "executor", "global_test_accuracy", "epsilon", "delta", "rounds", "wall_time_s")


def log(message: str) -> None:
    print(f"[gpu_check {time.strftime('%H:%M:%S')}] {message}", flush=True)


def run_tests(device: str, workers: int, timeout_s: float) -> dict[str, Any]:
    """``pytest -m cuda`` on the CUDA test files: counts, failures and the output's tail."""
    with tempfile.TemporaryDirectory(prefix="fedveil-gpu-tests-") as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider",
               f"--junitxml={junit}", *CUDA_TEST_FILES]
        if workers > 1:
            cmd += ["-n", str(workers)]
        started = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s, env=child_env())
        except subprocess.TimeoutExpired as err:
            return {"status": "timeout", "seconds": timeout_s, "output_tail": tail(err.stdout)}
        result = {"status": "passed" if proc.returncode == 0 else "failed", "exit_code": proc.returncode,
                  "seconds": round(time.monotonic() - started, 1), "output_tail": tail(proc.stdout + proc.stderr)}
        if junit.exists():
            result.update(junit_counts(junit))
        return result


def junit_counts(path: Path) -> dict[str, Any]:
    """Passed / failed / skipped counts and each failure's test id and first message line."""
    cases = ElementTree.parse(path).getroot().iter("testcase")
    counts, failures = {"passed": 0, "failed": 0, "skipped": 0}, []
    for case in cases:
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        if problem is not None:
            counts["failed"] += 1
            message = (problem.get("message") or "").strip().splitlines()
            failures.append(f"{case.get('classname')}::{case.get('name')}: {message[0][:300] if message else ''}")
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return {**counts, "failures": failures}


def run_quickstart(device: str, work: Path, label: str, items: list[str], timeout_s: float) -> dict[str, Any]:
    """One ``fedveil run`` of the quickstart: the summary's main keys and the wall time."""
    out = work / label
    cmd = [sys.executable, "-m", "fedveil", "run", QUICKSTART, "--out", str(out), "--quiet", f"device={device}", *items]
    started = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s, env=child_env())
    except subprocess.TimeoutExpired:
        return {"label": label, "status": "timeout", "seconds": timeout_s}
    record = {"label": label, "items": [f"device={device}", *items], "exit_code": proc.returncode,
              "seconds": round(time.monotonic() - started, 1)}
    summary_path = out / "summary.json"
    if proc.returncode != 0 or not summary_path.exists():
        return {**record, "status": "failed", "output_tail": tail(proc.stdout + proc.stderr)}
    summary = json.loads(summary_path.read_text())
    return {**record, "status": "ok", **{k: summary[k] for k in SUMMARY_KEYS if k in summary}}


def import_fedveil_bench():
    """fedveil's bench harness, from this checkout when fedveil is not installed."""
    if str(REPO / "src") not in sys.path:
        sys.path.insert(0, str(REPO / "src"))
    from fedveil.bench import harness

    return harness


LARGE_COHORT = 1000  # from this cohort size on, only LARGE_SYSTEMS run (the others took over 28 s a case)
LARGE_SYSTEMS = ["fedveil-vectorized", "centralised"]
# Below it: the suite's systems less these two, the threads executor (auto never picks it on CUDA) and
# auto itself (it resolves to the vectorized executor on CUDA for every suite workload:
# tests/runtime/test_cuda.py), so that the budget reaches more cohorts.
NOT_ON_GPU = ("fedveil-threads", "fedveil-auto")


def run_bench(device: str, workloads: list[str], cohorts: list[int], rounds: int | None, case_timeout: float,
              budget_s: float, path: Path, in_process: bool = True) -> dict[str, Any]:
    """The suite on ``device``, one cohort size at a time (smallest first) under ``budget_s``;
    ``path`` is rewritten after each cohort size. Cohorts of :data:`LARGE_COHORT` clients and
    more run :data:`LARGE_SYSTEMS` only (on the first H100 run the serial executor, the plain
    loop and Opacus did not finish a case in 28 s there), smaller ones every system of the
    suite but :data:`NOT_ON_GPU`.
    ``in_process``: every case in this process (one CUDA context; the subprocess each case
    got before cost ~11 s a case beyond its timed rounds on an H200: 24 cases of 10 clients
    took 357 s, 86 of them timed)."""
    harness = import_fedveil_bench()
    from fedveil.bench.workloads import SYSTEMS

    gpu_systems = [s for s in SYSTEMS if s not in NOT_ON_GPU]
    deadline, records = time.monotonic() + budget_s, []
    payload: dict[str, Any] = {"machine": harness.machine_info(device), "quick": False, "budget_s": round(budget_s),
                               "in_process": in_process}
    for clients in sorted(cohorts):
        log(f"bench: {', '.join(workloads)} at {clients} clients")
        systems = LARGE_SYSTEMS if clients >= LARGE_COHORT else gpu_systems
        records += harness.run_suite(
            False, None, systems, workloads=workloads, cohorts=[clients], rounds=rounds, timeout_s=case_timeout,
            echo=None, device=device, budget_s=max(0.0, deadline - time.monotonic()), in_process=in_process,
        )
        payload["records"] = harness.with_ratios(records)
        write_json(path, payload)
    print(harness.format_table(payload["records"]), flush=True)
    return payload


def child_env() -> dict[str, str]:
    """This environment with the checkout's ``src`` first on the path (also when fedveil is
    not installed), for the subprocesses."""
    path = os.environ.get("PYTHONPATH")
    src = str(REPO / "src")
    return {**os.environ, "PYTHONPATH": src if not path else src + os.pathsep + path}


def tail(text: str | bytes | None, chars: int = 3000) -> str:
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return (text or "")[-chars:]


def environment(device: str) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
                            "cuda_available": torch.cuda.is_available(), "cores": os.cpu_count(), "device": device}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info |= {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                 "multiprocessors": props.multi_processor_count}
    for package in ("dp-accounting", "opacus", "flwr", "pydantic", "numpy"):
        try:
            info[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            info[package] = None
    return info


def stage(report: dict[str, Any], out: Path, name: str, work: Callable[[], Any]) -> None:
    """Run one stage, record its result (or the exception) and rewrite the report at once."""
    log(f"{name}: start")
    started = time.monotonic()
    try:
        report[name] = work()
    except Exception as err:  # a broken stage is recorded; the next one still runs
        report[name] = {"status": "error", "error": f"{type(err).__name__}: {err}"}
    report.setdefault("stage_seconds", {})[name] = round(time.monotonic() - started, 1)
    write_json(out / "gpu_check.json", report)
    log(f"{name}: done in {report['stage_seconds'][name]} s")


def write_json(path: Path, payload: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(payload, indent=2) + "\n")
    partial.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu to prove the script")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for gpu_check.json and bench_<device>.json")
    parser.add_argument("--budget", type=float, default=420, help="wall-time budget of the bench stage, seconds")
    parser.add_argument("--total", type=float, help="wall-time budget of the whole check: the bench stage gets what is left")
    parser.add_argument("--case-timeout", type=float, default=60, help="seconds before one bench case is killed")
    parser.add_argument("--workloads", nargs="+", default=["mlp", "lenet", "resnet"])
    parser.add_argument("--clients", nargs="+", type=int, default=[10, 100, 1000])
    parser.add_argument("--rounds", type=int, default=2, help="measured rounds per bench case (after one warm-up)")
    parser.add_argument("--test-workers", type=int, default=4, help="pytest-xdist workers for the CUDA tests (1: none)")
    parser.add_argument("--skip", nargs="*", default=[], choices=("tests", "quickstart", "bench"))
    parser.add_argument("--isolate", action="store_true",
                        help="each bench case in a subprocess of its own (per-case RSS; up to ~11 s a case more on a GPU)")
    args = parser.parse_args(argv)

    started = time.monotonic()
    report: dict[str, Any] = {"environment": environment(args.device)}
    log(f"environment: {report['environment']}")
    if args.device.startswith("cuda") and not report["environment"]["cuda_available"]:
        print(f"gpu_check: error: device {args.device} asked for but CUDA is not available here; "
              "use --device cpu to prove the script", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="fedveil-gpu-check-") as tmp:
        work = Path(tmp)
        if "tests" not in args.skip:
            stage(report, args.out, "tests", lambda: run_tests(args.device, args.test_workers, timeout_s=240))
        if "quickstart" not in args.skip:
            stage(report, args.out, "quickstart", lambda: [
                run_quickstart(args.device, work, "dp", [], 120),
                run_quickstart(args.device, work, "no_dp", ["privacy.level=none"], 120),
                run_quickstart("cpu", work, "dp_cpu", [], 120),
            ])
        if "bench" not in args.skip:
            bench_path = args.out / f"bench_{args.device.replace(':', '')}.json"
            budget = args.budget if args.total is None else min(args.budget, args.total - (time.monotonic() - started))

            def bench() -> dict[str, Any]:
                payload = run_bench(args.device, args.workloads, args.clients, args.rounds, args.case_timeout,
                                    budget, bench_path, in_process=not args.isolate)
                statuses = [r["status"] for r in payload["records"]]
                return {"file": bench_path.name, **{s: statuses.count(s) for s in sorted(set(statuses))}}

            stage(report, args.out, "bench", bench)
    report["total_seconds"] = round(time.monotonic() - started, 1)
    write_json(args.out / "gpu_check.json", report)
    log(f"finished in {report['total_seconds']} s; wrote {args.out / 'gpu_check.json'}")
    quickstart = report.get("quickstart", [])
    failed = report.get("tests", {}).get("status") not in (None, "passed")
    failed |= not isinstance(quickstart, list) or any(q["status"] != "ok" for q in quickstart)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
