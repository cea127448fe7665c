"""The declared shape of a reproduction: a plan of run configs through the sweep runner, and
a report over their summaries (docs/reproductions.md, whose example runs here)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import fedveil.reproduce as reproduce
from fedveil.registry import Registry
from fedveil.reproduce import PlannedRun, ReproductionContext, run_plan
from fedveil.runtime.run_dir import RunDirError

DOC = Path(__file__).parents[2] / "docs" / "reproductions.md"
TINY = {"data": {"name": "digits", "num_clients": 4}, "model": {"name": "mlp"}, "algorithm": {"name": "fedavg"},
        "federation": {"rounds": 1, "clients_per_round": 2}, "checkpoint": {"every": 0}}


def test_the_documented_example_registers_runs_and_reports(tmp_path, monkeypatch):
    monkeypatch.setattr(reproduce, "REPRODUCTIONS", Registry("reproduction"))
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    exec(compile(code, str(DOC), "exec"), {})
    ctx = ReproductionContext(out_dir=tmp_path, quick=True, data_root=tmp_path)
    report = reproduce.REPRODUCTIONS.get("my_fedavg")(ctx)
    accuracy = json.loads((tmp_path / "runs" / "seed0" / "summary.json").read_text())["global_test_accuracy"]
    (row,) = report.rows
    assert row.measured == f"{accuracy:.4f} ± 0.0000 (n=1)"
    assert row.verdict == ("meets" if accuracy >= 0.80 else "below")


def test_a_plan_runs_once_keeps_finished_runs_and_refuses_another_config(tmp_path):
    plan = [PlannedRun("a", {**TINY, "seed": 0}), PlannedRun("b/nested", {**TINY, "seed": 1})]
    first = run_plan(plan, tmp_path, progress=False, plots=False)
    assert set(first) == {"a", "b/nested"} and (tmp_path / "b" / "nested" / "summary.json").is_file()
    stamp = (tmp_path / "a" / "metrics.jsonl").stat().st_mtime_ns
    assert run_plan(plan, tmp_path, progress=False, plots=False) == first  # kept, not retrained
    assert (tmp_path / "a" / "metrics.jsonl").stat().st_mtime_ns == stamp
    with pytest.raises(RunDirError, match="seed"):
        run_plan([PlannedRun("a", {**TINY, "seed": 5})], tmp_path, progress=False)


def test_a_plan_is_checked_whole_before_any_run(tmp_path):
    from fedveil.config import ConfigError

    with pytest.raises(ValueError, match="twice"):
        run_plan([PlannedRun("a", TINY), PlannedRun("a", TINY)], tmp_path)
    with pytest.raises(ConfigError, match="rounds"):
        run_plan([PlannedRun("ok", TINY), PlannedRun("bad", {**TINY, "federation": {"rounds": 0}})], tmp_path)
    assert not (tmp_path / "ok").exists()
