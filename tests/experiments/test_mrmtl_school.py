"""The School reproduction's study loop and report on a tiny School-format file."""
import math
from pathlib import Path

import numpy as np
import scipy.io

from fedveil.experiments.mrmtl_school import report, school_task
from fedveil.experiments.registry import ExperimentContext
from fedveil.experiments.silo_study import SiloStudy, run_grid


def tiny_school(root: Path, schools: int = 4) -> None:
    rng = np.random.default_rng(0)
    xs, ys = np.empty((1, schools), dtype=object), np.empty((1, schools), dtype=object)
    for k in range(schools):
        n = 30 + 5 * k
        x = np.c_[rng.integers(0, 2, (n, 25)), rng.integers(8, 92, (n, 1)), rng.integers(3, 44, (n, 1)), np.ones((n, 1))]
        xs[0, k] = x.astype(float)
        ys[0, k] = np.clip(1 + 20 * x[:, :3].sum(1, keepdims=True) + rng.normal(0, 3, (n, 1)), 1, 70)
    (root / "school").mkdir(parents=True)
    scipy.io.savemat(root / "school" / "school.mat", {"X": xs, "Y": ys})


def test_study_runs_every_method_and_reports_the_claims(tmp_path):
    tiny_school(tmp_path / "data")
    ctx = ExperimentContext(out_dir=tmp_path / "out", quick=True, data_root=tmp_path / "data")
    study = SiloStudy(epsilons=[2.0, math.inf], lambdas=[0.3, 3.0], rounds=2, lr=0.03)
    task = school_task(ctx, num_silos=4)
    results = run_grid(ctx.runs_dir, study, task)
    assert set(results) == {"local", "fedavg", "finetune", "ditto(lam=1)", "mr_mtl(lam=0.3)", "mr_mtl(lam=3)"}
    for by_eps in results.values():
        assert set(by_eps) == {"2", "inf"}
        assert all(0 < v[0] < 1 for v in by_eps.values())  # normalised scores: MSE below 1
    again = run_grid(ctx.runs_dir, study, task)  # finished runs are re-scored, not retrained
    assert again == results
    rep = report(results, study, task, quick=True)
    claims = [r for r in rep.rows if r.metric.startswith("MR-MTL(best lambda)")]
    assert len(claims) == 2 and all(r.verdict in ("holds", "does not hold") for r in claims)
    sweep = [r for r in rep.rows if r.setting == "lambda sweep"]
    assert sweep == []  # one private epsilon: no sweep to compare
    scores = [r for r in rep.rows if r.metric.endswith(": test MSE")]
    assert len(scores) == 12 and {r.paper for r in scores} == {"curve only"}  # README numbers: epsilon 6 only
