"""fedfed_digits (FedFed Tables 2 and 5 protocol): the configs of both phases, the paper's
rounds-to-target and speed-up arithmetic, verdicts that follow the numbers, Eq. 17 with the
paper's numbers, and a whole tiny study end to end."""
from __future__ import annotations

import json

import pytest
import torch

from fedveil.config import validate
from fedveil.reproduce import ReproductionContext, write_results
from fedveil_reproductions import fedfed_tables as ft

torch.set_num_threads(1)


def test_the_configs_of_both_phases(tmp_path):
    study = ft.FedFedStudy(data={"name": "digits", "num_clients": 10})
    distill = validate(ft.distill_config(study, "alpha=0.05", 1))
    assert distill.algorithm.name == "fedfed_distill" and distill.federation.rounds == 15
    assert distill.model.options["rho"] == 0.5 and distill.data.partition.alpha == 0.05
    prox = validate(ft.train_config(study, "#C=2", 1, "fedprox", tmp_path / "d", sigma=0.5))
    assert prox.algorithm.name == "fedfed_fedprox" and prox.algorithm.typed_params().mu == 0.1
    assert prox.algorithm.typed_params().sigma == 0.5 and prox.data.partition.name == "shards"
    plain = validate(ft.train_config(study, "alpha=0.1", 1, "scaffold", None))
    assert plain.algorithm.name == "scaffold" and plain.federation.rounds == 20


def test_rounds_to_target_and_speedup_as_the_paper_counts_them():
    # target: plain FedAvg's best accuracy rounded down to a whole percent (79.35 -> 79)
    results = {("p", "fedavg", "without"): [[0.5, 0.7935, 0.78], [0.6, 0.81, 0.812]]}
    assert ft.targets_of(results, "p") == [0.79, 0.81]
    assert ft.rounds_to([0.5, 0.79, 0.8], 0.79) == 2 and ft.rounds_to([0.5], 0.79) is None
    assert ft.speedup([8, 6], [2, 3]) == pytest.approx(3.0)  # mean of 4x and 2x
    assert ft.speedup([8, None], [2, 3]) == pytest.approx(4.0) and ft.speedup([None], [1]) is None


def test_the_verdicts_follow_the_numbers():
    study = ft.FedFedStudy(data={}, partitions=["alpha=0.1"], bases=["fedavg"])
    up = [0.5, 0.7, 0.9, 0.95]
    flat = [0.5, 0.6, 0.7, 0.72]
    results = {("alpha=0.1", "fedavg", "with"): [up, up[:3] + [0.94]],
               ("alpha=0.1", "fedavg", "without"): [flat, flat[:3] + [0.71]]}
    rows = ft.table_rows(study, results)
    assert rows[0].measured.startswith("94.50") and rows[0].paper == "92.34 (86.73)"
    assert rows[0].verdict.startswith("gain +23.00: FedFed higher")
    # target 72% / 71%: FedFed reaches it in round 3 of both seeds, plain FedAvg in rounds 4 and 4
    assert rows[1].measured == "3.0 (4.0); x1.3 (x1.0)"
    results[("alpha=0.1", "fedavg", "with")] = [flat[:3] + [0.7], flat[:3] + [0.69]]
    assert ft.table_rows(study, results)[0].verdict == "gain -1.50: does not hold"


def test_the_communication_overhead_is_eq_17():
    study = ft.FedFedStudy(data={}, rounds=1000, distill_rounds=15)
    row = ft.communication_row(study, rows_per_client=14.0 / 784, model_floats=10, d=784)  # gamma = 14
    assert row.measured == "4.5%" and row.paper.startswith("4.54%")


def test_a_tiny_study_end_to_end(tmp_path, mnist_data_root):
    ctx = ReproductionContext(out_dir=tmp_path, quick=True, data_root=mnist_data_root)
    study = ft.digits_study(ctx)
    study.data["test_fraction"] = 0.2
    study.rounds, study.distill_rounds, study.sigmas = 2, 1, [0.15, 0.5]
    study.distiller = {"latent": 4, "width": 2}
    report = ft.reproduction(lambda ctx: study)(ctx)
    md, js = write_results(report, tmp_path, quick=True)
    assert (tmp_path / "accuracy_and_privacy.png").stat().st_size > 0
    payload = json.loads(js.read_text())
    assert set(payload["extra"]["curves"]) == {"alpha=0.1 fedavg with", "alpha=0.1 fedavg without", "alpha=0.1 sweep 0.5",
                                               "alpha=0.1 sweep 0.15"}  # 0.15: the main run, reused
    assert payload["extra"]["curves"]["alpha=0.1 sweep 0.15"] == payload["extra"]["curves"]["alpha=0.1 fedavg with"]
    assert all(len(c) == 2 for curves in payload["extra"]["curves"].values() for c in curves)
    # the sweep run's ledger holds the release: at least the exact analytic-Gaussian epsilon
    exact = ft.release_epsilon(0.5, 0.5, 28.0, 1e-5)
    assert exact <= payload["extra"]["sweep_ledger_epsilon"]["0.5"][0] <= 1.05 * exact
    assert "FedAvg: best accuracy" in md.read_text()


def test_the_cifar_stand_in_has_unit_pixels_and_table_1s_numbers(tmp_path):
    study = ft.cifar_study(ReproductionContext(out_dir=tmp_path, quick=True, data_root=tmp_path))
    config = validate(ft.train_config(study, "alpha=0.1", 0, "fedavg", None))
    from fedveil.runtime.dataset import build_dataset

    data = build_dataset(config.data, 0)
    x = torch.cat([c.train.x for c in data.clients])
    assert data.input_shape == (3, 32, 32) and float(x.min()) == 0.0 and float(x.max()) == 1.0
    assert study.paper["accuracy"]["alpha=0.1"]["fedavg"] == [92.34, 79.35]
    assert study.paper["source"].startswith("Yang et al. NeurIPS 2023 §4.2, Table 1,")
