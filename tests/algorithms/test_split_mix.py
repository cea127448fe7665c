"""Split-Mix (spec 000 part 2 §A.1-A.6): budgets, the base plan of Alg. 4.2, per-base
training and aggregation, test-time mixing, and serial = vectorized with batch statistics."""
from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from scipy.stats import lognorm

from fedveil.algorithms.budgets import group_budgets, lognormal_budgets
from fedveil.algorithms.split_mix import PerBaseLoss, rename_bases
from fedveil.config import ClientConfig
from fedveil.data.arrays import ArrayDataset
from fedveil.errors import ConfigError
from fedveil.models import build_model
from fedveil.models.functional import forward, model_state
from fedveil.runtime import run
from fedveil.runtime.simulation import Simulation
from fedveil.training import LocalTrainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from tiny_runs import merge, run_in_float64, tiny_config  # noqa: E402

torch.set_num_threads(1)

SPLIT_MIX = {
    "data": {"name": "digits", "num_clients": 8},
    "model": {"name": "digit_cnn", "options": {"width": 0.5, "bases": 4}},
    "algorithm": {"name": "split_mix", "budgets": [0.125, 0.25, 0.5]},
    "client": {"batch_size": 16, "lr": 0.05, "momentum": 0.9, "steps": 3},
    "federation": {"rounds": 3, "clients_per_round": 8},
    "eval": {"every": 3},
    "checkpoint": {"every": 1},
}


def _simulation(**sections) -> Simulation:
    return Simulation.from_config(tiny_config(**merge(SPLIT_MIX, sections)))


# ------------------------------------------------------------------ budgets


def test_group_budgets_tie_widths_to_client_order_ascending():
    budgets = group_budgets(50, [1.0, 0.5, 0.25, 0.125])
    # floor(4 i / 50): i = 0..12 -> 0, 13..24 -> 1, 25..37 -> 2, 38..49 -> 3 (the notes' 13/12/13/12)
    assert [budgets.count(w) for w in (0.125, 0.25, 0.5, 1.0)] == [13, 12, 13, 12]
    assert budgets[0] == 0.125 and budgets[12] == 0.125 and budgets[13] == 0.25 and budgets[-1] == 1.0
    assert group_budgets(4, [0.125, 1, 1, 1]) == [0.125, 1, 1, 1]  # "8-1-1-1"


def test_lognormal_budgets_bin_clients_by_scipys_cdf():
    widths = [0.125 * (i + 1) for i in range(8)]
    k, s, scale = 50, 0.5, 0.4
    cdf = [lognorm(s, scale=scale).cdf(w) for w in widths] + [1.0]
    q = [c - cdf[0] for c in cdf]
    bounds = [int(k * qi / q[-1]) for qi in q]
    expected = []
    for i, w in enumerate(widths):
        expected += [w] * (bounds[i + 1] - bounds[i])
    assert lognormal_budgets(k, s, scale, widths) == expected
    assert len(expected) == k


# ------------------------------------------------------------------ the plan (Alg. 4.2)


def test_first_bases_walk_the_shuffled_permutation_and_extra_bases_are_distinct():
    sim = _simulation()
    algo, server = sim.algorithm, sim.fresh_state()["server"]
    assert algo.num_bases == 4 and algo.base_width == 0.125
    assert algo.bases_per_client == [1, 1, 1, 2, 2, 2, 4, 4]  # budgets 1/8 x3, 1/4 x3, 1/2 x2
    firsts = []
    for round_idx in range(3):
        planned = algo.configure_round(server, list(range(8)), round_idx)
        for cid, bases in planned["plan"].items():
            assert len(bases) == algo.bases_per_client[cid] and len(set(bases)) == len(bases)
            assert set(bases) <= set(range(4))
            firsts.append(bases[0])
        server = algo.aggregate(planned, [], round_idx)
        assert "plan" not in server
    # 24 draws of the cyclic pointer: every block of M = 4 is a permutation of the bases
    for block in range(0, 24, 4):
        assert sorted(firsts[block : block + 4]) == [0, 1, 2, 3]
    again = algo.configure_round(sim.fresh_state()["server"], list(range(8)), 0)
    assert again["plan"] == algo.configure_round(sim.fresh_state()["server"], list(range(8)), 0)["plan"]


# ------------------------------------------------------------------ training and aggregation


