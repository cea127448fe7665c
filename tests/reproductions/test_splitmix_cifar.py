"""splitmix_cifar (Tables 4.1 CIFAR10 and C.4 on a synthetic 32x32 stand-in): the class
non-IID setting is 3 classes per client with the masked loss, the study trains every method
and serves every width, and the claims follow the numbers."""
from __future__ import annotations

import numpy as np
import torch

from fedveil.config import validate
from fedveil.reproduce import ReproductionContext, run_plan
from fedveil.runtime.simulation import Simulation
from fedveil_reproductions import splitmix_cifar as sc
from fedveil_reproductions.splitmix_study import WIDTHS, run_config

torch.set_num_threads(1)


def tiny(setting: str) -> sc.CifarStudy:
    study = sc.cifar_study(setting, quick=True)
    study.samples_per_class, study.rounds, study.size = 8, 1, 8
    return study


def test_class_non_iid_clients_hold_three_classes_and_train_with_the_masked_loss(tmp_path):
    study = sc.cifar_study("noniid")
    ctx = ReproductionContext(out_dir=tmp_path, quick=False, data_root=tmp_path)
    config = validate(run_config(ctx, study, "split_mix", 0, None))
    assert config.client.loss == "masked_cross_entropy" and config.data.num_clients == 10
    assert config.model.options == {"width": 0.25, "bases": 8}
    sim = Simulation.from_config(validate(run_config(ctx, tiny("noniid"), "fedavg", 0, 0.5)))
    for client in sim.data.clients:
        assert len(np.unique(client.train.y.numpy())) == 3
    assert sim.config.model.options["width"] == 0.125 * 0.5  # x0.5 of the quick family (x1 = 0.125)
    iid = validate(run_config(ctx, sc.cifar_study("iid"), "fedavg", 0, 1.0))
    assert iid.client.loss == "auto" and iid.data.partition.name == "iid" and iid.client.lr == 0.1


def test_split_mix_and_heterofl_read_the_budgets_as_the_same_fractions_of_x1(tmp_path):
    """x1 is real width 0.25: a client of budget x0.125 trains one of the 8 bases (Split-Mix
    reads real widths) and HeteroFL's x0.125 slice (fractions of the model's width)."""
    ctx = ReproductionContext(out_dir=tmp_path, quick=False, data_root=tmp_path)
    study = tiny("iid")
    study.clients = 8
    split_mix = Simulation.from_config(validate(run_config(ctx, study, "split_mix", 0, None))).algorithm
    assert split_mix.bases_per_client == [1, 1, 2, 2, 4, 4, 8, 8]
    heterofl = Simulation.from_config(validate(run_config(ctx, study, "heterofl", 0, None))).algorithm
    assert heterofl.budgets == [0.125, 0.125, 0.25, 0.25, 0.5, 0.5, 1.0, 1.0]
    assert study.full_width * 0.125 == split_mix.base_width  # one base is x0.125 of the x1 family


def test_the_study_trains_every_method_and_scores_every_width(tmp_path):
    ctx = ReproductionContext(out_dir=tmp_path / "out", quick=True, data_root=tmp_path)
    studies = {"iid": tiny("iid")}
    run_plan(sc.studies_plan(ctx, studies), ctx.runs_dir, progress=False)
    report = sc.studies_report(ctx, studies)
    accuracy = report.extra["accuracy"]["iid"]
    assert set(accuracy) == {"split_mix", "heterofl", "sheterofl", "fedavg"}
    for by_width in accuracy.values():
        assert set(by_width) == {"0.125", "0.25", "0.5", "1"}
    # split_mix, heterofl, sheterofl, fedavg at 4 widths
    assert len(list((ctx.runs_dir / "iid").iterdir())) == 7
    assert (ctx.out_dir / "accuracy_vs_width_iid.png").stat().st_size > 0
    # Split-Mix x1 serves 8 bases of the x0.125 net: 8x its parameters
    cost = report.extra["costs"]
    assert cost["split_mix"][1.0]["params"] == 8 * cost["fedavg"][0.125]["params"]


def test_claims_follow_the_numbers():
    results = {m: {w: [0.5, 0.52] for w in WIDTHS} for m in ("split_mix", "heterofl", "sheterofl", "fedavg")}
    results["split_mix"] = {0.125: [0.6, 0.61], 0.25: [0.7, 0.71], 0.5: [0.75, 0.76], 1.0: [0.8, 0.81]}
    rows = {r.metric: r for r in sc.claim_rows("noniid", results)}
    assert rows["(a) Split-Mix x1 >= SHeteroFL x1"].verdict == "holds"
    assert rows["(b) Split-Mix accuracy grows with width"].verdict == "holds"
    assert rows["(b) Split-Mix accuracy grows with width"].paper == "48.0 < 51.1 < 52.1 < 52.7"
    results["split_mix"][1.0] = [0.3, 0.31]
    rows = {r.metric: r for r in sc.claim_rows("noniid", results)}
    assert rows["(a) Split-Mix x1 >= SHeteroFL x1"].verdict == "does not hold"
