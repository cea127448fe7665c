"""ecos_knn_digits / ecos_labelling_digits (ECOS Tables 5.1 and 5.4): verdicts that follow
hand-made numbers, and end-to-end quick runs whose epsilons are recomputed with dp_accounting."""
from __future__ import annotations

import math
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting.pld import pld_privacy_accountant

from fedveil.reproduce import REPRODUCTIONS, ReproductionContext, write_results
from fedveil_reproductions import ecos_labelling as el
from fedveil_reproductions.ecos_study import load_domains

torch.set_num_threads(1)
FULL, QUICK = (ReproductionContext(out_dir=Path("unused"), quick=q, data_root=Path("unused")) for q in (False, True))
Z_KNN = 1 / math.sqrt(25.0**-2 + 75.0**-2) / math.sqrt(2)  # one query: both noisy vectors, sensitivity sqrt 2


def pld_epsilon(*events) -> float:
    accountant = pld_privacy_accountant.PLDAccountant()
    for event in events:
        accountant.compose(event)
    return accountant.get_epsilon(1e-5)


def knn_event(queries: int):
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.8, dp_accounting.GaussianDpEvent(Z_KNN)), queries)


def record(**fields) -> dict:
    base = {"domain": 0, "seed": 1, "method": "random", "cloud": "ID+OoD", "budget": 10, "label_accuracy": 0.5,
            "id_share": 0.1, "epsilon": 1.0}
    return {**base, **fields}


def test_table_5_1_verdicts_follow_the_numbers():
    study = el.LabellingStudy(domains=[0], seeds=[1, 2], cells=[("ID", 10, 1000), ("ID+OoD", 10, 1000),
                                                               ("ID+OoD", 50, 32000)])
    acc = {("ID", 10): [0.80, 0.82], ("ID+OoD", 10): [0.60, 0.61], ("ID+OoD", 50): [0.70, 0.71]}
    eps = {10: 1.0, 50: 2.0}
    records = [record(cloud=c, budget=b, seed=s, accuracy=a, epsilon=eps[b]) for (c, b), v in acc.items()
               for s, a in zip([1, 2], v)]
    rows = {r.metric: r for r in el.table_5_1_rows(study, records)}
    assert rows["OoD rows lower the accuracy: ID above ID+OoD"].verdict == "holds"
    assert rows["OoD rows lower the accuracy: ID above ID+OoD"].measured.startswith("81.00 vs 60.50 (diff +20.50")
    assert rows["OoD rows lower the accuracy: ID above ID+OoD"].paper == "70.4 vs 62.4"  # Table 5.1, B = 1,000
    assert rows["a larger budget raises the ID+OoD accuracy"].verdict == "holds"
    assert rows["... but only partly: ID at the small budget still above"].verdict == "holds"
    epsilon = rows["epsilon grows with B (ours: data-independent, the same for every domain)"]
    assert epsilon.measured == "1.000 < 2.000" and epsilon.paper == "4.21 < 5.89 < 7.17 < 9.32 (data-dependent)"
    # a large budget that beats the ID cloud: the recovery is not partial
    records = [dict(r, accuracy=0.9) if r["budget"] == 50 else r for r in records]
    rows = {r.metric: r for r in el.table_5_1_rows(study, records)}
    assert rows["... but only partly: ID at the small budget still above"].verdict == "does not hold"


def test_table_5_4_verdicts_follow_the_numbers():
    study = el.LabellingStudy(table="5.4", domains=[0, 1], seeds=[1, 2])
    acc = {"ecos": [0.70, 0.72], "k_center": [0.60, 0.61], "random": [0.75, 0.76]}
    labels = {"ecos": 0.6, "k_center": 0.4, "random": 0.4}
    records = [record(cloud="OoD", method=m, seed=s, domain=d, accuracy=a, label_accuracy=labels[m], released=120)
               for m, v in acc.items() for s, a in zip([1, 2], v) for d in (0, 1)]
    rows = {r.metric: r for r in el.table_5_4_rows(study, records)}
    assert rows["ECOS >= K-Center (average accuracy %)"].verdict == "holds"
    assert rows["ECOS >= Random (average accuracy %)"].verdict == "does not hold"
    assert rows["ECOS >= Random (average accuracy %)"].paper == "69.0 vs 65.9"
    assert rows["ECOS's released labels more accurate than Random's (%)"].verdict.startswith("holds")
    assert rows["ECOS: accuracy % mnist / svhn_like / Avg; epsilon"].measured == "71.0±1.4 / 71.0±1.4 / 71.0; epsilon 1.000"


