"""``run(..., plots=False)``: the run directory is complete but holds no PNG; the default draws them."""
from __future__ import annotations

from fedveil.runtime import run
from tiny_runs import tiny_config


def test_plots_false_writes_every_file_but_the_pngs(tmp_path):
    config = tiny_config(federation={"rounds": 2})
    run(config, tmp_path / "plain", progress=False, plots=False)
    run(config, tmp_path / "drawn", progress=False)
    plain = {p.name for p in (tmp_path / "plain").iterdir()}
    drawn = {p.name for p in (tmp_path / "drawn").iterdir()}
    assert {"summary.json", "metrics.jsonl", "config.json"} <= plain
    assert not any(name.endswith(".png") for name in plain)
    assert drawn - plain and all(name.endswith(".png") for name in drawn - plain)
