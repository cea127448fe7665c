"""The mrmtl_mean_estimation reproduction (quick mode, into tmp_path)."""
from __future__ import annotations

import json

import pytest

from fedveil.reproduce import REPRODUCTIONS, ReproductionContext, write_results
from fedveil_reproductions.mrmtl_mean_estimation import (
    PAPER,
    QUANTITIES,
    SETTINGS,
    TAUS,
)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("mrmtl")
    report = REPRODUCTIONS.get("mrmtl_mean_estimation")(ReproductionContext(out_dir=out, quick=True, data_root=out))
    write_results(report, out, quick=True)
    return out, report


def test_writes_results_and_figure(quick_run):
    out, report = quick_run
    assert (out / "results.md").read_text().startswith("# MR-MTL for private federated mean estimation")
    assert report.figures == ["mrmtl_mean_estimation.png"]
    assert (out / report.figures[0]).stat().st_size > 10_000
    data = json.loads((out / "results.json").read_text())
    assert data["quick"] is True
    assert data["extra"]["z"] == pytest.approx(PAPER["z"], rel=1e-4)


def test_closed_forms_match_the_spec_table(quick_run):
    _, report = quick_run
    by_tau = {t["tau"]: t for t in report.extra["taus"]}
    assert sorted(PAPER["spec_6_3"]) == sorted(f"{tau:g}" for tau in TAUS)
    for tau in TAUS:
        for setting in SETTINGS:
            spec, closed = PAPER["spec_6_3"][f"{tau:g}"][setting], by_tau[tau][setting]["closed_form"]
            assert sorted(spec) == sorted(QUANTITIES)
            for name in QUANTITIES:
                assert closed[name] == pytest.approx(spec[name], rel=1e-3), (tau, setting, name)


def test_monte_carlo_rows_agree_with_the_closed_forms(quick_run):
    _, report = quick_run
    by_tau = {t["tau"]: t for t in report.extra["taus"]}
    mc_rows = [r for r in report.rows if r.metric.startswith("Monte-Carlo E(")]
    assert len(mc_rows) == 3 * 2 * len(TAUS)
    for row in mc_rows:
        assert row.verdict.startswith("vs closed form agrees"), row
        tau = float(row.setting.split(",")[0].removeprefix("tau="))
        setting = row.setting.split(", ")[1]
        key = {"E(lam*)": "E_star", "E(0) = local": "E_loc", "E(inf) = FedAvg": "E_fed"}[row.metric.removeprefix("Monte-Carlo ")]
        closed = by_tau[tau][setting]["closed_form"][key]
        assert row.measured == pytest.approx(closed, rel=0.06), row  # 500 trials, clip 1 when private
        assert row.paper == pytest.approx(closed, rel=1e-3)


def test_claims_are_checked_and_hold(quick_run):
    _, report = quick_run
    claims = [r for r in report.rows if r.metric.startswith(("claim", "Fig. 1.7", "per-silo lam_k*"))]
    assert len(claims) == 6 + 1 + 3
    for row in claims:
        assert "reproduced" in row.verdict and "NOT" not in row.verdict, row
    closed_rows = [r for r in report.rows if r.metric.startswith("closed form sigma_loc²")]
    assert len(closed_rows) == 6 and all(r.verdict == "matches §6.3 to printed precision" for r in closed_rows)
