"""The rotated & masked MNIST study on a tiny MNIST-format file (IDX files in tmp_path)."""
from __future__ import annotations

import math

from fedveil.experiments.mrmtl_mnist import MnistPlan, mnist_task, report
from fedveil.experiments.registry import ExperimentContext
from fedveil.experiments.silo_study import SiloStudy, run_grid

from test_dp_schedules import write_fake_mnist  # same folder (pytest puts it on sys.path)


def test_tiny_study_runs_ifca_and_mr_mtl_and_reports(tmp_path):
    write_fake_mnist(tmp_path / "data" / "mnist-10k", n=240)
    ctx = ExperimentContext(out_dir=tmp_path / "out", quick=True, data_root=tmp_path / "data")
    study = SiloStudy(epsilons=[4.0, math.inf], lambdas=[1.0], baselines=["local", "fedavg", "ifca_mrmtl"],
                      rounds=2, lr=0.1, clusters=2, select_fraction=0.5)
    plan = MnistPlan(mask_ratios=[0.1], study=study)
    task = mnist_task(ctx, plan, 0.1, num_silos=4)
    config = task.config({"name": "local"}, 4.0, 0, study)
    assert config["data"]["options"]["rotation_groups"] == 4 and config["model"]["name"] == "mlp"
    results = run_grid(ctx.runs_dir, study, task)
    assert set(results) == {"local", "fedavg", "ifca(50%)+mr_mtl(lam=1)", "mr_mtl(lam=1)"}
    assert all(0 <= v[0] <= 1 for by_eps in results.values() for v in by_eps.values())
    rep = report({0.1: results}, plan, quick=True, tasks={0.1: task})
    assert sum(r.metric.startswith("MR-MTL(best lambda)") for r in rep.rows) == 2
    assert rep.figures == ["mnist_mask0.1.png"]
