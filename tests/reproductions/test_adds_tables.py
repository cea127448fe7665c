"""adds_femnist / adds_shakespeare (ADDS Tables 3-4 protocol): the per-run measurements
read from metrics.jsonl, an end-to-end study on tiny data, and claims that follow the numbers."""
from __future__ import annotations

import json

import pytest
import torch

from fedveil.reproduce import ReproductionContext
from fedveil_reproductions import adds_tables as at

torch.set_num_threads(1)


def test_measure_reads_accuracies_costs_and_rounds_to_target(tmp_path):
    rows = [
        {"round": 1, "params_uploaded": 10.0, "local_accuracy": 0.2, "global_test_accuracy": 0.3},
        {"round": 2, "params_uploaded": 30.0, "local_accuracy": 0.4},
        {"round": 3, "params_uploaded": 20.0, "local_accuracy": 0.6, "global_test_accuracy": 0.55, "subnet_macs": 7.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    m = at.measure(tmp_path, [0.25, 0.5, 0.9])
    assert (m["acc_g"], m["acc_l"], m["uploaded"], m["macs"]) == (0.55, 0.6, 20.0, 7.0)
    assert m["rounds_to"] == [1, 3, None]


def test_a_personal_model_is_acc_l_and_fedavg_has_none(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"round": 1, "global_test_accuracy": 0.5, "personal_accuracy_mean": 0.7}))
    assert at.measure(tmp_path, [])["acc_l"] == 0.7
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"round": 1, "global_test_accuracy": 0.5}))
    m = at.measure(tmp_path, [])
    assert m["acc_l"] is None and m["uploaded"] is None


def tiny_study() -> at.ADDSStudy:
    return at.ADDSStudy(
        table="femnist", data={"name": "digits", "num_clients": 4, "partition": {"name": "dirichlet", "alpha": 0.5}},
        model={"name": "adds_vgg", "options": {"channels": [], "hidden": [16, 8]}},
        client={"epochs": 1, "batch_size": 16, "lr": 0.05}, rounds=2, clients_per_round=2, targets=[0.2],
        methods=["fedavg", "feddrop", "adds"], seeds=[0], algorithm={"feddrop": {"keep": 0.5}},
    )


def test_the_study_runs_every_method_and_reports_sizes(tmp_path):
    ctx = ReproductionContext(out_dir=tmp_path, quick=True, data_root=tmp_path)
    report = at.reproduction(lambda ctx: tiny_study())(ctx)
    rows = {r.metric: r for r in report.rows}
    full = 64 * 16 + 16 + 16 * 8 + 8 + 8 * 10 + 10  # the MLP supernet's floats, keep ratios excluded
    assert report.extra["supernet_params"] == full
    assert rows[f"FedAvg: parameters uploaded per client and round (of {full:,})"].measured == f"{full:,} (100.0%)"
    # FedDrop keeps half the units of each layer: 64 -> 8 -> 4 -> 10
    sub = 64 * 8 + 8 + 8 * 4 + 4 + 4 * 10 + 10
    assert rows[f"FedDrop: parameters uploaded per client and round (of {full:,})"].measured.startswith(f"{sub:,} ")
    assert rows["FedAvg: Acc_L"].measured == "n/a"
    assert "(a) ADDS uploads fewer parameters per round than FedAvg" in rows
    assert len(list((tmp_path / "runs").iterdir())) == 3
    assert (tmp_path / "accuracy_and_upload_femnist.png").stat().st_size > 0


def test_claims_follow_the_numbers():
    study = tiny_study()
    fedavg = [{"acc_g": 0.5, "uploaded": None}, {"acc_g": 0.52, "uploaded": None}]
    adds = [{"acc_g": 0.6, "uploaded": 40.0}, {"acc_g": 0.61, "uploaded": 60.0}]
    rows = {r.metric: r for r in at.claim_rows(study, {"fedavg": fedavg, "adds": adds}, 100)}
    assert rows["(a) ADDS uploads fewer parameters per round than FedAvg"].verdict == "holds"
    assert rows["(a) ADDS uploads fewer parameters per round than FedAvg"].measured.startswith("50 vs 100 (50.0%)")
    assert rows["(b) ADDS Acc_G >= FedAvg Acc_G"].verdict == "holds"
    adds = [{"acc_g": 0.2, "uploaded": 100.0}, {"acc_g": 0.21, "uploaded": 100.0}]
    rows = {r.metric: r for r in at.claim_rows(study, {"fedavg": fedavg, "adds": adds}, 100)}
    assert rows["(a) ADDS uploads fewer parameters per round than FedAvg"].verdict == "does not hold"
    assert rows["(b) ADDS Acc_G >= FedAvg Acc_G"].verdict == "does not hold"


@pytest.mark.parametrize("name", ["adds_femnist", "adds_shakespeare"])
def test_both_tables_are_registered(name):
    from fedveil.reproduce import REPRODUCTIONS

    assert name in REPRODUCTIONS.names()
