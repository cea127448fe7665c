"""The heterogeneous CIFAR-10 stand-in study: a tiny run end to end, the split's shape,
and Fig. G.4's Ditto rows on fixed numbers."""
from __future__ import annotations

import math

import torch

from fedveil.config import validate
from fedveil.experiments.mrmtl_cifar import CifarPlan, cifar_study, cifar_task, ditto_rows, run_plan
from fedveil.experiments.registry import ExperimentContext
from fedveil.runtime.simulation import Simulation


def test_tiny_plan_runs_and_reports(tmp_path):
    plan = CifarPlan(samples_per_class=8, batch_size=5, study=cifar_study([8.0, math.inf], [1.0], [0], 2))
    rep = run_plan(ExperimentContext(out_dir=tmp_path, quick=True, data_root=tmp_path), plan, num_silos=4)
    assert set(rep.extra["accuracy"]) == {"local", "fedavg", "mr_mtl(lam=1)", "ditto(lam=1)"}
    assert [r.metric for r in rep.rows if r.metric.startswith("Ditto")] == [
        "Ditto's best lambda under DP vs without DP", "Ditto(lambda*=1) vs MR-MTL(lambda*=1)"]
    assert (tmp_path / "cifar_silos.png").stat().st_size > 10_000


def test_every_silo_holds_five_classes_of_32x32x3_images():
    plan = CifarPlan(samples_per_class=30, study=cifar_study([math.inf], [], [0], 1))
    config = cifar_task(plan, num_silos=6).config({"name": "local"}, math.inf, 0, plan.study)
    data = Simulation.from_config(validate(config)).data
    assert data.input_shape == (3, 32, 32)
    for client in data.clients:
        labels = torch.cat([client.train.y, client.test.y])
        assert len(torch.unique(labels)) == 5


def test_ditto_rows_on_fixed_numbers():
    study = cifar_study([2.0, math.inf], [0.1, 1.0], [0, 1, 2], 50)
    task = cifar_task(CifarPlan(study=study))
    results = {
        "local": {"2": [0.5] * 3, "inf": [0.9] * 3}, "fedavg": {"2": [0.6] * 3, "inf": [0.7] * 3},
        "mr_mtl(lam=0.1)": {"2": [0.60, 0.62, 0.64], "inf": [0.91] * 3},
        "mr_mtl(lam=1)": {"2": [0.66, 0.67, 0.68], "inf": [0.80] * 3},
        "ditto(lam=0.1)": {"2": [0.55] * 3, "inf": [0.88] * 3},  # best without DP
        "ditto(lam=1)": {"2": [0.60, 0.62, 0.61], "inf": [0.79] * 3},  # best under DP
    }
    larger, worse = ditto_rows(results, study, task)
    assert larger.measured == "1 vs 0.1" and larger.verdict == "holds"
    # Ditto(1) - MR-MTL(1) = -0.06, -0.05, -0.07: mean -0.06, s.e. 0.00577
    assert worse.measured.startswith("vs mr_mtl(lam=1) -0.06000 ± 0.00577") and worse.verdict == "holds"
