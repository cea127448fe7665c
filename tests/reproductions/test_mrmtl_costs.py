"""The personalisation-costs study: a tiny run end to end, the planned noise checked
against an equivalence worked out by hand, and its claim rows on fixed numbers."""
from __future__ import annotations

import math

import pytest

import fedveil_reproductions.mrmtl_costs as costs
from fedveil.reproduce import ReproductionContext
from fedveil_reproductions.mrmtl_costs import (
    CostStudy,
    finetune_rows,
    overhead_rows,
    planned_noise,
)
from fedveil_reproductions.silo_study import SiloStudy

TINY = (3, 40, 60)


def tiny_study(rounds: int = 2) -> CostStudy:
    return CostStudy(mocha_lams=[1.0], z_epsilons=[1.0], silos=TINY, study=SiloStudy(
        epsilons=[1.0, math.inf], lambdas=[], baselines=[], seeds=[0], rounds=rounds, lr=0.03))


def test_tiny_study_runs_and_reports(tmp_path, monkeypatch):
    monkeypatch.setattr(costs, "quick_study", tiny_study)
    from fedveil.reproduce import REPRODUCTIONS

    rep = REPRODUCTIONS.get("mrmtl_costs")(ReproductionContext(out_dir=tmp_path, quick=True, data_root=tmp_path))
    accuracy = rep.extra["accuracy"]
    assert set(accuracy) == {"local", "fedavg", "finetune(25%)", "finetune(50%)", "finetune(75%)", "mr_mtl(lam=1)",
                             "ditto(lam=1)", "ifca(every round)", "ifca(10%)", "mocha(lam=1)"}
    assert sum(r.metric.endswith("share of FedAvg's lead over Local kept") for r in rep.rows) == 3  # eps 1
    assert sum(r.metric.endswith("vs FedAvg without DP") for r in rep.rows) == 3
    assert (tmp_path / "costs.png").stat().st_size > 10_000


def test_ditto_noise_is_local_noise_at_twice_the_steps():
    """Ditto trains twice per round: its z over R rounds equals Local's over 2R rounds
    (same Poisson rate, twice the steps); MR-MTL and FedAvg share Local's z."""
    plan, double = tiny_study(rounds=10), tiny_study(rounds=20)
    ditto = planned_noise(plan, {"name": "ditto", "lam": 1.0}, 1.0)
    assert ditto == pytest.approx(planned_noise(double, {"name": "local"}, 1.0), rel=1e-3)
    local = planned_noise(plan, {"name": "local"}, 1.0)
    assert ditto > 1.2 * local
    assert planned_noise(plan, {"name": "mr_mtl", "lam": 1.0}, 1.0) == pytest.approx(local, rel=1e-9)
    every = planned_noise(plan, {"name": "ifca", "clusters": 2, "select_fraction": 1.0}, 1.0)
    tenth = planned_noise(plan, {"name": "ifca", "clusters": 2, "select_fraction": 0.1}, 1.0)
    assert every > tenth > local


def test_claim_rows_on_fixed_numbers():
    plan = CostStudy()
    results = {
        "local": {"1": [0.70, 0.72, 0.74]}, "fedavg": {"1": [0.80, 0.80, 0.80]},
        "finetune(25%)": {"1": [0.72, 0.73, 0.74]}, "finetune(50%)": {"1": [0.74, 0.76, 0.78]},
        "finetune(75%)": {"1": [0.80, 0.80, 0.80]},
        "mr_mtl(lam=1)": {"1": [0.78, 0.79, 0.80]}, "ditto(lam=1)": {"1": [0.70, 0.71, 0.72]},
        "ifca(every round)": {"1": [0.60, 0.61, 0.62]}, "ifca(10%)": {"1": [0.60, 0.62, 0.64]},
    }
    rows = finetune_rows(results, "1")
    # FedAvg's lead 0.80 - 0.72 = 0.08; finetune(25%) keeps (0.73 - 0.72) / 0.08 = 0.125
    assert rows[0].measured.startswith("0.12 ") and rows[0].verdict == "holds"
    assert rows[1].measured.startswith("0.50 ") and rows[2].verdict == "does not hold"  # 75%: equal to FedAvg
    free = {m: {"inf": [v + 0.1 for v in by_eps["1"]]} for m, by_eps in results.items()}
    free["finetune(50%)"]["inf"] = [0.88, 0.91, 0.91]  # vs FedAvg's 0.90: -0.02, +0.01, +0.01 -> 0.0 ± 0.01
    assert [r.verdict for r in finetune_rows(free, "inf")] == ["does not hold", "holds", "holds"]
    ditto, ifca = overhead_rows(results, plan, "1")
    assert ditto.verdict == "holds"  # -0.08 every seed
    assert ifca.measured.startswith("vs ifca(10%) -0.01000 ± 0.00577") and ifca.verdict == "does not hold"  # within 2 s.e.
