"""ADDS (spec 001): lambda from label skew with the spec's JSD_max values, Eq. 19's
entry-wise aggregation by hand, ADDS = FedAvg when every client keeps every unit, and a
sampled run that learns keep ratios and uploads less than it downloads."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from fedveil import params as P
from fedveil.algorithms.adds import jensen_shannon, label_skew_lambda
from fedveil.errors import ConfigError
from fedveil.runtime import run
from fedveil.runtime.simulation import Simulation

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from tiny_runs import merge, tiny_config  # noqa: E402

torch.set_num_threads(1)

ADDS = {
    "data": {"name": "digits", "num_clients": 4, "partition": {"name": "dirichlet", "alpha": 0.5}},
    "model": {"name": "adds_vgg", "options": {"channels": [], "hidden": [32, 16]}},
    "algorithm": {"name": "adds", "eps0": 1.0, "arch_lr": 0.05},
    "client": {"batch_size": 16, "lr": 0.05, "epochs": 1},
    "federation": {"rounds": 3, "clients_per_round": 4},
    "checkpoint": {"every": 1},
}


@pytest.mark.parametrize("c, jsd_max", [(2, 0.2158), (62, 0.6517), (70, 0.6556)])  # spec 001 §1.9, nats
def test_jsd_of_a_one_hot_label_distribution_is_the_spec_maximum(c, jsd_max):
    one_hot = torch.zeros(c, dtype=torch.float64)
    one_hot[0] = 1
    assert float(jensen_shannon(one_hot, torch.full((c,), 1.0 / c, dtype=torch.float64))) == pytest.approx(jsd_max, abs=1e-4)
    assert label_skew_lambda(torch.zeros(30, dtype=torch.long), c) == pytest.approx(1.5)
    assert label_skew_lambda(torch.arange(c).repeat(3), c) == pytest.approx(0.5)


def test_lambda_of_a_two_class_client_by_hand():
    # labels 3:1 over C = 2: P = (3/4, 1/4), M = (5/8, 3/8)
    kl_p = 0.75 * math.log(0.75 / 0.625) + 0.25 * math.log(0.25 / 0.375)
    kl_u = 0.5 * math.log(0.5 / 0.625) + 0.5 * math.log(0.5 / 0.375)
    jsd_max = 0.5 * (math.log(4 / 3) + 0.5 * math.log(2 / 3) + 0.5 * math.log(2))
    assert label_skew_lambda(torch.tensor([0, 0, 0, 1]), 2) == pytest.approx(0.5 * (kl_p + kl_u) / jsd_max + 0.5)


def test_eq_19_averages_each_entry_over_the_subnets_that_hold_it():
    params = {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0]])}
    values = [{"w": torch.tensor([[10.0, 20.0], [0.0, 0.0]])}, {"w": torch.tensor([[30.0, 0.0], [50.0, 0.0]])}]
    masks = [{"w": torch.tensor([[True, True], [False, False]])}, {"w": torch.tensor([[True, False], [True, False]])}]
    out = P.masked_mean(params, values, masks, [1.0, 1.0])["w"]
    # (0,0): both -> 20; (0,1): client 0 -> 20; (1,0): client 1 -> 50; (1,1): nobody -> keeps 4
    assert torch.equal(out, torch.tensor([[20.0, 20.0], [50.0, 4.0]]))
    weighted = P.masked_mean(params, values, masks, [3.0, 1.0])["w"]
    assert float(weighted[0, 0]) == pytest.approx((3 * 10 + 30) / 4)


def test_keeping_every_unit_is_fedavg(tmp_path):
    adds = tiny_config(**merge(ADDS, {"algorithm": {"sampling": False}}))
    run(adds, tmp_path / "adds", progress=False)
    fedavg = merge(ADDS, {})
    fedavg["algorithm"] = {"name": "fedavg", "weighting": "uniform"}
    run(tiny_config(**fedavg), tmp_path / "fedavg", progress=False)
    a = torch.load(tmp_path / "adds" / "checkpoint.pt", weights_only=True)["server"]["params"]
    b = torch.load(tmp_path / "fedavg" / "checkpoint.pt", weights_only=True)["server"]["params"]
    for name in b:
        if name != "alpha":  # never uploaded, the server's copy stays
            torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)


def test_a_sampled_run_learns_keep_ratios_and_uploads_a_subnet(tmp_path):
    run(tiny_config(**ADDS), tmp_path / "run", progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if "params_uploaded" in r][-1]
    sim = Simulation.from_config(tiny_config(**ADDS))
    supernet = sum(v.numel() for k, v in sim.fresh_state()["server"]["params"].items() if k != "alpha")
    assert last["params_downloaded"] == supernet
    assert 0 < last["params_uploaded"] < supernet
    assert last["upload_share"] == pytest.approx(last["params_uploaded"] / supernet)  # means over clients alike
    assert last["index_map_bits"] == 48
    assert last["alpha_mean"] != pytest.approx(0.99, abs=1e-4)  # the keep ratios moved
    assert 0.5 <= last["lambda"] <= 1.5 and 0.0 <= last["local_accuracy"] <= 1.0
    assert last["eps"] == pytest.approx(0.98**2)
    # the kept share of units follows the learned ratios: round(alpha_k C_k) per layer
    assert last["kept_units"] == pytest.approx(
        (round(last["alpha_0"] * 32) + round(last["alpha_1"] * 16)) / 48, abs=0.5 / 48 * 4 + 1e-9)


def test_a_model_without_sampleable_units_is_refused():
    sections = {**ADDS, "model": {"name": "linear"}}
    with pytest.raises(ConfigError, match="adds_vgg"):
        Simulation.from_config(tiny_config(**sections))


# ---------------------------------------------------------------------------- FedDrop

FEDDROP = merge(ADDS, {"algorithm": {"name": "feddrop", "keep": 0.5}})
FEDDROP["algorithm"] = {"name": "feddrop", "keep": 0.5}


def test_feddrop_keeping_every_unit_is_fedavg(tmp_path):
    run(tiny_config(**merge(FEDDROP, {"algorithm": {"keep": 1.0}})), tmp_path / "drop", progress=False)
    fedavg = merge(ADDS, {})
    fedavg["algorithm"] = {"name": "fedavg"}
    run(tiny_config(**fedavg), tmp_path / "fedavg", progress=False)
    a = torch.load(tmp_path / "drop" / "checkpoint.pt", weights_only=True)["server"]["params"]
    b = torch.load(tmp_path / "fedavg" / "checkpoint.pt", weights_only=True)["server"]["params"]
    for name in b:
        if name != "alpha":
            torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)


def test_feddrop_moves_only_the_rounds_sub_model(tmp_path):
    config = tiny_config(**merge(FEDDROP, {"federation": {"rounds": 1}}))
    sim = Simulation.from_config(config)
    init = sim.fresh_state()["server"]["params"]
    planned = sim.algorithm.configure_round(sim.fresh_state()["server"], [0, 1, 2, 3], 0)
    keep = planned["index_map"]
    assert int(keep[:32].sum()) == 16 and int(keep[32:].sum()) == 8  # keep 0.5 of each layer
    run(config, tmp_path / "run", progress=False)
    final = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["server"]["params"]
    dropped = ~keep[:32]
    # hidden layer 0: rows of dropped units never move; kept rows do
    assert torch.equal(final["fcs.0.weight"][dropped], init["fcs.0.weight"][dropped])
    assert not torch.equal(final["fcs.0.weight"][~dropped], init["fcs.0.weight"][~dropped])
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    # the sub-model: 64 inputs -> 16 -> 8 -> 10 classes, with biases
    sub = 64 * 16 + 16 + 16 * 8 + 8 + 8 * 10 + 10
    assert rows[0]["params_uploaded"] == rows[0]["params_downloaded"] == sub


# ---------------------------------------------------------------------------- step pieces


def test_architecture_rows_join_validation_rows_with_one_draw_per_role():
    from fedveil.algorithms.adds import ArchitectureRows
    from fedveil.data.arrays import ArrayDataset
    from fedveil.models.supernet import EPS, LABEL, ROLE, UNIFORMS
    from fedveil.training import Batch

    val = ArrayDataset(torch.arange(10.0).view(10, 1), torch.arange(10), {"writer": torch.arange(10) % 3})
    batch = Batch(-torch.ones(4, 1), torch.full((4,), 7), {"writer": torch.zeros(4, dtype=torch.long)})
    out = ArchitectureRows(val, 0.25, 6, 3)({}, batch, torch.Generator().manual_seed(0))
    assert out.x.shape == (7, 1) and torch.equal(out.x[:4], batch.x)
    assert set(out.x[4:].flatten().tolist()) <= set(range(10)) and len(set(out.x[4:].flatten().tolist())) == 3
    assert torch.equal(out.groups[ROLE], torch.tensor([0.0] * 4 + [1.0] * 3))
    u = out.groups[UNIFORMS]
    assert torch.equal(u[0], u[3]) and torch.equal(u[4], u[6]) and not torch.equal(u[0], u[4])
    assert torch.all(out.groups[EPS] == 0.25) and torch.equal(out.groups[LABEL], out.y)
    assert torch.equal(out.groups["writer"][4:], val.groups["writer"][out.x[4:].flatten().long()])


def test_keep_ratio_term_adds_the_regulariser_scales_and_projects():
    from fedveil.algorithms.adds import KeepRatioTerm

    term = KeepRatioTerm(lam=0.8, alpha_range=(0.05, 0.95), scale=10.0)
    w = {"alpha": torch.tensor([0.5, 0.97, 0.02, 0.95]), "w": torch.ones(2)}
    g = {"alpha": torch.tensor([0.1, -3.0, 1.0, -0.5]), "w": torch.full((2,), 3.0)}
    out = term(w, g)
    # (g + 2 lam clamp(alpha)) * scale, outward components dropped at or beyond the range's ends
    assert out["alpha"][0] == pytest.approx((0.1 + 1.6 * 0.5) * 10)
    assert out["alpha"][1] == 0.0  # above hi and the step would raise alpha further
    assert out["alpha"][2] == 0.0  # below lo and the step would lower it further
    assert out["alpha"][3] == pytest.approx((-0.5 + 1.6 * 0.95) * 10)  # at hi but pointing inwards
    assert torch.equal(out["w"], g["w"])
