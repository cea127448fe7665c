"""The secure source: correct distributions, nothing replayable from the seed.

Draws from ``os.urandom`` cannot be fixed by a seed, so the statistical checks use bounds
several standard errors wide (a false failure has probability below 1e-6 per test).
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import stats

from fedveil.privacy.randomness import SECURE, fill_standard_normal_, permutation, standard_normal, uniform


def test_secure_uniforms_are_uniform_on_the_unit_interval():
    u = uniform(200_000, SECURE, torch.float64).numpy()
    assert u.min() >= 0.0 and u.max() < 1.0
    assert stats.kstest(u, "uniform").pvalue > 1e-6


def test_secure_normals_are_standard_normal():
    z = standard_normal((400, 500), SECURE, torch.float64)
    assert z.shape == (400, 500) and z.dtype == torch.float64
    flat = z.flatten().numpy()
    n = flat.size
    assert abs(flat.mean()) < 6 / math.sqrt(n)
    assert abs(flat.var() - 1.0) < 6 * math.sqrt(2 / n)
    assert stats.kstest(flat, "norm").pvalue > 1e-6
    filled = fill_standard_normal_(torch.empty(1000, dtype=torch.float32), SECURE)
    assert filled.dtype == torch.float32 and torch.isfinite(filled).all() and filled.std() > 0.5


def test_secure_permutations_are_uniform():
    counts: dict[tuple, int] = {}
    draws = 30_000
    for _ in range(draws):
        key = tuple(permutation(3, SECURE).tolist())
        counts[key] = counts.get(key, 0) + 1
    assert sorted(counts) == sorted(itertools.permutations(range(3)))
    expected = draws / 6
    assert stats.chisquare(list(counts.values()), [expected] * 6).pvalue > 1e-6


def test_secure_draws_do_not_repeat_and_generators_still_do():
    assert not torch.equal(standard_normal((64,), SECURE), standard_normal((64,), SECURE))
    a = standard_normal((64,), torch.Generator().manual_seed(3))
    b = standard_normal((64,), torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    torch.testing.assert_close(a, torch.randn(64, generator=torch.Generator().manual_seed(3)))
    assert torch.equal(permutation(10, torch.Generator().manual_seed(1)), torch.randperm(10, generator=torch.Generator().manual_seed(1)))
    assert np.array_equal(uniform(5, torch.Generator().manual_seed(2)).numpy(), torch.rand(5, generator=torch.Generator().manual_seed(2)).numpy())


@pytest.mark.parametrize("level", ["example", "client"])
def test_a_secure_run_cannot_be_replayed_from_its_seed(tmp_path, monkeypatch, level):
    """Same config and seed twice: with secure noise the models differ (the seed fixes nothing
    the noise depends on), the accounting is the same and still checked every round."""
    import fedveil.runtime.simulation as simulation
    from fedveil.config import validate
    from fedveil.runtime import Simulation

    monkeypatch.setattr(simulation, "write_report", lambda path: [])  # no plots needed
    raw = {
        "seed": 0, "data": {"name": "digits", "num_clients": 5}, "model": {"name": "linear"},
        "client": {"batch_size": 32, "lr": 0.1, "steps": 3}, "federation": {"rounds": 2, "clients_per_round": 5},
        "privacy": {"level": level, "epsilon": 4.0, "secure_rng": True},
    }
    if level == "client":
        raw["data"]["num_clients"], raw["federation"] = 20, {"rounds": 2, "clients_per_round": 5, "sampling": "poisson"}

    runs = []
    for i in range(2):
        sim = Simulation.from_config(validate(raw))
        summary = sim.run(tmp_path / f"run{i}")
        assert summary["secure_rng"] is True
        runs.append((sim.algorithm.global_params(torch.load(tmp_path / f"run{i}" / "checkpoint.pt", weights_only=True)["server"]), summary))
    (p0, s0), (p1, s1) = runs
    assert any(not torch.equal(p0[k], p1[k]) for k in p0)
    if level == "example":
        assert s0["epsilon_per_client"] == s1["epsilon_per_client"]