def test_aggregation_averages_each_base_over_the_clients_that_trained_it():
    sim = _simulation()
    algo = sim.algorithm
    params = {"bases.0.w": torch.tensor([1.0]), "bases.1.w": torch.tensor([2.0]), "bases.2.w": torch.tensor([3.0])}
    state = {"params": params, "order": torch.arange(3), "pointer": 0, "plan": {}}
    results = [
        (0, {"delta": {"bases.0.w": torch.tensor([1.0])}, "num_examples": 10}),
        (1, {"delta": {"bases.0.w": torch.tensor([5.0]), "bases.1.w": torch.tensor([-4.0])}, "num_examples": 30}),
    ]
    new = algo.aggregate(state, results, 0)["params"]
    assert new["bases.0.w"].item() == pytest.approx(1.0 + (10 * 1 + 30 * 5) / 40)  # 5.0
    assert new["bases.1.w"].item() == pytest.approx(2.0 - 4.0)  # only client 1 trained base 1
    assert new["bases.2.w"].item() == 3.0  # nobody trained base 2: unchanged


def test_per_base_loss_trains_each_base_exactly_as_alone():
    torch.manual_seed(0)
    ensemble = build_model("digit_cnn", (1, 8, 8), 10, width=0.25, bases=2, norm="batch_average")
    state = model_state(ensemble)
    data = ArrayDataset(torch.rand(20, 1, 8, 8), torch.randint(0, 10, (20,)))
    config = ClientConfig(batch_size=10, lr=0.1, momentum=0.9, weight_decay=5e-4, steps=3)
    trainer = LocalTrainer(ensemble, F.cross_entropy, config, total_rounds=1)
    both, _ = trainer.train(state, data, torch.Generator().manual_seed(1), 0, model=ensemble.with_bases(2, "stack"),
                            objective=PerBaseLoss(F.cross_entropy))
    single = ensemble.with_bases(1, "stack")
    for base in (0, 1):
        alone_start = rename_bases(state, {base: 0})
        alone, _ = trainer.train(alone_start, data, torch.Generator().manual_seed(1), 0, model=single,
                                 objective=PerBaseLoss(F.cross_entropy))
        for name, value in rename_bases(alone, {0: base}).items():
            torch.testing.assert_close(both[name], value, rtol=1e-5, atol=1e-6)


def test_a_width_mixes_the_logits_of_the_first_bases():
    sim = _simulation()
    algo, params = sim.algorithm, sim.fresh_state()["server"]["params"]
    x = torch.rand(12, 1, 8, 8)
    one = build_model("digit_cnn", (1, 8, 8), 10, width=0.125)  # one base, same architecture

    def base(i: int) -> dict:
        prefix = f"bases.{i}."
        return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}

    logits = [forward(one, base(i), x) for i in range(4)]
    torch.testing.assert_close(algo.predict_at(params, x, 0.25), (logits[0] + logits[1]) / 2)
    torch.testing.assert_close(algo.predict_at(params, x, 0.125), logits[0])
    torch.testing.assert_close(algo.predict(sim.trainer.model, params, x), sum(logits) / 4)  # test_width 1 = x0.5 here
    assert algo.widths() == [0.125, 0.25, 0.375, 0.5]


# ------------------------------------------------------------------ runs


# Executor agreement is checked in float64. In float32 the runs hit a measure-zero discontinuity:
# with 3 rounds of 8 clients and 4 bases, some 2x2 max-pool window holds two values closer than
# float32 rounding (seed 0: 4.5e-7 apart, base 3 of client 7, after bn2), so the two executors'
# max-pool subgradients send that window's gradient to different positions and conv1-conv2 of
# that base differ by a quarter of an update; which way the tie falls depends on the CPU's
# vector unit. In float64 the same runs agree to 4e-15.
WELL_CONDITIONED = {
    "data": {"name": "synthetic_images", "options": {"height": 8, "width": 8, "rows": 600}},
    "client": {"lr": 0.01},
}


def _assert_executors_agree(sections):
    results = {ex: run_in_float64(tiny_config(**merge(sections, {"executor": ex}))) for ex in ("serial", "vectorized")}
    (rows_s, server_s), (rows_v, server_v) = results["serial"], results["vectorized"]
    for name, value in server_s["params"].items():
        assert value.dtype == torch.float64 or not value.is_floating_point(), name
        torch.testing.assert_close(server_v["params"][name], value, rtol=1e-10, atol=1e-12, msg=name)
    return rows_s, rows_v, server_s, server_v


@pytest.mark.parametrize("norm", ["batch_average", "batch_tracked"])
def test_serial_and_vectorized_agree_with_batch_statistics(norm):
    rows_s, rows_v, server_s, server_v = _assert_executors_agree(
        merge(SPLIT_MIX, {**WELL_CONDITIONED, "model": {"options": {"norm": norm}}})
    )
    assert torch.equal(server_s["order"], server_v["order"])
    assert rows_s[-1]["global_test_accuracy"] == pytest.approx(rows_v[-1]["global_test_accuracy"], abs=1e-12)
    assert rows_s[-1]["bases_trained"] == pytest.approx((1 * 3 + 2 * 3 + 4 * 2) / 8)


