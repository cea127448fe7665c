"""Distributed DP under secure aggregation (issue 35, item 2): every silo adds a Skellam share.

* The mechanism: conditional rounding never exceeds its L2 bound; with the noise off, the
  decoded mean is the mean of the clipped updates within the rounding bound worked out
  here; with it on, the decoded mean's error has the standard deviation of the summed
  shares, sqrt(n * share) / (gamma * m).
* The plan: each silo's share is the round's variance over (threshold - colluders), and the
  ledger records the noise the survivors actually carried, (survivors - colluders) * share;
  at threshold 1 the run spends exactly its budget, computed here from the theorem.
* What cannot run is refused in one line before work.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedveil.config import ConfigError
from fedveil.privacy.randomness import NoiseSource, ZeroNoiseStream
from fedveil.runtime import MemoryRecorder, Simulation
from fedveil.runtime import distributed_dp as ddp
from fedveil.runtime.distributed_dp import DistributedDP, DistributedDPError
from fedveil.runtime.secure_sum import layout_of, modular_sum

from tiny_runs import merge, tiny_config

pytestmark = pytest.mark.usefixtures("skip_plots")

CLIP, BITS = 2.0, 16


def updates(n: int, d: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [{"b": torch.randn(d // 2, generator=gen, dtype=torch.float64),
             "a": torch.randn(d - d // 2, generator=gen, dtype=torch.float64) * (k + 1)} for k in range(n)]


def clipped(update, clip):
    norm = math.sqrt(sum(float(v.pow(2).sum()) for v in update.values()))
    return {k: v * min(1.0, clip / norm) for k, v in update.items()}


def test_conditional_rounding_stays_within_its_bound_and_falls_back_to_truncation(monkeypatch):
    mech = DistributedDP(CLIP, 4, 10_000, 1.0)  # L = 7: rounding noise dominates, the bound binds
    rng = np.random.default_rng(0)
    scaled = rng.normal(size=10_000)
    scaled *= mech.norm_units / np.linalg.norm(scaled)
    for _ in range(20):
        rounded = mech.round(scaled, rng)
        assert np.array_equal(rounded, np.round(rounded)) and np.linalg.norm(rounded) <= mech.l2_sensitivity
    monkeypatch.setattr(ddp, "ROUNDING_TRIES", 0)
    truncated = mech.round(scaled, rng)
    assert np.array_equal(truncated, np.trunc(scaled)) and np.linalg.norm(truncated) <= mech.norm_units


def test_without_noise_the_decoded_mean_is_the_clipped_mean_within_the_rounding_bound():
    n, d, m = 4, 300, 5.0
    mech = DistributedDP(CLIP, BITS, d, m)
    ups = updates(n, d)
    vectors = [mech.encode(u, 1e6, ZeroNoiseStream(np.random.default_rng(k)), np.random.default_rng(k)) for k, u in enumerate(ups)]
    mean = mech.decode(modular_sum(vectors), layout_of(ups[0]), torch.float64, torch.device("cpu"))
    exact = {k: sum(clipped(u, CLIP)[k] for u in ups) / m for k in ups[0]}
    gamma = ((1 << (BITS - 1)) - 1) / CLIP
    for key in exact:  # each silo's rounding moves a coordinate by less than one integer unit
        assert float((mean[key] - exact[key]).abs().max()) < n / (gamma * m)
    assert float((mean["a"] - exact["a"]).abs().max()) > 0  # rounding happened (not a copy)


def test_with_noise_the_decoded_mean_carries_the_summed_shares():
    n, d, m, share = 3, 20_000, 3.0, 4e6
    mech = DistributedDP(CLIP, BITS, d, m)
    ups = updates(n, d, seed=1)
    vectors = [mech.encode(u, share, np.random.default_rng(10 + k), np.random.default_rng(k)) for k, u in enumerate(ups)]
    mean = mech.decode(modular_sum(vectors), layout_of(ups[0]), torch.float64, torch.device("cpu"))
    error = torch.cat([(mean[k] - sum(clipped(u, CLIP)[k] for u in ups) / m) for k in sorted(mean)])
    expected_std = math.sqrt(n * share) / (mech.scale * m)  # rounding adds < 1/sqrt(12) units: 0.02% of it
    assert float(error.std()) == pytest.approx(expected_std, rel=0.03)  # 2e4 coordinates: 0.5% sampling error


def test_a_share_covers_the_threshold_less_the_colluders():
    mech = DistributedDP(CLIP, BITS, 100, 4.0, colluders=1)
    assert mech.share(90.0, 4) == pytest.approx(30.0)
    assert mech.release(5, 30.0).event.variance == pytest.approx(120.0)
    with pytest.raises(DistributedDPError, match="colluders"):
        mech.share(90.0, 1)


def dist_config(**sections):
    base = {
        "privacy": {"level": "client", "epsilon": 4.0, "delta": 1e-5, "clip": 0.5},
        "secure_aggregation": {"enabled": True},
        "data": {"num_clients": 6}, "federation": {"rounds": 5, "clients_per_round": 6},
    }
    return tiny_config(**merge(base, sections))


def theorem_epsilon(variances, d2, d1, delta, orders):
    a = np.ceil(np.asarray(orders) - 1e-12)
    rdp = sum(a * d2**2 / (2 * v) + np.minimum(((2 * a - 1) * d2**2 + 6 * d1) / (4 * v * v), 3 * d1 / (2 * v)) for v in variances)
    return float(np.min(rdp + np.log((a - 1) / a) - (math.log(delta) + np.log(a)) / (a - 1)))


@pytest.mark.parametrize("threshold, colluders", [(1.0, 0), (0.66, 0), (0.66, 1)])
def test_the_ledger_records_the_noise_the_survivors_carried(threshold, colluders):
    config = dist_config(secure_aggregation={"threshold": threshold, "colluders": colluders})
    sim = Simulation.from_config(config)
    summary = sim.record(MemoryRecorder())
    plan, mech = sim.privacy, sim.privacy.plan.distributed.mechanism
    t = max(2, math.ceil(threshold * 6 - 1e-9))
    releases = sim.privacy.ledger.releases("population")
    assert len(releases) == 5 and plan.released_rounds == list(range(5))
    planned_variance = (plan.plan.population_noise * mech.l2_sensitivity) ** 2
    for release in releases:
        assert release.event.variance == pytest.approx(planned_variance * (6 - colluders) / (t - colluders), rel=1e-12)
    spent = theorem_epsilon([r.event.variance for r in releases], mech.l2_sensitivity, mech.l1_sensitivity, 1e-5,
                            plan.ledger.accountant.orders)
    assert summary["epsilon"] == pytest.approx(spent, rel=1e-9)
    if t == 6 and colluders == 0:  # no spare noise: the budget is spent exactly
        assert summary["epsilon"] == pytest.approx(4.0, rel=1e-3)
    else:
        assert summary["epsilon"] < 4.0
    assert summary["distributed_dp"]["rounds_released"] == 5


def test_with_the_noise_off_distributed_and_central_dp_fedavg_train_the_same_model():
    """A zero noise source: the mechanisms then differ only by the rounding, less than one
    integer unit per silo and coordinate, 1/gamma after dividing by the cohort."""
    central = tiny_config(privacy={"level": "client", "noise_multiplier": 1.0, "clip": 0.5, "delta": 1e-5},
                          data={"num_clients": 6}, federation={"rounds": 3, "clients_per_round": 6, "sampling": "poisson"})
    distributed = dist_config(privacy={"noise_multiplier": 1.0, "epsilon": None}, federation={"rounds": 3})
    finals = []
    for config in (central, distributed):
        sim = Simulation.from_config(config, noise=NoiseSource("zero"))
        state = sim.fresh_state()
        for r in range(3):
            sim.train_round(state, r)
        finals.append(sim.algorithm.global_params(state["server"]))
    gamma = ((1 << 19) - 1) / 0.5
    moved = max(float((finals[0][k] - sim.init[k]).abs().max()) for k in finals[0])
    gap = max(float((finals[0][k] - finals[1][k]).abs().max()) for k in finals[0])
    assert moved > 1e-2 and gap < 3 * 2 / gamma  # 3 rounds, at most one unit per coordinate each (lr 1)


@pytest.mark.parametrize("sections, match", [
    ({"privacy": {"adaptive_clip": True}}, "adaptive_clip"),
    ({"privacy": {"accountant": "pld"}}, "RDP bound only"),
    ({"privacy": {"records_per_person": 2}}, "records_per_person"),
    ({"secure_aggregation": {"bits": 4}}, "raise bits"),
    ({"secure_aggregation": {"bits": 31}}, "lower bits"),
    ({"secure_aggregation": {"colluders": 4}}, "colluders"),
])
def test_what_cannot_run_is_refused_in_one_line(sections, match):
    with pytest.raises(ConfigError, match=match) as err:
        Simulation.from_config(dist_config(**sections))
    assert "\n" not in str(err.value)
