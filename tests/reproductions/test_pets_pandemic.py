"""The pets_pandemic reproduction on a tiny synthetic population (tmp_path)."""
from __future__ import annotations

import json

import pytest

from fedveil.reproduce import REPRODUCTIONS, ReproductionContext, write_results
from fedveil_reproductions import pets_pandemic
from fedveil_reproductions.pets_pandemic import StudyConfig, config_for, run_study

TINY = StudyConfig(num_people=2000, num_regions=2, batch_size=32, central_epochs=2, local_epochs=1,
                   sigma_sweep=(1.0,), losses=("BCE",))


def test_registered_and_quick_config():
    assert "pets_pandemic" in REPRODUCTIONS
    quick = config_for(True)
    assert quick.num_people <= 5000 and config_for(False).num_people >= 20_000


def test_tiny_experiment_end_to_end(tmp_path):
    ctx = ReproductionContext(out_dir=tmp_path / "out", quick=True, data_root=tmp_path / "data")
    report = pets_pandemic.report(ctx, TINY, run_study(ctx, TINY, progress=False))
    assert report.figures == ["pets_pandemic.png"] and (ctx.out_dir / "pets_pandemic.png").stat().st_size > 0
    assert (ctx.runs_dir / "synthetic_pandemic_csv" / "population_network.csv").exists()
    rows = {r.setting: r for r in report.rows}
    random_row = rows["random guess (= positive rate)"]
    assert random_row.measured == pytest.approx(report.extra["runs"]["central_sigma0.01"]["positives"] / 2000)
    assert random_row.paper == pytest.approx(0.00266)
    assert any(s.startswith("federated MR-MTL (K=2") for s in rows)
    assert "σ=1: centralised / MR-MTL" in rows and "loss: BCE (centralised, σ=0.01)" in rows
    for r in report.rows:
        if r.setting.startswith("accountant check"):
            assert r.measured == pytest.approx(r.paper, rel=0.01)
    fed = report.extra["runs"]["mrmtl_sigma1"]
    assert len(fed["silos"]) == 2 and sum(s["people"] for s in fed["silos"]) == 2000
    assert all(0 < s["thm244_epsilon_code"] < s["thm244_epsilon_thesis"] for s in fed["silos"])
    capped, free = report.extra["runs"]["capped_sigma1"]["silos"][0], report.extra["runs"]["central_sigma1"]["silos"][0]
    assert capped["thm244_s"] == 21  # the a-priori cap, not the observed maximum
    assert "not a guarantee here" in rows["σ=1: centralised / MR-MTL"].verdict
    assert any("NOT a node-level guarantee" in n for n in report.scale_notes)
    assert "σ=1, centralised: uncapped / capped neighbour sampling (cap 21)" in rows
    assert any("NOT the challenge's Virginia data" in n for n in report.scale_notes)
    md, js = write_results(report, ctx.out_dir, quick=True)
    assert "SIR baseline, federated fit" in md.read_text() and json.loads(js.read_text())["quick"] is True


def test_no_positives_is_a_clear_error(tmp_path):
    ctx = ReproductionContext(out_dir=tmp_path / "out", quick=True, data_root=tmp_path / "data")
    with pytest.raises(ValueError, match="no positives in the hidden week"):
        run_study(ctx, StudyConfig(num_people=1500, num_regions=2), progress=False)  # this seed's outbreak misses the week
