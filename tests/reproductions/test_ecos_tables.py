"""ecos_digits (ECOS Table 5.2 protocol): the client / cloud splits by hand, verdicts that
follow hand-made numbers, and an end-to-end quick run on tiny MNIST files."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from fedveil.ecos.pipeline import PRIVATE_METHODS
from fedveil.reproduce import REPRODUCTIONS, ReproductionContext, write_results
from fedveil_reproductions import ecos_tables as et

torch.set_num_threads(1)

# Ten rows of three domains; domain 0 holds rows 0, 1, 5, 8, 9.
DOMAIN = np.array([0, 0, 1, 1, 1, 0, 2, 1, 0, 0])


def test_ood_split_gives_the_client_its_domain_and_the_cloud_the_rest():
    client, cloud = et.split_rows(DOMAIN, 0, "OoD", np.random.default_rng(0))
    np.testing.assert_array_equal(client, [0, 1, 5, 8, 9])
    np.testing.assert_array_equal(cloud, [2, 3, 4, 6, 7])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_id_ood_split_gives_the_client_half_its_domain(seed):
    client, cloud = et.split_rows(DOMAIN, 0, "ID+OoD", np.random.default_rng(seed))
    assert client.size == 2 and cloud.size == 8  # floor(5 / 2) rows; the other 3 stay in the cloud with the 5 others
    assert set(client) <= {0, 1, 5, 8, 9} and not set(client) & set(cloud)
    assert sorted([*client, *cloud]) == list(range(10))
    assert list(client) == sorted(client) and list(cloud) == sorted(cloud)
    again, _ = et.split_rows(DOMAIN, 0, "ID+OoD", np.random.default_rng(seed))
    np.testing.assert_array_equal(client, again)


def test_id_split_keeps_the_cloud_inside_the_client_domain():
    client, cloud = et.split_rows(DOMAIN, 0, "ID", np.random.default_rng(1))
    same_half, _ = et.split_rows(DOMAIN, 0, "ID+OoD", np.random.default_rng(1))
    np.testing.assert_array_equal(client, same_half)  # the same client half as ID+OoD for a seed
    assert client.size == 2 and cloud.size == 3 and sorted([*client, *cloud]) == [0, 1, 5, 8, 9]


def test_split_errors():
    with pytest.raises(ValueError, match="unknown cloud setting 'IID'"):
        et.split_rows(DOMAIN, 0, "IID", np.random.default_rng(0))
    with pytest.raises(ValueError, match="client domain 2 has 1 rows"):
        et.split_rows(DOMAIN, 2, "OoD", np.random.default_rng(0))
    with pytest.raises(ValueError, match="ablation_budget 7 must be one of the budgets"):
        et.ECOSStudy(budgets=[10], paper_budgets=[2000], ablation_budget=7)
    with pytest.raises(ValueError, match="ablation_R 100 must be a positive R other than the study's 100"):
        et.ECOSStudy(ablation_R=100)
    with pytest.raises(ValueError, match="unknown feature extractor 'resnet18'"):
        et.ECOSStudy(diagnostic_extractors={"resnet": ("resnet18", {})})


def test_the_study_runs_the_ablations_with_their_own_settings():
    study = et.ECOSStudy()
    assert study.ecos.extractor == "hog_color" and study.ecos.cap == "cluster_size" and study.ecos.R == 100
    assert et.runs_of(study, "ID+OoD")[-3:] == [(1000, "proximity"), (1000, et.POOL_SHARE), (1000, "ecos_R25")]
    assert all(m in ("ecos", "k_center", "random") for _, m in et.runs_of(study, "OoD"))
    assert study.settings_of(et.POOL_SHARE) == dataclasses.replace(study.ecos, cap="pool_share")
    assert study.settings_of("ecos_R25") == dataclasses.replace(study.ecos, R=25)
    assert study.settings_of("ecos") == study.settings_of(et.MATCHED) == study.ecos
    assert [et.selector(m) for m in ("ecos", et.MATCHED, et.POOL_SHARE, "ecos_R25", "proximity")] == [
        "ecos", "random", "ecos", "ecos", "proximity"]
    assert et.label("ecos_R25") == "ECOS (R = 25)" and et.label(et.POOL_SHARE) == "ECOS (pool-share cap, as printed)"
    bare = et.ECOSStudy(pool_share_row=False, ablation_R=None)
    assert et.runs_of(bare, "ID+OoD")[-1] == (1000, "proximity")


STUDY = et.ECOSStudy(clouds=["ID+OoD"], domains=[0, 1], budgets=[10], paper_budgets=[2000], ablation_budget=10,
                     seeds=[1, 2])


def records(acc: dict[str, list[float]], share: dict[str, float], epsilon: dict[int, float] | None = None) -> list[dict]:
    """Two domains x two seeds per method; ``acc[method]`` holds the per-seed accuracy (both domains alike)."""
    out = []
    for method, values in acc.items():
        for seed, value in zip(STUDY.seeds, values):
            for d in STUDY.domains:
                out.append({"cloud": "ID+OoD", "domain": d, "seed": seed, "budget": 10, "method": method, "accuracy": value,
                            "id_share": share.get(method, 0.0), "selected": 10,
                            "epsilon": (epsilon or {}).get(seed, 0.1) if method == "ecos" else 0.0})
    return out


def claims(rows) -> dict[str, str]:
    return {r.metric: r.verdict for r in rows}


def test_verdicts_follow_the_numbers():
    good = records({"ecos": [0.80, 0.82], "random": [0.70, 0.71], "k_center": [0.60, 0.62], et.MATCHED: [0.50, 0.52],
                    "proximity": [0.40, 0.41], et.POOL_SHARE: [0.75, 0.77], "ecos_R25": [0.90, 0.90]},
                   {"ecos": 0.6, "random": 0.1, et.POOL_SHARE: 0.7, "ecos_R25": 0.8})
    verdicts = claims(et.claim_rows(STUDY, good))
    assert verdicts["ECOS >= Random (average accuracy %)"] == "holds"
    assert verdicts["ECOS >= K-Center (average accuracy %)"] == "holds"
    assert verdicts["ECOS >= Random (ECOS's count) (average accuracy %)"] == "holds"
    assert verdicts["in-distribution share % of the selection: ECOS > Random"] == "holds"
    assert verdicts["Random > proximity-only (average accuracy %)"] == "holds"
    assert verdicts["ECOS > proximity-only (average accuracy %)"] == "holds"
    rows = {r.metric: r for r in et.claim_rows(STUDY, good)}  # shown higher side first, as claimed
    assert rows["ECOS >= Random (average accuracy %)"].measured.startswith("81.00 vs 70.50 (diff +10.50")
    assert rows["ECOS >= Random (average accuracy %)"].paper == "82.3 vs 81.4"
    assert rows["Random > proximity-only (average accuracy %)"].measured.startswith("70.50 vs 40.50 (diff +30.00")
    assert rows["Random > proximity-only (average accuracy %)"].paper == "40.4 vs 35.2 (Table 5.5, DomainNet)"
    # The variants are compared with ECOS, without a verdict: ECOS first.
    variant = rows["ECOS vs ECOS (pool-share cap, as printed): average accuracy %"]
    assert variant.measured.startswith("81.00 vs 76.00 (diff +5.00") and variant.verdict == "comparison, not a claim"
    assert rows["ECOS vs ECOS (R = 25): in-distribution share %"].measured.startswith("60.00 vs 80.00 (diff -20.00")
    assert rows["ECOS vs ECOS (R = 25): samples selected"].measured == "10.0 vs 10.0"

    bad = records({"ecos": [0.50, 0.52], "random": [0.70, 0.71], "k_center": [0.51, 0.50], et.MATCHED: [0.50, 0.52],
                   "proximity": [0.90, 0.91], et.POOL_SHARE: [0.5, 0.5], "ecos_R25": [0.5, 0.5]},
                  {"ecos": 0.1, "random": 0.1})
    verdicts = claims(et.claim_rows(STUDY, bad))
    assert verdicts["ECOS >= Random (average accuracy %)"] == "does not hold"
    assert verdicts["ECOS >= K-Center (average accuracy %)"] == "holds"  # 0.51 vs 0.505: at least
    assert verdicts["in-distribution share % of the selection: ECOS > Random"] == "does not hold"  # equal is not above
    assert verdicts["Random > proximity-only (average accuracy %)"] == "does not hold"


def test_epsilon_must_be_the_same_at_every_budget():
    same = records({"ecos": [0.8, 0.8]}, {})
    [ours, paper, baselines] = et.privacy_rows(STUDY, same)
    assert ours.verdict == "constant in B: holds" and ours.measured == "B=10: 0.1000"
    assert float(paper.measured) == pytest.approx(0.2152, abs=5e-4) and paper.verdict == "matches (within 0.01)"
    assert baselines.measured == "0.0000" and baselines.verdict == "matches"
    drift = records({"ecos": [0.8, 0.8]}, {}, epsilon={1: 0.1, 2: 0.2})
    assert et.privacy_rows(STUDY, drift)[0].verdict == "constant in B: does not hold"


def test_diagnostic_rows_report_the_shares_and_check_the_choice():
    study = et.ECOSStudy(domains=[0, 1], budgets=[10], paper_budgets=[2000], ablation_budget=10)
    shares = {"pixels": (0.5, 0.7), "hog": (0.2, 0.4), "hog_color": (0.6, 0.8)}
    diagnostic = [{"extractor": name, "domain": d, "budget": 10, "selected": 10, "id_share": share[d],
                   "pool_id_share": 0.1} for name, share in shares.items() for d in (0, 1)]
    rows = et.diagnostic_rows(study, diagnostic)
    assert [r.measured for r in rows[:3]] == ["50.0 / 70.0 / 60.0", "20.0 / 40.0 / 30.0", "60.0 / 80.0 / 70.0"]
    assert "(pool: 10.0%)" in rows[0].metric and "exact counts" in rows[0].setting
    assert rows[-1].measured == "pixels: 60.0%; hog: 30.0%; hog_color: 70.0%" and rows[-1].verdict == "holds"
    hog = dataclasses.replace(study, ecos=dataclasses.replace(study.ecos, extractor="hog"))
    assert et.diagnostic_rows(hog, diagnostic)[-1].verdict == "does not hold (best: hog_color)"
    assert et.diagnostic_rows(study, []) == []


def test_the_quick_run_writes_results_and_the_figure(tmp_path, mnist_data_root):
    ctx = ReproductionContext(out_dir=tmp_path, quick=True, data_root=mnist_data_root)
    # 60 training + 20 test rows for each of the 5 domains: the fixture's 300 + 100 MNIST rows exactly.
    assert et.study(ctx).rows_per_domain * 5 + et.study(ctx).test_rows_per_domain * 5 == 400
    report = REPRODUCTIONS.get("ecos_digits")(ctx)
    write_results(report, tmp_path, quick=True)
    runs = report.extra["records"]
    # per cloud: ECOS, its matched Random, K-Center, Random; on ID+OoD proximity-only and the two ECOS variants
    assert sorted((r["cloud"], r["method"]) for r in runs) == sorted(
        [(c, m) for c in et.CLOUDS for m in ("ecos", et.MATCHED, "k_center", "random")]
        + [("ID+OoD", m) for m in ("proximity", et.POOL_SHARE, "ecos_R25")])
    for r in runs:
        assert r["selected"] <= r["budget"] == 50 and r["domain"] == 1
        assert r["client_rows"] == (30 if r["cloud"] == "ID+OoD" else 60)
        assert r["pool_rows"] == (270 if r["cloud"] == "ID+OoD" else 240)
        private = r["selector"] in PRIVATE_METHODS
        assert r["cost"]["upload_bytes"] == (4 * r["R"] + 24 if private else 0)
        assert r["R"] == (25 if r["method"] == "ecos_R25" else 100)
        assert r["cap"] == ("pool_share" if r["method"] == et.POOL_SHARE else "cluster_size")
        assert r["epsilon"] == (pytest.approx(0.0995, rel=0.02) if private else 0.0)
    verdicts = claims(report.rows)
    assert "ECOS >= Random (average accuracy %)" in verdicts and "ECOS > proximity-only (average accuracy %)" in verdicts
    assert verdicts["ECOS vs ECOS (R = 25): average accuracy %"] == "comparison, not a claim"
    diagnostic = report.extra["diagnostic"]
    assert sorted(r["extractor"] for r in diagnostic) == ["hog", "hog_color", "pixels"]
    assert all(r["domain"] == 1 and r["budget"] == 50 and 0 < r["selected"] <= 50 for r in diagnostic)
    assert "the study's phi (hog_color {'cells': 4, 'bins': 9, 'block': 1}) has the highest mean share" in verdicts
    markdown = (tmp_path / "results.md").read_text()
    assert "Quick mode" in markdown and "ecos_digits_accuracy.png" in markdown
    assert (tmp_path / report.figures[0]).stat().st_size > 0
    assert json.loads((tmp_path / "results.json").read_text())["figures"] == ["ecos_digits_accuracy.png"]
