"""The Vehicle trade-off study: tiny runs end to end, and its claim rows on fixed numbers."""
import json
import math

from fedveil.reproduce import ReproductionContext
from fedveil_reproductions.mrmtl_vehicle import (
    TauResults,
    TradeoffStudy,
    ablation_rows,
    endpoint_gap_rows,
    fedavg_wins_under_dp_rows,
    gain_over_endpoints,
    gain_vs_gap_row,
    outside_label,
    plot,
    report,
    run_tau,
    tau_trend_rows,
)
from fedveil_reproductions.silo_study import SiloStudy
from fedveil_reproductions.vehicle_silos import vehicle_task


def test_tiny_study_tunes_lr_on_unreported_seeds_and_reports(tmp_path):
    study = SiloStudy(epsilons=[1.0, math.inf], lambdas=[0.1, 10.0], baselines=["local", "fedavg"], seeds=[1], rounds=2)
    plan = TradeoffStudy(taus=[1.0], crossover={1.0: 1.0}, lrs=[0.03, 0.3], silos=(3, 40, 60), study=study)
    ctx = ReproductionContext(out_dir=tmp_path, quick=True, data_root=tmp_path)
    tr = run_tau(ctx, plan, 1.0)
    assert set(tr.scores) == {"local", "fedavg", "mr_mtl(lam=0.1)", "mr_mtl(lam=10)"}
    runs = tmp_path / "runs" / "tau1"

    def score(lr, label, eps, seed):
        summary = json.loads((runs / f"lr{lr:g}" / f"{label}_eps{eps}_seed{seed}" / "summary.json").read_text())
        return summary.get("personal_accuracy_weighted_mean", summary.get("global_client_accuracy_weighted_mean"))

    for label, by_eps in tr.lrs.items():
        for eps, lr in by_eps.items():  # the tuning seed's best rate (first on ties), scored on seed 1
            tuned = {r: score(r, label, eps, 0) for r in plan.lrs}
            assert tuned[lr] == max(tuned.values()) and lr == next(r for r in plan.lrs if tuned[r] == max(tuned.values()))
            assert tr.scores[label][eps] == [score(lr, label, eps, 1)]
    for lam in study.lambdas:  # the ablation: the inside-clip MR-MTL's rate, regulariser outside the clip
        lr = tr.lrs[f"mr_mtl(lam={lam:g})"]["1"]
        config = json.loads((runs / f"lr{lr:g}" / f"{outside_label(lam)}_eps1_seed1" / "config.json").read_text())
        assert config["algorithm"]["reg_in_clip"] is False and config["client"]["lr"] == lr
        assert tr.outside[outside_label(lam)]["1"] == [score(lr, outside_label(lam), "1", 1)]
    rep = report({1.0: tr}, plan, quick=True)
    assert sum(r.metric.startswith("MR-MTL(best lambda) better") for r in rep.rows) == 2
    assert sum(r.metric.startswith("learning rate tuned") for r in rep.rows) == 2
    assert sum("inside vs outside the DP clip" in r.metric for r in rep.rows) == 1
    plot({1.0: tr}, plan, tmp_path / "tradeoff.png")
    assert (tmp_path / "tradeoff.png").stat().st_size > 10_000


def fake(local, fedavg, lam_small, lam_big):
    """Accuracies at eps 0.5 / 2 / inf for Local, FedAvg and MR-MTL at lambda 0.1 and 10."""
    eps = ("0.5", "2", "inf")
    return {
        "local": dict(zip(eps, ([v] for v in local))), "fedavg": dict(zip(eps, ([v] for v in fedavg))),
        "mr_mtl(lam=0.1)": dict(zip(eps, ([v] for v in lam_small))),
        "mr_mtl(lam=10)": dict(zip(eps, ([v] for v in lam_big))),
    }


STUDY = SiloStudy(epsilons=[0.5, 2.0, math.inf], lambdas=[0.1, 10.0], baselines=["local", "fedavg"])


def test_claim_rows_on_fixed_numbers():
    # low heterogeneity: FedAvg is close to Local everywhere, big lambda best under DP
    low = fake(local=[0.60, 0.80, 0.88], fedavg=[0.78, 0.85, 0.87], lam_small=[0.65, 0.84, 0.89], lam_big=[0.80, 0.86, 0.87])
    # high heterogeneity: FedAvg far from Local, small lambda best
    high = fake(local=[0.60, 0.80, 0.88], fedavg=[0.70, 0.68, 0.72], lam_small=[0.66, 0.815, 0.885], lam_big=[0.69, 0.72, 0.73])
    (claim1,) = fedavg_wins_under_dp_rows(low, STUDY, "tau=0.1")
    assert claim1.measured == "0.5, 2" and claim1.verdict == "holds"
    (claim1,) = fedavg_wins_under_dp_rows(high, STUDY, "tau=1")
    assert claim1.measured == "0.5" and claim1.verdict == "holds"
    task = vehicle_task(0.1)
    gain, gap = gain_over_endpoints(low, STUDY, task, "2")  # lambda* = 10: 0.86 - max(0.80, 0.85)
    assert math.isclose(gain, 0.01) and math.isclose(gap, 0.05)
    plan = TradeoffStudy(taus=[0.1, 1.0], study=STUDY)
    rows = tau_trend_rows({0.1: low, 1.0: high}, plan)
    assert [r.measured for r in rows] == ["10 -> 10", "10 -> 0.1", "0.1 -> 0.1"]
    assert {r.verdict for r in rows} == {"holds"}
    # cells (gain, gap): low 0.5 (0.02, 0.18), low 2 (0.01, 0.05), high 0.5 (-0.01, 0.10), high 2 (0.015, 0.12)
    # ranks: gains [4, 2, 1, 3], gaps [4, 1, 2, 3] -> rho = 4 / 5
    (rho,) = gain_vs_gap_row({0.1: low, 1.0: high}, plan)
    assert rho.measured == "0.80 over 4 cells" and rho.verdict == "does not hold"


