"""splitmix_robust (Fig. 4.7a): the study runs on tiny MNIST files, and its claims read the
SA-RA curve correctly."""
from __future__ import annotations

import math

import pytest
import torch

from fedveil.reproduce import ReproductionContext, run_plan
from fedveil_reproductions import splitmix_robust as rb

torch.set_num_threads(1)


def test_the_study_scores_sa_and_ra_for_every_setting(tmp_path, mnist_data_root):
    study = rb.RobustStudy(at_lambdas=[0.0, 0.5], test_lambdas=[0.0, 1.0], seeds=[0], clients_per_domain=1,
                           rows_per_domain=16, test_rows_per_domain=8, size=8, width=0.125, rounds=1, joint_width=0.5)
    ctx = ReproductionContext(out_dir=tmp_path / "out", quick=True, data_root=mnist_data_root)
    run_plan(rb.study_plan(ctx, study), ctx.runs_dir, progress=False)
    report = rb.study_report(ctx, study)
    results = report.extra["results"]
    assert set(results["fedavg_at"]) == {"0", "0.5"} and set(results["dat"]) == {"0", "1"}
    assert set(results["oat"]) == {"0", "0.5"}  # one OAT model served at each training lambda
    verdicts = [r for r in report.rows if r.metric.startswith("(c) the DAT curve")]
    assert len(verdicts) == 2
    # width x robustness: Split-Mix DAT at 4 widths x 2 test lambdas, and the budget-compatible FedAvg+AT
    joint = report.extra["joint"]
    assert len(joint) == 4 * 2 + 1 and "x0.125, lambda 1" in joint and "budget_at" in joint
    assert any(r.metric.startswith("(e) the widest customised model") for r in report.rows)
    assert (ctx.out_dir / "width_robustness.png").stat().st_size > 0
    for by in results.values():
        for cell in by.values():
            assert len(cell["sa"]) == len(cell["ra"]) == 1 and 0 <= cell["ra"][0] <= 1
    assert (ctx.out_dir / "robustness_tradeoff.png").stat().st_size > 0


def test_the_curve_is_read_at_the_at_points_standard_accuracy():
    dat = {0.0: {"sa": [0.9], "ra": [0.2]}, 1.0: {"sa": [0.7], "ra": [0.6]}}
    assert rb.curve_ra_at(dat, 0.8) == pytest.approx(0.4)  # halfway between (0.7, 0.6) and (0.9, 0.2)
    assert math.isnan(rb.curve_ra_at(dat, 0.95))
    study = rb.RobustStudy(at_lambdas=[0.5, 1.0], test_lambdas=[0.0, 1.0], seeds=[0, 1])
    results = {"dat": {0.0: {"sa": [0.9, 0.9], "ra": [0.2, 0.2]}, 1.0: {"sa": [0.7, 0.7], "ra": [0.6, 0.6]}},
               "fedavg_at": {0.5: {"sa": [0.8, 0.8], "ra": [0.3, 0.3]}, 1.0: {"sa": [0.8, 0.8], "ra": [0.5, 0.5]}}}
    rows = rb.claim_rows(results, study, [0.02, 0.03])
    assert [r.verdict for r in rows[:2]] == ["holds", "does not hold"]  # curve 0.4 vs AT 0.3, then vs 0.5
    assert rows[2].verdict.startswith("RA: holds") and "SA: holds" in rows[2].verdict
    assert rows[3].measured.startswith("0.0250")


def test_outside_the_curve_the_verdict_compares_both_accuracies():
    dat = {0.0: {"sa": [0.79, 0.79], "ra": [0.48, 0.48]}, 1.0: {"sa": [0.79, 0.79], "ra": [0.49, 0.49]}}
    assert rb.pareto_verdict({"sa": [0.77, 0.77], "ra": [0.33, 0.33]}, dat)[1] == "holds (a DAT setting is as good on both)"
    assert rb.pareto_verdict({"sa": [0.80, 0.80], "ra": [0.60, 0.60]}, dat)[1].startswith("does not hold")
    assert rb.pareto_verdict({"sa": [0.77, 0.77], "ra": [0.50, 0.50]}, dat)[1] == "neither dominates (a trade-off)"
