"""Node-level accounting (Theorem 2.4.4) against the spec's recomputed values and closed forms."""
from __future__ import annotations

import math

import numpy as np
import pytest

from fedveil.pets.node_dp import C2_ORDERS, node_epsilon, node_rdp, steps_for_epochs

N, B = 2_609_976, 512  # Smoke


@pytest.mark.parametrize("epochs,sigma,expected", [
    (2, 5.0, 7.78), (2, 4.5, 8.81), (2, 1.0, 64.4), (2, 0.5, 243.5),
    (1, 4.5, 6.28), (1, 1.0, 46.0), (1, 0.5, 193.9),
])
def test_code_convention_matches_the_spec_recomputation(epochs, sigma, expected):
    """spec 002 §6.2: [C2] accountant, N = 2,609,976, b = 512, D = 20, delta = 1/N."""
    res = node_epsilon(N, 20, B, sigma, steps_for_epochs(N, B, epochs), convention="code")
    assert res.epsilon == pytest.approx(expected, rel=0.01)
    assert res.delta == 1 / N and res.steps == epochs * 5098


def test_d21_three_epochs_is_the_tables_moderate_row():
    assert node_epsilon(N, 21, B, 1.0, steps_for_epochs(N, B, 3), convention="code").epsilon == pytest.approx(85.6, rel=0.01)


def test_thesis_exponent_is_four_times_larger():
    """2 rho^2 / sigma^2 = rho^2 / (2 (sigma/2)^2): the thesis at sigma equals the code at sigma / 2."""
    steps = steps_for_epochs(N, B, 2)
    assert node_epsilon(N, 20, B, 1.0, steps).epsilon == pytest.approx(243.5, rel=0.01)  # = code at 0.5
    assert node_epsilon(N, 20, B, 2.0, steps).epsilon == pytest.approx(node_epsilon(N, 20, B, 1.0, steps, convention="code").epsilon)
    assert node_epsilon(N, 20, B, 4.5, steps).epsilon > 2 * node_epsilon(N, 20, B, 4.5, steps, convention="code").epsilon


def test_single_occurrence_is_the_sampled_gaussian_without_replacement_formula():
    """S = 1: rho ~ Bernoulli(q = b/n), gamma = ln(1 - q + q exp(alpha (alpha - 1) c / sigma^2)) / (alpha - 1)."""
    n, b, sigma = 1000, 10, 3.0
    q = b / n
    alphas = np.array([2.0, 3.5, 10.0])
    for conv, c in (("thesis", 2.0), ("code", 0.5)):
        expected = np.log(1 - q + q * np.exp(alphas * (alphas - 1) * c / sigma**2)) / (alphas - 1)
        np.testing.assert_allclose(node_rdp(n, 1, b, sigma, tuple(alphas), conv), expected, rtol=1e-10)


def test_full_batch_every_node_in_every_step():
    """b = n: rho = S surely, gamma = 2 alpha S^2 / sigma^2, the Gaussian mechanism with sensitivity 2 S C."""
    alphas = (2.0, 5.0)
    np.testing.assert_allclose(node_rdp(50, 4, 50, 2.0, alphas, "thesis"), [a * 2 * 16 / 4 for a in alphas], rtol=1e-10)


def test_monotone_and_edge_cases():
    steps = 100
    eps = [node_epsilon(10_000, 10, 100, s, steps).epsilon for s in (0.5, 1.0, 2.0, 4.0)]
    assert all(a > b for a, b in zip(eps, eps[1:]))
    assert node_epsilon(10_000, 20, 100, 1.0, steps).epsilon > node_epsilon(10_000, 5, 100, 1.0, steps).epsilon
    assert math.isinf(node_epsilon(10_000, 10, 100, 0.0, steps).epsilon)
    assert node_epsilon(10_000, 10, 100, 1.0, 0).epsilon == 0.0
    assert steps_for_epochs(1025, 512, 2) == 6
    assert len(C2_ORDERS) == 17 + 118 + 3 and C2_ORDERS[0] == 1.01 and C2_ORDERS[-1] == 512


@pytest.mark.parametrize("kwargs,match", [
    ({"max_occurrences": 0}, "max_occurrences"), ({"batch_size": 0}, "batch size"), ({"noise_multiplier": -1.0}, "noise"),
    ({"convention": "paper"}, "convention"), ({"steps": -1}, "steps"), ({"delta": 1.5}, "delta"),
])
def test_bad_arguments(kwargs, match):
    args = {"num_nodes": 100, "max_occurrences": 5, "batch_size": 10, "noise_multiplier": 1.0, "steps": 10} | kwargs
    with pytest.raises(ValueError, match=match):
        node_epsilon(**args)