def test_id_and_id_ood_clouds_share_the_client_half(mnist_data_root, tmp_path):
    source = load_domains(ReproductionContext(tmp_path, True, mnist_data_root), el.knn_study(QUICK))
    client, pool = el.client_split(source, "ID", 1, seed=3)
    same, mixed = el.client_split(source, "ID+OoD", 1, seed=3)
    np.testing.assert_array_equal(client, same)
    domain = source.train.groups["domain"].numpy()
    assert (domain[pool] == 1).all() and set(pool) < set(mixed) and not set(client) & set(mixed)


def test_the_quick_table_5_1_run_accounts_every_query(tmp_path, mnist_data_root):
    ctx = ReproductionContext(out_dir=tmp_path, quick=True, data_root=mnist_data_root)
    report = REPRODUCTIONS.get("ecos_knn_digits")(ctx)
    write_results(report, tmp_path, quick=True)
    runs = report.extra["records"]
    assert sorted((r["cloud"], r["budget"]) for r in runs) == [("ID", 10), ("ID+OoD", 10), ("ID+OoD", 100)]
    for r in runs:
        assert r["selected"] == r["released"] == r["budget"]  # every random query labelled and used
        assert r["epsilon"] == pytest.approx(pld_epsilon(knn_event(r["budget"])), rel=2e-3)
        assert r["id_share"] == (1.0 if r["cloud"] == "ID" else pytest.approx(r["id_share"]))
        assert 0.0 <= r["label_accuracy"] <= 1.0 and r["label_upload_bytes"] == 5 * r["budget"]
    assert [d["k"] for d in report.extra["diagnostic"]] == [5, 10]
    assert "epsilon grows with B (ours: data-independent, the same for every domain)" in {r.metric for r in report.rows}
    assert (tmp_path / "ecos_knn.png").stat().st_size > 0 and "Quick mode" in (tmp_path / "results.md").read_text()


def test_the_quick_table_5_4_run_composes_the_ecos_upload_and_the_labelling(tmp_path, mnist_data_root):
    ctx = ReproductionContext(out_dir=tmp_path, quick=True, data_root=mnist_data_root)
    report = REPRODUCTIONS.get("ecos_labelling_digits")(ctx)
    runs = {r["method"]: r for r in report.extra["records"]}
    assert sorted(runs) == ["ecos", "k_center", "random"]
    coverage = dp_accounting.PoissonSampledDpEvent(0.8, dp_accounting.GaussianDpEvent(25.0))
    for method, r in runs.items():
        assert r["cloud"] == "OoD" and r["id_share"] == 0.0 and r["client_rows"] == 60
        assert r["released"] <= min(r["selected"], 3 * 10)  # at most 3 labels per class
        events = [knn_event(r["selected"])] + ([coverage] if method == "ecos" else [])
        assert r["epsilon"] == pytest.approx(pld_epsilon(*events), rel=2e-3)
        assert r["selection_epsilon"] == (pytest.approx(pld_epsilon(coverage), rel=2e-3) if method == "ecos" else 0.0)
    assert runs["random"]["selected"] == runs["k_center"]["selected"] == 60
    verdicts = {r.metric: r.verdict for r in report.rows}
    assert "ECOS >= Random (average accuracy %)" in verdicts


def test_table_5_1_trains_supervised_and_table_5_4_with_fixmatch():
    assert el.knn_study(FULL).trainer == el.knn_study(QUICK).trainer == "supervised"
    assert el.labelling_study(FULL).trainer == el.labelling_study(QUICK).trainer == "fixmatch"
    assert el.labelling_study(FULL).knn.per_class == 12 and el.knn_study(FULL).knn.per_class is None
    assert el.knn_study(FULL).max_steps == 1500 and el.labelling_study(FULL).max_steps is None


def test_the_step_cap_only_shortens_large_budgets(monkeypatch, mnist_data_root, tmp_path):
    seen = []
    monkeypatch.setattr(el, "train_classifier", lambda data, *a: seen.append((len(data), a[3].steps)) or a)
    study = el.LabellingStudy(trainer="supervised", max_steps=50)  # 30 epochs of batch 32
    source = load_domains(ReproductionContext(tmp_path, True, mnist_data_root), el.knn_study(QUICK))
    for n in (10, 64, 100):
        el.train_on(study, source, np.arange(n), np.zeros(n, dtype=np.int64), np.arange(0), seed=0)
    assert seen == [(10, 30), (64, 50), (100, 50)]  # 30 x ceil(10/32) = 30; 30 x 2 = 60 -> 50; 30 x 4 -> 50


def test_bad_studies_are_refused():
    with pytest.raises(ValueError, match="table must be '5.1' or '5.4'"):
        el.LabellingStudy(table="5.2")
    with pytest.raises(ValueError, match="unknown methods or clouds \\['proximity'\\]"):
        el.LabellingStudy(methods=["proximity"])