def test_serial_and_vectorized_agree_on_the_private_group_norm_route():
    """Split-Mix's DP route (norm "group", example-level DP-SGD): both executors, same numbers."""
    private = {"privacy": {"level": "example", "noise_multiplier": 1.0, "clip": 1.0, "delta": 1e-5}}
    rows_s, rows_v, _, _ = _assert_executors_agree(
        merge(SPLIT_MIX, {**WELL_CONDITIONED, **private, "model": {"options": {"norm": "group"}}})
    )
    assert rows_s[-1]["epsilon"] == rows_v[-1]["epsilon"] > 0


def test_state_is_plain_checkpointable_data(tmp_path):
    run(tiny_config(**SPLIT_MIX), tmp_path / "run", progress=False)
    ck = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    server = ck["server"]
    assert set(server) == {"params", "order", "pointer"}
    buffer = io.BytesIO()
    torch.save(server, buffer)
    buffer.seek(0)
    assert torch.equal(torch.load(buffer, weights_only=True)["order"], server["order"])


def test_clear_errors_before_any_work():
    with pytest.raises(ConfigError, match="bases"):
        _simulation(model={"name": "digit_cnn", "options": {"width": 0.5, "bases": 1}})
    with pytest.raises(ConfigError, match="narrower than one base"):
        _simulation(algorithm={"budgets": [0.1, 0.5]})
    with pytest.raises(ConfigError, match="test_width"):
        _simulation(algorithm={"test_width": 0.1})


def test_masked_cross_entropy_zeroes_absent_class_logits_and_couples_the_batch():
    from fedveil.training.local import masked_cross_entropy
    from fedveil.training.request import TaskLoss

    out = torch.tensor([[2.0, 1.0, -1.0], [0.5, 3.0, 1.0]])
    y = torch.tensor([0, 0])  # classes 1 and 2 absent: their logits become 0
    expected = F.cross_entropy(torch.tensor([[2.0, 0.0, 0.0], [0.5, 0.0, 0.0]]), y)
    torch.testing.assert_close(masked_cross_entropy(out, y), expected)
    assert not TaskLoss(masked_cross_entropy).per_example_ok and TaskLoss(F.cross_entropy).per_example_ok
    assert not PerBaseLoss(masked_cross_entropy).per_example_ok
    with pytest.raises(ConfigError, match="couples the examples"):
        tiny_config(**merge(SPLIT_MIX, {"client": {"loss": "masked_cross_entropy"},
                                        "privacy": {"level": "example", "epsilon": 4.0, "clip": 1.0}}))


def test_masked_loss_runs_agree_on_both_executors():
    _assert_executors_agree(merge(merge(SPLIT_MIX, WELL_CONDITIONED), {
        "client": {"loss": "masked_cross_entropy"}, "data": {"partition": {"name": "shards", "classes_per_client": 3}},
    }))


def test_locally_tracked_statistics_stay_with_the_clients(tmp_path):
    """Table C.3's 'locally tracked': the server never averages the BN statistics; each client
    keeps those of the bases it trained, and is scored with them."""
    from fedveil.runtime.saved_model import evaluate_saved, saved_client_states

    sections = {
        "data": {"name": "rotated_digits", "num_clients": 4, "options": {"num_domains": 2}, "partition": {"name": "domain"}},
        "model": {"name": "digit_cnn", "options": {"width": 0.25, "bases": 2, "norm": "batch_tracked", "rescale_layer": False}},
        "algorithm": {"name": "split_mix", "budgets": [0.125, 0.25], "buffers": "local"},
        "client": {"batch_size": 16, "lr": 0.01, "steps": 2},
        "federation": {"rounds": 2, "clients_per_round": 4},
        "eval": {"personal": False},
    }
    config = tiny_config(**sections)
    init = Simulation.from_config(config).fresh_state()["server"]["params"]
    run(config, tmp_path / "run", progress=False)
    final = torch.load(tmp_path / "run" / "model.pt", weights_only=True)
    stats = [k for k in final if k.endswith("running_mean")]
    assert stats and all(torch.equal(final[k], init[k]) for k in stats)  # the server's copy never moves
    states = saved_client_states(tmp_path / "run")
    assert set(states) == {0, 1, 2, 3}
    for state in states.values():
        assert state["buffers"] and all(not torch.equal(v, init[k]) for k, v in state["buffers"].items()
                                        if k.endswith("running_mean"))
    rows = evaluate_saved(tmp_path / "run", [0.125, 0.25], local_bn=True)
    assert [r["width"] for r in rows] == [0.125, 0.25] and all(0 <= r["accuracy"] <= 1 for r in rows)
    with pytest.raises(ConfigError, match="tracked"):
        Simulation.from_config(tiny_config(**merge(sections, {"model": {"options": {"norm": "none"}}})))
