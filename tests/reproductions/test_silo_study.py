"""The shared study helpers: scoring, method tables, claim rows (no training)."""
import math

import pytest

from fedveil_reproductions.silo_study import (
    SiloStudy,
    SiloTask,
    beats_both_rows,
    best_lambda,
    example_privacy,
    lambda_trend_row,
    methods,
)

ACCURACY = SiloTask("toy", "accuracy", lambda *a: {})
MSE = SiloTask("toy", "mse", lambda *a: {})


def test_score_reads_personal_models_first_then_the_global_model():
    assert ACCURACY.score({"personal_accuracy_weighted_mean": 0.8, "global_client_accuracy_weighted_mean": 0.7}) == 0.8
    assert ACCURACY.score({"global_client_accuracy_weighted_mean": 0.7}) == 0.7
    assert MSE.score({"global_client_mse_weighted_mean": 0.02}) == 0.02
    assert ACCURACY.best({1: 0.5, 2: 0.9}) == 2 and MSE.best({1: 0.5, 2: 0.9}) == 1
    assert ACCURACY.label == "test accuracy" and MSE.label == "test MSE"


def test_methods_table_and_unknown_baselines():
    study = SiloStudy(epsilons=[1.0], lambdas=[0.1, 10.0], baselines=["local", "fedavg", "ifca"], select_fraction=0.1)
    table = methods(study)
    assert list(table) == ["local", "fedavg", "ifca(10%)", "mr_mtl(lam=0.1)", "mr_mtl(lam=10)"]
    assert table["ifca(10%)"] == {"name": "ifca", "clusters": 4, "select_fraction": 0.1}
    with pytest.raises(ValueError, match="unknown baselines \\['fedprox'\\]"):
        methods(SiloStudy(epsilons=[1.0], lambdas=[1.0], baselines=["fedprox"]))


def test_privacy_section():
    assert example_privacy(math.inf, 1e-3, 1.0) == {"level": "none"}
    assert example_privacy(2.0, 1e-3, 1.0)["batch_sampling"] == "poisson"


def test_claim_rows_compare_means_over_seeds():
    study = SiloStudy(epsilons=[0.5, 2.0, math.inf], lambdas=[0.1, 1.0])
    results = {
        "local": {"0.5": [0.60, 0.62], "2": [0.80, 0.82], "inf": [0.90, 0.90]},
        "fedavg": {"0.5": [0.75, 0.75], "2": [0.78, 0.78], "inf": [0.80, 0.80]},
        "mr_mtl(lam=0.1)": {"0.5": [0.70, 0.70], "2": [0.84, 0.80], "inf": [0.89, 0.89]},  # mean 0.82 at eps 2
        "mr_mtl(lam=1)": {"0.5": [0.74, 0.74], "2": [0.79, 0.79], "inf": [0.85, 0.85]},
    }
    assert [best_lambda(results, study, ACCURACY, e) for e in ("0.5", "2", "inf")] == [1.0, 0.1, 0.1]
    verdicts = [r.verdict for r in beats_both_rows(results, study, ACCURACY, "yes")]
    # eps 0.5: 0.74 < fedavg 0.75; eps 2: 0.82 > 0.81 (pairs +0.04, -0.02: within 2 s.e.) and 0.78; inf: 0.89 < 0.90
    assert verdicts == ["does not hold", "holds on the means, within 2 s.e. of local", "does not hold"]
    (trend,) = lambda_trend_row(results, study, ACCURACY)
    assert trend.measured == "1 -> 0.1" and trend.verdict == "holds"
    results["mr_mtl(lam=1)"]["2"] = [0.9, 0.9]
    (trend,) = lambda_trend_row(results, study, ACCURACY)
    assert trend.measured == "1 -> 1" and trend.verdict == "holds"
    results["mr_mtl(lam=1)"]["0.5"] = [0.1, 0.1]
    (trend,) = lambda_trend_row(results, study, ACCURACY)
    assert trend.measured == "0.1 -> 1" and trend.verdict == "does not hold"


