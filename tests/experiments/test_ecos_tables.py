"""ecos_digits (ECOS Table 5.2 protocol): the client / cloud splits by hand, verdicts that
follow hand-made numbers, and an end-to-end quick run on tiny MNIST files."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fedveil.ecos.pipeline import PRIVATE_METHODS
from fedveil.experiments import EXPERIMENTS, write_results
from fedveil.experiments import ecos_tables as et
from fedveil.experiments.registry import ExperimentContext

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


def test_split_errors():
    with pytest.raises(ValueError, match="unknown cloud setting 'ID'"):
        et.split_rows(DOMAIN, 0, "ID", np.random.default_rng(0))
    with pytest.raises(ValueError, match="client domain 2 has 1 rows"):
        et.split_rows(DOMAIN, 2, "OoD", np.random.default_rng(0))
    with pytest.raises(ValueError, match="ablation_budget 7 must be one of the budgets"):
        et.ECOSStudy(budgets=[10], paper_budgets=[2000], ablation_budget=7)


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
                    "proximity": [0.40, 0.41]}, {"ecos": 0.6, "random": 0.1})
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

    bad = records({"ecos": [0.50, 0.52], "random": [0.70, 0.71], "k_center": [0.51, 0.50], et.MATCHED: [0.50, 0.52],
                   "proximity": [0.90, 0.91]}, {"ecos": 0.1, "random": 0.1})
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


def test_the_quick_run_writes_results_and_the_figure(tmp_path, mnist_data_root):
    # 60 training + 20 test rows for each of the 5 domains: the fixture's 300 + 100 MNIST rows exactly.
    assert et.ecos_study(quick=True).rows_per_domain * 5 + et.ecos_study(quick=True).test_rows_per_domain * 5 == 400
    ctx = ExperimentContext(out_dir=tmp_path, quick=True, data_root=mnist_data_root)
    report = EXPERIMENTS.get("ecos_digits")(ctx)
    write_results(report, tmp_path, quick=True)
    runs = report.extra["records"]
    # per cloud: ECOS, its matched Random, K-Center, Random; plus proximity-only on ID+OoD
    assert sorted((r["cloud"], r["method"]) for r in runs) == sorted(
        [(c, m) for c in et.CLOUDS for m in ("ecos", et.MATCHED, "k_center", "random")] + [("ID+OoD", "proximity")])
    for r in runs:
        assert r["selected"] <= r["budget"] == 50 and r["domain"] == 1
        assert r["client_rows"] == (30 if r["cloud"] == "ID+OoD" else 60)
        assert r["pool_rows"] == (270 if r["cloud"] == "ID+OoD" else 240)
        assert (r["cost"]["upload_bytes"] == 424) == (r["method"] in PRIVATE_METHODS)
    assert all(r["epsilon"] == pytest.approx(0.0995, rel=0.02) for r in runs if r["method"] in PRIVATE_METHODS)
    verdicts = claims(report.rows)
    assert "ECOS >= Random (average accuracy %)" in verdicts and "ECOS > proximity-only (average accuracy %)" in verdicts
    markdown = (tmp_path / "results.md").read_text()
    assert "Quick mode" in markdown and "ecos_digits_accuracy.png" in markdown
    assert (tmp_path / report.figures[0]).stat().st_size > 0
    assert json.loads((tmp_path / "results.json").read_text())["figures"] == ["ecos_digits_accuracy.png"]
