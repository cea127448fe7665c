"""ecos_sweeps (ECOS Figs. D.1-D.2): verdicts that follow hand-made numbers, and a quick run
whose selections are checked against their own budgets and domains."""
from __future__ import annotations

import pytest
import torch

from fedveil.reproduce import REPRODUCTIONS, ReproductionContext, write_results
from fedveil_reproductions import ecos_sweeps as es

torch.set_num_threads(1)
STUDY = es.SweepStudy(R_grid=[10, 100], s_grid=[1.0, 3.0], budgets=[20, 100], paper_budgets=[1000, 8000],
                      domains=[0], seeds=[1, 2])


def records(share: dict[tuple[int, float, int], float], selected: dict[tuple[int, float, int], int]) -> list[dict]:
    return [{"domain": 0, "seed": seed, "R": R, "s": s, "budget": b, "counts": kind, "id_share": share[(R, s, b)],
             "selected": selected.get((R, s, b), b), "pool_id_share": 0.1, "client_rows": 30}
            for (R, s, b) in share for seed in (1, 2) for kind in ("noisy", "exact")]


def verdicts(rows) -> dict[str, str]:
    return {r.metric: r.verdict for r in rows}


def test_verdicts_follow_the_numbers():
    # the paper's picture: R = 100 best at the small budget, R = 10 at the large one; s = 3 raises the share
    # at the small budget and runs out of rows at the large one
    share = {(10, 1.0, 20): 0.2, (100, 1.0, 20): 0.4, (10, 1.0, 100): 0.3, (100, 1.0, 100): 0.25,
             (100, 3.0, 20): 0.6, (100, 3.0, 100): 0.5}
    got = verdicts(es.rows_of(STUDY, records(share, {(100, 3.0, 100): 40})))
    assert got["a small budget wants a larger R: best R at B=20 >= best R at B=100"] == "holds"
    assert got["at B=100 the largest R (100) is not the best (noise on small counts)"] == "holds"
    assert got["a larger s raises the ID share at B=20: s = 3 above s = 1"] == "holds"
    assert got["at B=100 s = 1 selects more samples than s = 3"] == "holds"
    assert got["the upload's epsilon at every R (one upload, whatever R, s or B)"] == "holds"
    # the opposite picture
    flipped = {k: 1.0 - v for k, v in share.items()}
    got = verdicts(es.rows_of(STUDY, records(flipped, {})))
    assert got["a small budget wants a larger R: best R at B=20 >= best R at B=100"] == "does not hold"
    assert got["at B=100 the largest R (100) is not the best (noise on small counts)"] == "does not hold"
    assert got["a larger s raises the ID share at B=20: s = 3 above s = 1"] == "does not hold"
    assert got["at B=100 s = 1 selects more samples than s = 3"] == "does not hold"  # equal counts are not fewer


def test_the_study_needs_its_own_R_and_s_one():
    with pytest.raises(ValueError, match="R_grid must hold the study's R = 100"):
        es.SweepStudy(R_grid=[10, 25])


def test_the_quick_run_selects_within_budget_from_one_upload_per_R(tmp_path, mnist_data_root):
    ctx = ReproductionContext(out_dir=tmp_path, quick=True, data_root=mnist_data_root)
    report = REPRODUCTIONS.get("ecos_sweeps")(ctx)
    write_results(report, tmp_path, quick=True)
    runs = report.extra["records"]
    # R in {5, 100} at s = 1, and s = 5 at R = 100; two budgets; noisy and exact counts
    assert sorted({(r["R"], r["s"]) for r in runs}) == [(5, 1.0), (100, 1.0), (100, 5.0)]
    assert len(runs) == 3 * 2 * 2
    for r in runs:
        assert 0 <= r["selected"] <= r["budget"] and 0.0 <= r["id_share"] <= 1.0
        assert r["client_rows"] == 30 and r["pool_id_share"] == pytest.approx(30 / 270)
    # exact counts of the same client: the same pool and counts at every budget, so a larger budget selects more
    exact = {(r["R"], r["s"], r["budget"]): r["selected"] for r in runs if r["counts"] == "exact"}
    assert all(exact[(R, s, 20)] <= exact[(R, s, 100)] for R, s in [(5, 1.0), (100, 1.0), (100, 5.0)])
    assert (tmp_path / "ecos_sweeps.png").stat().st_size > 0
