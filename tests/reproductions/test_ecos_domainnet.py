"""ecos_domainnet (ECOS Tables 5.2 bottom and 5.3 on a synthetic DomainNet stand-in): the
split, the student seeing only the selection, verdicts that follow the numbers, the paper's
tables as copied, and an end-to-end quick run whose epsilon is recomputed here."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.pld import PLDAccountant

from fedveil.ecos.cloud_training import CloudSGD
from fedveil.reproduce import REPRODUCTIONS, ReproductionContext, write_results
from fedveil.reproduce import verdicts as st
from fedveil.seeding import numpy_generator
from fedveil_reproductions import ecos_domainnet as ed

torch.set_num_threads(1)
FULL, QUICK = (ReproductionContext(out_dir=Path("unused"), quick=q, data_root=Path("unused")) for q in (False, True))


def test_the_full_study_scales_budgets_and_r_to_our_pool_and_client():
    study = ed.study(FULL)
    assert (study.client_rows, study.pool_rows) == (400, 4400)
    assert study.budgets == [229, 686] and study.paper_budgets == [1000, 3000]  # 5.2% / 15.6% of the pool
    assert study.ecos.R == 23 and study.paper_R == 100  # 100 x 400 / 1,750
    e = study.ecos
    assert (e.extractor, e.scale_s, e.sigma, e.sample_rate, e.cap) == ("hog_color", 5.0, 10.0, 0.8, "cluster_size")
    assert (study.model_options, study.teacher_options, study.kd_weight, study.temperature) == (
        {"width": 0.5}, {"width": 1.0}, 0.1, 10.0)
    assert study.seeds == [1, 2, 3] and study.domains == list(range(6))
    with pytest.raises(ValueError, match="paper_R 23 must be a positive R other than the study's 23"):
        ed.DomainNetStudy(paper_R=23)
    with pytest.raises(ValueError, match="unknown cases, methods or client domains \\['fixmatch', 6\\]"):
        ed.DomainNetStudy(cases=["fixmatch"], domains=[6])


@pytest.mark.parametrize("table", [ed.PAPER["table_5_2"], ed.PAPER["table_5_3"]])
def test_the_paper_tables_average_their_six_domains(table):
    for rows in table.values():
        for cells in rows.values():
            values = [float(c.split("±")[0]) for c in cells[:6]]
            assert sum(values) / 6 == pytest.approx(float(cells[6]), abs=0.051)


def test_the_split_gives_the_client_half_its_domain_and_the_cloud_every_other_training_row():
    data = ed.load_data(ed.study(QUICK))
    domain, y = data.groups["domain"].numpy(), data.y.numpy()
    test = ed.held_out(domain, y, 8, numpy_generator(ed.DATA_SEED, "ecos-domainnet/test"))
    for d in range(6):
        for c in range(10):
            assert test[(domain == d) & (y == c)].sum() == 8  # 8 of 24 held out per domain and class
    for d, seed in ((0, 1), (3, 2)):
        split = ed.split_rows(domain, test, d, numpy_generator(seed, "ecos-domainnet/split", d))
        own = np.flatnonzero((domain == d) & ~test)
        assert own.size == 160 and split.client.size == 80 and set(split.client) <= set(own)
        assert not set(split.client) & set(split.cloud) and not set(split.cloud) & set(np.flatnonzero(test))
        assert set(split.cloud) == set(np.flatnonzero(~test)) - set(split.client)
        assert set(np.flatnonzero((domain != d) & ~test)) <= set(split.cloud)  # every other domain's training rows
        assert split.cloud.size == 880 and np.all(domain[split.test] == d) and split.test.size == 80
        again = ed.split_rows(domain, test, d, numpy_generator(seed, "ecos-domainnet/split", d))
        np.testing.assert_array_equal(split.client, again.client)
    other = ed.split_rows(domain, test, 0, numpy_generator(2, "ecos-domainnet/split", 0))
    assert not np.array_equal(other.client, ed.split_rows(domain, test, 0, numpy_generator(
        1, "ecos-domainnet/split", 0)).client)
    with pytest.raises(ValueError, match="client domain 0 has 1 training rows"):
        ed.split_rows(np.array([0, 1, 1]), np.zeros(3, bool), 0, np.random.default_rng(0))


def test_the_student_sees_only_the_selected_rows_and_the_teacher_the_whole_cloud(monkeypatch):
    study = dataclasses.replace(ed.study(QUICK), cases=["distillation"], paper_R=None, matched=False,
                                sgd=CloudSGD(epochs=1), teacher_sgd=CloudSGD(epochs=1), diagnostic_extractors={})
    data = ed.load_data(study)
    domain = data.groups["domain"].numpy()
    test = ed.held_out(domain, data.y.numpy(), study.test_per_class,
                       numpy_generator(ed.DATA_SEED, "ecos-domainnet/test"))
    split = ed.split_rows(domain, test, 0, numpy_generator(1, "ecos-domainnet/split", 0))
    seen = {"select": [], "distill": [], "teacher": []}
    real_select, real_distill, real_teacher = ed.select, ed.distill, ed.train_teacher

    def select(*args, **kwargs):
        out = real_select(*args, **kwargs)
        seen["select"].append(out.indices)
        return out

    def distill(selected, *args, **kwargs):
        seen["distill"].append(selected.x.clone())
        return real_distill(selected, *args, **kwargs)

    def train_teacher(data_, *args, **kwargs):
        seen["teacher"].append(data_.x.clone())
        return real_teacher(data_, *args, **kwargs)

    monkeypatch.setattr(ed, "select", select)
    monkeypatch.setattr(ed, "distill", distill)
    monkeypatch.setattr(ed, "train_teacher", train_teacher)
    records, teacher = ed.run_client(data, test, study, 0, 1)
    assert len(seen["teacher"]) == 1 and torch.equal(seen["teacher"][0], data.x[split.cloud])
    assert len(seen["distill"]) == len(seen["select"]) == len(records) == 6  # 3 methods x 2 budgets
    for indices, rows, record in zip(seen["select"], seen["distill"], records):
        assert torch.equal(rows, data.x[split.cloud[indices]]) and len(rows) == record["selected"] <= record["budget"]
    assert teacher["rows"] == 880 and 0.0 <= teacher["accuracy"] <= 1.0


STUDY = ed.DomainNetStudy(domains=[0, 1], budgets=[10], paper_budgets=[1000], seeds=[1, 2], paper_R=None,
                          diagnostic_extractors={})


def records(acc: dict[str, dict[str, list[float]]]) -> list[dict]:
    """``acc[case][method]``: per-seed accuracies (both domains alike)."""
    out = []
    for case, methods in acc.items():
        for method, values in methods.items():
            for seed, value in zip(STUDY.seeds, values):
                for d in STUDY.domains:
                    out.append({"case": case, "domain": d, "seed": seed, "budget": 10, "method": method,
                                "selector": ed.selector(method), "accuracy": value, "selected": 10,
                                "id_share": 0.9 if method == "ecos" else 0.2, "epsilon": 0.0})
    return out


def test_verdicts_follow_the_numbers():
    made = records({
        "labelling": {"ecos": [0.80, 0.82], "random": [0.70, 0.71], "k_center": [0.60, 0.62], ed.MATCHED: [0.83, 0.80]},
        "distillation": {"ecos": [0.50, 0.52], "random": [0.70, 0.71], "k_center": [0.51, 0.50],
                         ed.MATCHED: [0.5, 0.5]},
    })
    rows = {(r.setting, r.metric): r for r in ed.claim_rows(STUDY, made)}
    case1, case2 = "Case 1, selective labelling (Table 5.2), B=10", "Case 2, distillation (Table 5.3), B=10"
    assert rows[(case1, "ECOS >= Random (average accuracy %)")].verdict == "holds"
    assert rows[(case1, "ECOS >= Random (average accuracy %)")].measured.startswith("81.00 vs 70.50 (diff +10.50")
    assert rows[(case1, "ECOS >= Random (average accuracy %)")].paper == "82.5 vs 79.9"
    assert rows[(case1, "ECOS >= K-Center (average accuracy %)")].verdict == "holds"
    assert rows[(case1, "ECOS >= Random (ECOS's count) (average accuracy %)")].verdict.startswith("holds within")
    assert rows[(case2, "ECOS >= Random (average accuracy %)")].verdict == "does not hold"
    assert rows[(case2, "ECOS >= Random (average accuracy %)")].paper == "78.6 vs 76.4"
    assert rows[(case2, "ECOS >= K-Center (average accuracy %)")].verdict == "holds"  # 0.51 vs 0.505
    assert rows[("selection, B=10", "in-distribution share % of the selection: ECOS > Random")].verdict == "holds"


def test_the_quick_run_end_to_end(tmp_path):
    ctx = ReproductionContext(out_dir=tmp_path, quick=True, data_root=tmp_path)
    report = REPRODUCTIONS.get("ecos_domainnet")(ctx)
    write_results(report, tmp_path, quick=True)
    runs, study = report.extra["records"], ed.study(QUICK)
    budgets = study.budgets
    assert budgets == [46, 137]
    methods = ["ecos", ed.MATCHED, "k_center", "random", "ecos_R100"]
    assert sorted((r["case"], r["budget"], r["method"]) for r in runs) == sorted(
        (c, b, m) for c in ed.CASES for b in budgets for m in methods)
    # epsilon: one Poisson-subsampled Gaussian upload, noise multiplier sigma / sensitivity 1 = 10, at delta 1e-5
    accountant = PLDAccountant()
    accountant.compose(dp_event.PoissonSampledDpEvent(0.8, dp_event.GaussianDpEvent(10.0)))
    expected = accountant.get_epsilon(1e-5)
    for r in runs:
        assert r["domain"] == 0 and r["selected"] <= r["budget"] and 0.0 <= r["accuracy"] <= 1.0
        assert (r["client_rows"], r["pool_rows"], r["test_rows"]) == (80, 880, 80)
        private = r["selector"] == "ecos"
        assert r["epsilon"] == (pytest.approx(expected, rel=1e-3) if private else 0.0)
        assert r["cost"]["upload_bytes"] == (4 * r["R"] + 24 if private else 0)
        assert r["R"] == (100 if r["method"] == "ecos_R100" else 5)
    ecos = [r for r in runs if r["method"] == "ecos"]
    assert all(r["scores"] == ecos[0]["scores"] for r in ecos)  # both budgets read the same upload
    # the verdicts are computed from the run's own numbers
    verdicts = {(r.setting, r.metric): r for r in report.rows}
    for case in ed.CASES:
        for b in budgets:
            ours = [r["accuracy"] for r in runs if (r["case"], r["budget"], r["method"]) == (case, b, "ecos")]
            for other in ("random", "k_center"):
                theirs = [r["accuracy"] for r in runs if (r["case"], r["budget"], r["method"]) == (case, b, other)]
                row = verdicts[(f"{ed.CASE_LABELS[case]}, B={b}", f"ECOS >= {ed.LABELS[other]} (average accuracy %)")]
                assert row.verdict == st.at_least_verdict(*st.difference(theirs, ours))
                assert row.measured.startswith(f"{100 * st.mean(ours):.2f} vs {100 * st.mean(theirs):.2f}")
    privacy = {r.metric: r for r in report.rows if r.setting.startswith("sigma 10")}
    paper = PLDAccountant()  # the paper's sensitivity 2: noise multiplier 10 / 2
    paper.compose(dp_event.PoissonSampledDpEvent(0.8, dp_event.GaussianDpEvent(5.0)))
    convention = float(privacy["ECOS epsilon, the paper's convention (sensitivity 2)"].measured)
    assert convention == pytest.approx(paper.get_epsilon(1e-5), abs=2e-3) and abs(convention - 0.58) < 0.05
    assert privacy["K-Center / Random epsilon"].measured == "0.0000"
    assert len(report.extra["teachers"]) == 1 and report.extra["teachers"][0]["rows"] == 880
    assert sorted({r["extractor"] for r in report.extra["diagnostic"]}) == ["hog", "hog_color", "pixels"]
    assert any("SYNTHETIC stand-in for DomainNet" in n for n in report.scale_notes)
    markdown = (tmp_path / "results.md").read_text()
    assert "Quick mode" in markdown and "ecos_domainnet_accuracy.png" in markdown
    assert (tmp_path / report.figures[0]).stat().st_size > 0
    assert json.loads((tmp_path / "results.json").read_text())["figures"] == ["ecos_domainnet_accuracy.png"]