def test_ablation_rows_on_fixed_numbers():
    study = SiloStudy(epsilons=[1.0, math.inf], lambdas=[0.1, 10.0], baselines=["local", "fedavg"])
    plan = TradeoffStudy(taus=[1.0], crossover={1.0: 1.0}, study=study)
    scores = {
        "local": {"1": [0.70, 0.72, 0.74], "inf": [0.88, 0.88, 0.88]},
        "fedavg": {"1": [0.71, 0.72, 0.73], "inf": [0.74, 0.74, 0.74]},
        "mr_mtl(lam=0.1)": {"1": [0.73, 0.75, 0.77], "inf": [0.89, 0.89, 0.89]},  # best inside at eps 1 and no DP
        "mr_mtl(lam=10)": {"1": [0.72, 0.73, 0.74], "inf": [0.75, 0.75, 0.75]},
    }
    outside = {outside_label(0.1): {"1": [0.74, 0.76, 0.78]}, outside_label(10.0): {"1": [0.76, 0.78, 0.80]}}
    rows = ablation_rows(TauResults(scores, {}, outside), plan, 1.0)
    # outside (lambda 10) - inside (lambda 0.1): differences 0.03 each seed -> mean 0.03, s.e. 0
    assert rows[0].verdict == "outside better" and "+0.03000 ± 0.00000" in rows[0].measured
    assert [r.measured for r in rows[1:]] == ["0.1 vs 0.1", "10 vs 0.1"]
    assert [r.verdict for r in rows[1:]] == ["does not hold", "holds"]
    (gap,) = endpoint_gap_rows(scores, study, "tau=1")  # FedAvg - Local: eps 1 (+0.01, 0, -0.01), inf -0.14
    assert gap.measured == "+0.0000 ± 0.0058 / -0.1400 ± 0.0000"


def test_local_and_fedavg_without_dp_reach_an_independent_svm(tmp_path):
    """Band check of the study's scores: without DP, Local's per-silo hinge-loss SGD reaches
    within 0.03 of scikit-learn's per-silo linear SVM, and at tau = 0 (identical silos)
    FedAvg within 0.03 of one SVM fitted on the pooled rows (test accuracy pooled over silos)."""
    import numpy as np
    from sklearn.svm import LinearSVC

    from fedveil.config import validate
    from fedveil.runtime.simulation import Simulation
    from fedveil_reproductions.silo_study import run_grid

    study = SiloStudy(epsilons=[math.inf], lambdas=[], baselines=["local", "fedavg"], seeds=[0], rounds=40, lr=0.1)
    for tau, method in ((1.0, "local"), (0.0, "fedavg")):
        task = vehicle_task(tau, num_silos=3, min_size=300, max_size=400)
        ours = run_grid(tmp_path / f"tau{tau:g}", study, task)[method]["inf"][0]
        data = Simulation.from_config(validate(task.config({"name": method}, math.inf, 0, study))).data
        xs = [(c.train.x.numpy(), c.train.y.numpy(), c.test.x.numpy(), c.test.y.numpy()) for c in data.clients]
        if method == "local":
            correct = sum((LinearSVC(C=1.0).fit(x, y).predict(xt) == yt).sum() for x, y, xt, yt in xs)
        else:
            svm = LinearSVC(C=1.0).fit(np.concatenate([x for x, *_ in xs]), np.concatenate([y for _, y, *_ in xs]))
            correct = sum((svm.predict(xt) == yt).sum() for *_, xt, yt in xs)
        reference = correct / sum(len(yt) for *_, yt in xs)
        assert abs(ours - reference) < 0.03, (tau, method, ours, reference)


def test_misses_are_explained_from_the_numbers():
    from fedveil_reproductions.mrmtl_vehicle import misses_explained

    study = SiloStudy(epsilons=[1.0, math.inf], lambdas=[0.1, 10.0], baselines=["local", "fedavg"])
    plan = TradeoffStudy(taus=[1.0], crossover={1.0: 1.0}, lrs=[0.001, 0.03], study=study)
    scores = {  # Local leads at every epsilon (claim 1 misses); lambda* = 0.1 with and without DP (claim 4 misses)
        "local": {"1": [0.80], "inf": [0.88]}, "fedavg": {"1": [0.73], "inf": [0.74]},
        "mr_mtl(lam=0.1)": {"1": [0.81], "inf": [0.89]}, "mr_mtl(lam=10)": {"1": [0.75], "inf": [0.75]},
    }
    tuning = {0.001: {"local": {"1": [0.81]}, "fedavg": {"1": [0.735]}},
              0.03: {"local": {"1": [0.72]}, "fedavg": {"1": [0.71]}}}
    claim1, claim4 = misses_explained({1.0: TauResults(scores, {}, {}, tuning)}, plan)
    assert "below epsilon 1" in claim1 and "local 0.810 at lr 0.001, 0.720 at lr 0.03; fedavg 0.735 at lr 0.001" in claim1
    assert "1: 0.1, inf: 0.1" in claim4 and "(FedAvg minus Local 1: -0.0700)" in claim4
    scores["fedavg"]["1"] = [0.82]  # FedAvg wins under DP: claim 1 holds, no note for it
    assert len(misses_explained({1.0: TauResults(scores, {}, {}, tuning)}, plan)) == 1
