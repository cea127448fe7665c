"""The Vehicle trade-off study: tiny runs end to end, and its claim rows on fixed numbers."""
import math

from fedveil.experiments.mrmtl_vehicle import (
    TradeoffStudy, fedavg_wins_under_dp_rows, gain_over_endpoints, gain_vs_gap_row, plot, report, tau_trend_rows,
    vehicle_task,
)
from fedveil.experiments.silo_study import SiloStudy, run_grid


def test_tiny_study_runs_and_reports(tmp_path):
    study = SiloStudy(epsilons=[1.0, math.inf], lambdas=[0.1, 10.0], baselines=["local", "fedavg"], rounds=2, lr=0.03)
    plan = TradeoffStudy(taus=[0.1, 1.0], study=study)
    per_tau = {}
    for tau in plan.taus:
        task = vehicle_task(tau, num_silos=3, min_size=40, max_size=60)
        per_tau[tau] = run_grid(tmp_path / f"tau{tau:g}", study, task)
    for results in per_tau.values():
        assert set(results) == {"local", "fedavg", "mr_mtl(lam=0.1)", "mr_mtl(lam=10)"}
        assert all(0 <= v[0] <= 1 for by_eps in results.values() for v in by_eps.values())
    rep = report(per_tau, plan, quick=True)
    assert sum(r.metric.startswith("MR-MTL(best lambda)") for r in rep.rows) == 4  # 2 taus x 2 epsilons
    assert sum(r.metric.startswith("best lambda as tau grows") for r in rep.rows) == 2
    plot(per_tau, plan, tmp_path / "tradeoff.png")
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