def test_focus_epsilons_get_the_extra_seeds():
    study = SiloStudy(epsilons=[1.0, 6.0, math.inf], lambdas=[1.0], seeds=[0], focus_epsilons=[6.0], focus_seeds=[1, 2])
    assert [study.seeds_at(e) for e in study.epsilons] == [[0], [0, 1, 2], [0]]


def test_a_bad_config_fails_before_any_run(tmp_path):
    from fedveil.config import ConfigError
    from fedveil_reproductions.silo_study import run_grid

    def config(algorithm, epsilon, seed, study):
        rounds = 0 if algorithm["name"] == "mr_mtl" else 1  # only the last method's configs are bad
        return {"data": {"name": "vehicle_synthetic"}, "model": {"name": "linear"}, "algorithm": algorithm,
                "federation": {"rounds": rounds}}

    study = SiloStudy(epsilons=[math.inf], lambdas=[1.0], baselines=["local"], rounds=1)
    with pytest.raises(ConfigError, match="rounds"):
        run_grid(tmp_path / "runs", study, SiloTask("toy", "accuracy", config))
    assert not (tmp_path / "runs").exists()  # the valid local run was not started either


def test_claim_rows_give_each_paired_gap_with_its_standard_error():
    import statistics

    study = SiloStudy(epsilons=[2.0], lambdas=[1.0])
    results = {"local": {"2": [0.80, 0.70, 0.75]}, "fedavg": {"2": [0.81, 0.79, 0.80]},
               "mr_mtl(lam=1)": {"2": [0.83, 0.80, 0.84]}}
    (row,) = beats_both_rows(results, study, ACCURACY, "yes")
    to_local = [0.03, 0.10, 0.09]
    se = statistics.stdev(to_local) / 3 ** 0.5
    assert f"vs local {statistics.fmean(to_local):+.5f} ± {se:.5f} s.e. (beyond 2 s.e.)" in row.measured
    to_fedavg = [0.02, 0.01, 0.04]  # mean 0.0233, s.e. 0.0088: beyond 2 s.e.
    se = statistics.stdev(to_fedavg) / 3 ** 0.5
    assert f"vs fedavg {statistics.fmean(to_fedavg):+.5f} ± {se:.5f} s.e. (beyond 2 s.e.)" in row.measured
    assert row.verdict == "holds"
    results["fedavg"]["2"] = [0.85, 0.75, 0.80]  # same mean, noisy pairs: within 2 s.e.
    (row,) = beats_both_rows(results, study, ACCURACY, "yes")
    noisy = [0.83 - 0.85, 0.80 - 0.75, 0.84 - 0.80]
    se = statistics.stdev(noisy) / 3 ** 0.5
    assert abs(statistics.fmean(noisy)) < 2 * se
    assert row.verdict == "holds on the means, within 2 s.e. of fedavg" and f"vs fedavg {statistics.fmean(noisy):+.5f} ± {se:.5f} s.e. (within 2 s.e.)" in row.measured


def test_lr_rows_and_edge_notes():
    from fedveil_reproductions.silo_study import lr_edge_notes, lr_rows

    lrs = {"local": {"2": 0.001, "inf": 0.01}, "fedavg": {"2": 0.003, "inf": 0.03}}
    study = SiloStudy(epsilons=[2.0, math.inf], lambdas=[])
    rows = lr_rows(lrs, study, "tau=1")
    assert [(r.setting, r.measured) for r in rows] == [
        ("tau=1, eps=2", "local 0.001; fedavg 0.003"), ("tau=1, eps=inf", "local 0.01; fedavg 0.03")]
    low, high = lr_edge_notes(lrs, [0.001, 0.003, 0.01, 0.03])
    assert low.startswith("the tuned lr is the grid's lower edge (0.001) for 1 cells (local at eps=2)")
    assert high.startswith("the tuned lr is the grid's upper edge (0.03) for 1 cells (fedavg at eps=inf)")
    assert lr_edge_notes(lrs, [0.0003, 0.001, 0.003, 0.01, 0.03, 0.1]) == []  # nothing at either edge
    assert lr_edge_notes({"local": {"2": 0.01}}, [0.01]) == []  # a one-rate grid has no edge to speak of
