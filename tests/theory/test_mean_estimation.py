"""Closed forms of MR-MTL private mean estimation (thesis §1.6, App. D-E; spec 002 §3, §6.3).

Reference numbers are the spec's §6.3 table and values worked out by hand in the comments.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import optimize

from fedveil.privacy.composition import MRMTL_ORDERS
from fedveil.theory import (
    fedavg_error,
    fedavg_gap,
    gaussian_sigma_dp,
    local_error,
    local_gap,
    local_variance,
    local_weight,
    mrmtl_error,
    mrmtl_estimates,
    optimal_error,
    optimal_lambda,
    per_silo_mrmtl_errors,
    per_silo_optimal_lambdas,
    privacy_cost,
    simulate_mean_estimation,
    tnb_expected_runs,
    tnb_gamma,
    tnb_tuning_rdp,
    tuned_gaussian_sigma_dp,
)

K, N, SIGMA = 20, 200, 0.4
SPEC_Z = 14.567  # spec §6.3: RDP-calibrated z for one Gaussian release at (0.25, 1e-5)
# spec §6.3: (tau, private) -> (sigma_loc^2, lam*, E*, E_loc, E_fed)
SPEC_TABLE = [
    (0.03, False, 8.000e-4, 0.8889, 4.4235e-4, 8.000e-4, 8.950e-4),
    (0.03, True, 6.105e-3, 6.783, 1.0504e-3, 6.105e-3, 1.1602e-3),
    (0.08, False, 8.000e-4, 0.125, 7.1556e-4, 8.000e-4, 6.1200e-3),
    (0.08, True, 6.105e-3, 0.9539, 3.2735e-3, 6.105e-3, 6.3852e-3),
    (0.2, False, 8.000e-4, 0.02, 7.8510e-4, 8.000e-4, 3.8040e-2),
    (0.2, True, 6.105e-3, 0.1526, 5.3370e-3, 6.105e-3, 3.8305e-2),
]


@pytest.fixture(scope="module")
def sigma_dp() -> float:
    return gaussian_sigma_dp(0.25, 1e-5, 1.0)


def spec_sigma_loc2(private: bool) -> float:
    return local_variance(SIGMA, N, SPEC_Z if private else 0.0)


# --------------------------------------------------------------------------- noise calibration


def test_rdp_noise_for_one_release_matches_spec(sigma_dp):
    assert sigma_dp == pytest.approx(SPEC_Z, rel=1e-4)
    assert gaussian_sigma_dp(0.25, 1e-5, 1.0, orders=MRMTL_ORDERS) == pytest.approx(SPEC_Z, rel=1e-4)
    assert gaussian_sigma_dp(0.25, 1e-5, 2.0) == pytest.approx(2 * sigma_dp)
    # the classic analytic formula would give sqrt(2 ln(1.25e5))/0.25 = 19.38: RDP is tighter
    assert sigma_dp < math.sqrt(2 * math.log(1.25 / 1e-5)) / 0.25 - 4


# --------------------------------------------------------------------------- §6.3 table


@pytest.mark.parametrize("tau, private, s2, lam, e_star, e_loc, e_fed", SPEC_TABLE)
def test_spec_table(sigma_dp, tau, private, s2, lam, e_star, e_loc, e_fed):
    sigma_loc2 = local_variance(SIGMA, N, sigma_dp if private else 0.0)
    assert sigma_loc2 == pytest.approx(s2, rel=1e-3)
    assert optimal_lambda(sigma_loc2, tau) == pytest.approx(lam, rel=1e-3)
    assert optimal_error(sigma_loc2, tau, K) == pytest.approx(e_star, rel=1e-4)
    assert local_error(sigma_loc2) == pytest.approx(e_loc, rel=1e-3)
    assert fedavg_error(sigma_loc2, tau, K) == pytest.approx(e_fed, rel=1e-4)


def test_local_variance_by_hand():
    # 0.16/200 + 14.567^2/200^2 = 8e-4 + 5.30489e-3
    assert local_variance(0.4, 200, 14.567) == pytest.approx(8e-4 + 212.197489 / 40000, rel=1e-12)
    assert local_variance(0.4, 200) == pytest.approx(8e-4, rel=1e-12)


# --------------------------------------------------------------------------- identities


@pytest.mark.parametrize("tau, private", [(row[0], row[1]) for row in SPEC_TABLE])
def test_error_curve_identities(tau, private):
    s2 = spec_sigma_loc2(private)
    lam_star = optimal_lambda(s2, tau)
    assert mrmtl_error(0.0, s2, tau, K) == pytest.approx(local_error(s2), rel=1e-12)
    assert mrmtl_error(math.inf, s2, tau, K) == pytest.approx(fedavg_error(s2, tau, K), rel=1e-12)
    assert mrmtl_error(1e12, s2, tau, K) == pytest.approx(fedavg_error(s2, tau, K), rel=1e-9)
    assert mrmtl_error(lam_star, s2, tau, K) == pytest.approx(optimal_error(s2, tau, K), rel=1e-12)
    # the original form of (1.15): (1 - 1/K)(s2 + lam^2 tau^2)/(lam + 1)^2 + s2/K
    lam = np.array([0.0, 0.01, 0.5, 3.0, 40.0])
    expected = (1 - 1 / K) * (s2 + lam**2 * tau**2) / (lam + 1) ** 2 + s2 / K
    np.testing.assert_allclose(mrmtl_error(lam, s2, tau, K), expected, rtol=1e-12)


@pytest.mark.parametrize("tau, private", [(row[0], row[1]) for row in SPEC_TABLE])
def test_optimal_lambda_minimises_error_on_a_fine_grid(tau, private):
    s2 = spec_sigma_loc2(private)
    grid = np.logspace(-4, 4, 80001)  # ratio 1.00023 between neighbours
    errors = mrmtl_error(grid, s2, tau, K)
    best = grid[np.argmin(errors)]
    assert best == pytest.approx(optimal_lambda(s2, tau), rel=5e-4)
    assert errors.min() >= optimal_error(s2, tau, K) * (1 - 1e-12)
    # quasi-convex: decreasing before lam*, increasing after
    i = np.argmin(errors)
    assert np.all(np.diff(errors[: i + 1]) <= 0) and np.all(np.diff(errors[i:]) >= 0)


def test_gaps_are_the_differences_of_the_table():
    # tau = 0.08 private: E_loc - E* = 6.105e-3 - 3.2735e-3; E_fed - E* = 6.3852e-3 - 3.2735e-3
    s2 = spec_sigma_loc2(True)
    assert local_gap(s2, 0.08, K) == pytest.approx(6.105e-3 - 3.2735e-3, rel=1e-3)
    assert fedavg_gap(s2, 0.08, K) == pytest.approx(6.3852e-3 - 3.2735e-3, rel=1e-3)
    # tau = 0.03 non-private: 8e-4 - 4.4235e-4 and 8.95e-4 - 4.4235e-4
    s2 = spec_sigma_loc2(False)
    assert local_gap(s2, 0.03, K) == pytest.approx(8e-4 - 4.4235e-4, rel=1e-3)
    assert fedavg_gap(s2, 0.03, K) == pytest.approx(8.95e-4 - 4.4235e-4, rel=1e-3)


def test_local_and_fedavg_tie_where_sigma_loc2_equals_tau2():
    # tau^2 = s2: E_loc = E_fed = s2 and E* = s2 (1 + K)/(2K), the largest gain over both endpoints
    s2 = 4e-3
    tau = math.sqrt(s2)
    assert fedavg_error(s2, tau, K) == pytest.approx(local_error(s2))
    assert optimal_error(s2, tau, K) == pytest.approx(s2 * 21 / 40)
    assert local_gap(s2, tau, K) == pytest.approx(fedavg_gap(s2, tau, K))
    taus = np.sqrt(s2) * np.geomspace(0.5, 2, 201)
    advantage = [min(local_gap(s2, t, K), fedavg_gap(s2, t, K)) for t in taus]
    assert taus[int(np.argmax(advantage))] == pytest.approx(tau, rel=1e-9)


def test_privacy_cost_is_the_error_difference_and_falls_by_K():
    lam = np.array([0.0, 0.1, 0.9539, 10.0, math.inf])
    private, public = spec_sigma_loc2(True), spec_sigma_loc2(False)
    cost = privacy_cost(lam, SPEC_Z, N, K)
    np.testing.assert_allclose(cost, mrmtl_error(lam, private, 0.08, K) - mrmtl_error(lam, public, 0.08, K), rtol=1e-10)
    # lam = 0: sigma_dp^2/n^2 = 212.197489/40000; lam = inf: that / K
    assert cost[0] == pytest.approx(5.30493722e-3, rel=1e-8)
    assert cost[-1] == pytest.approx(5.30493722e-3 / 20, rel=1e-8)
    assert np.all(np.diff(cost) < 0)


def test_local_weight_and_estimates_by_hand():
    assert local_weight(0.0) == 1.0 and local_weight(1.0) == 0.5 and local_weight(math.inf) == 0.0
    w_hat = np.array([1.0, 3.0, 8.0])  # mean 4
    np.testing.assert_allclose(mrmtl_estimates(w_hat, 0.0), [1, 3, 8])
    np.testing.assert_allclose(mrmtl_estimates(w_hat, 1.0), [2.5, 3.5, 6.0])
    np.testing.assert_allclose(mrmtl_estimates(w_hat, math.inf), [4, 4, 4])
    # alpha form of Lemma 1.6.1: alpha w_hat_k + (1 - alpha) mean of the others, alpha = (K + lam)/((1 + lam) K)
    alpha = (3 + 1.0) / (2 * 3)
    others = np.array([(3 + 8) / 2, (1 + 8) / 2, (1 + 3) / 2])
    np.testing.assert_allclose(mrmtl_estimates(w_hat, 1.0), alpha * w_hat + (1 - alpha) * others)


# --------------------------------------------------------------------------- heterogeneous silos (D.30)


def test_per_silo_lambdas_by_hand():
    # K = 3, tau^2 = 1, s = [1, 2, 3]: lam_k = s_k / (1 + (mean of others - s_k)/3)
    lam = per_silo_optimal_lambdas([1.0, 2.0, 3.0], 1.0)
    np.testing.assert_allclose(lam, [1 / 1.5, 2.0, 6.0])


def test_per_silo_lambda_is_inf_when_the_silo_should_follow_fedavg():
    # K = 3, tau^2 = 0.01, s = [0.01, 0.01, 1]: silo 3's denominator 0.01 + (0.01 - 1)/3 < 0
    s, tau = np.array([0.01, 0.01, 1.0]), 0.1
    lam = per_silo_optimal_lambdas(s, tau)
    assert lam[2] == math.inf
    assert lam[0] == pytest.approx(0.01 / (0.01 + (0.505 - 0.01) / 3))
    grid = np.concatenate([[0.0], np.logspace(-3, 6, 400)])
    silo3 = np.array([per_silo_mrmtl_errors(g, s, tau)[2] for g in grid])
    assert per_silo_mrmtl_errors(math.inf, s, tau)[2] <= silo3.min()


def test_per_silo_lambdas_reduce_to_the_homogeneous_optimum():
    s2 = spec_sigma_loc2(True)
    np.testing.assert_allclose(per_silo_optimal_lambdas(np.full(K, s2), 0.08), optimal_lambda(s2, 0.08), rtol=1e-12)
    lam = np.array([0.0, 0.3, 5.0, math.inf])
    for value in lam:
        np.testing.assert_allclose(per_silo_mrmtl_errors(value, np.full(K, s2), 0.08), mrmtl_error(value, s2, 0.08, K))


def test_per_silo_lambdas_minimise_each_silo_error():
    rng = np.random.default_rng(3)
    s = rng.uniform(1e-3, 2e-2, size=8)
    lam = per_silo_optimal_lambdas(s, 0.06)
    assert np.all(np.isfinite(lam))
    for k in range(len(s)):
        res = optimize.minimize_scalar(
            lambda log_lam: per_silo_mrmtl_errors(math.exp(log_lam), s, 0.06)[k], bounds=(-12, 12), method="bounded",
            options={"xatol": 1e-10},
        )
        assert math.exp(res.x) == pytest.approx(lam[k], rel=1e-4)


# --------------------------------------------------------------------------- Monte-Carlo


def test_monte_carlo_matches_the_closed_form(sigma_dp):
    """500 trials x 20 silos (as [C1]); unclipped so that the closed form is exact; within 5%."""
    for i, tau in enumerate((0.03, 0.08, 0.2)):
        for j, noise in enumerate((0.0, sigma_dp)):
            s2 = local_variance(SIGMA, N, noise)
            lam = np.array([0.0, optimal_lambda(s2, tau), math.inf])
            mc = simulate_mean_estimation(K, N, SIGMA, tau, noise, math.inf, lam, 500, np.random.default_rng([i, j]))
            np.testing.assert_allclose(mc.mean, mrmtl_error(lam, s2, tau, K), rtol=0.05)
            assert np.all(np.abs(mc.mean - mrmtl_error(lam, s2, tau, K)) < 4 * mc.standard_error)


def test_monte_carlo_with_clipping_as_in_the_paper(sigma_dp):
    # clip 1 (spec: per-point x min(1, c/|x|)); at tau = 0.08 clipping is rare enough to stay within 5%
    s2 = local_variance(SIGMA, N, sigma_dp)
    lam = np.array([0.0, optimal_lambda(s2, 0.08), math.inf])
    mc = simulate_mean_estimation(K, N, SIGMA, 0.08, sigma_dp, 1.0, lam, 500, np.random.default_rng(7))
    np.testing.assert_allclose(mc.mean, mrmtl_error(lam, s2, 0.08, K), rtol=0.05)


def test_clipping_bounds_every_point():
    # sigma = 50 >> clip 1: points become +-1 (signs ~ fair coins), w_hat ~ N(0, 1/50), w ~ N(0, 0.01):
    # error ~ 0.02 + 0.01, against sigma^2/n = 50 without clipping
    mc = simulate_mean_estimation(2, 50, 50.0, 0.1, 0.0, 1.0, [0.0], 2000, np.random.default_rng(0), theta=0.0)
    assert mc.mean[0] == pytest.approx(0.03, rel=0.1)
    unclipped = simulate_mean_estimation(2, 50, 50.0, 0.1, 0.0, math.inf, [0.0], 2000, np.random.default_rng(0))
    assert unclipped.mean[0] == pytest.approx(50.01, rel=0.1)


def test_monte_carlo_per_silo_lambdas_and_budgets():
    """Silo-specific noise and per-silo lam (shape (L, K)) match (D.23)-(D.26) on average."""
    sigma_dps = np.geomspace(2.0, 40.0, 10)
    s = SIGMA**2 / N + sigma_dps**2 / N**2
    lam_k = per_silo_optimal_lambdas(s, 0.08)
    lambdas = np.stack([lam_k, np.full(10, 0.5)])
    mc = simulate_mean_estimation(10, N, SIGMA, 0.08, sigma_dps, math.inf, lambdas, 2000, np.random.default_rng(11))
    closed = np.stack([per_silo_mrmtl_errors(lam, s, 0.08) for lam in lambdas])
    np.testing.assert_allclose(mc.per_silo.mean(axis=1), closed.mean(axis=1), rtol=0.05)
    np.testing.assert_allclose(mc.per_silo, closed, rtol=0.2)
    assert mc.per_silo.shape == (2, 10) and mc.per_trial.shape == (2, 2000)


def test_monte_carlo_shared_random_numbers():
    """Equal seeds give equal draws: shared lam as 1-D or as (L, K) rows agree exactly."""
    a = simulate_mean_estimation(4, 10, 0.4, 0.1, 3.0, 1.0, [0.0, 2.0], 50, np.random.default_rng(5))
    b = simulate_mean_estimation(4, 10, 0.4, 0.1, 3.0, 1.0, [[0.0] * 4, [2.0] * 4], 50, np.random.default_rng(5))
    np.testing.assert_array_equal(a.mean, b.mean)
    np.testing.assert_array_equal(a.per_trial.mean(axis=1), a.mean)


# --------------------------------------------------------------------------- tuning cost (App. E)


def tnb_pmf(h: np.ndarray, eta: float, gamma: float) -> np.ndarray:
    """App. E.1 pmf, term by term (independent of the library's closed-form mean)."""
    if eta == 0:
        return (1 - gamma) ** h / (h * math.log(1 / gamma))
    ratios = (np.arange(h.max()) + eta) / (np.arange(h.max()) + 1)
    return (1 - gamma) ** h / (gamma**-eta - 1) * np.cumprod(ratios)[h - 1]


@pytest.mark.parametrize("eta, gamma", [(-0.5, 0.02), (0.0, 0.05), (0.5, 0.1), (2.0, 0.3), (5.0, 0.4)])
def test_tnb_mean_matches_the_pmf(eta, gamma):
    h = np.arange(1, 20001)
    pmf = tnb_pmf(h, eta, gamma)
    assert pmf.sum() == pytest.approx(1.0, abs=1e-6)
    assert tnb_expected_runs(eta, gamma) == pytest.approx(float((h * pmf).sum()), rel=1e-5)


def test_tnb_gamma_by_hand():
    # eta = 1 is geometric: E[h] = 1/gamma; eta = 0.5: E[h] = 0.5 (1 + sqrt(gamma))/gamma -> gamma = 1/16 for 10
    assert tnb_gamma(10, 1.0) == pytest.approx(0.1, rel=1e-9)
    assert tnb_gamma(10, 0.5) == pytest.approx(0.0625, rel=1e-9)
    for eta in (-0.5, 0.0, 2.0, 5.0):
        assert tnb_expected_runs(eta, tnb_gamma(10, eta)) == pytest.approx(10, rel=1e-9)


def test_tnb_tuning_rdp_by_hand():
    # orders [2, 4], rdp [0.1, 0.3], eta = 1, gamma = 0.1 (E[h] = 10):
    # min over a2 of 2(1 - 1/a2) rdp(a2) + 2 ln(10)/a2 = min(2.402585, 1.601293) = 1.601293
    out = tnb_tuning_rdp([2.0, 4.0], [0.1, 0.3], 1.0, 0.1)
    np.testing.assert_allclose(out, [0.1 + 1.6012925 + math.log(10), 0.3 + 1.6012925 + math.log(10) / 3], rtol=1e-7)


def test_tuned_noise_spends_exactly_the_budget(sigma_dp):
    """Recompute the tuned epsilon with [C1]'s nested loop over (a1, a2) at the returned z."""
    orders = np.array(MRMTL_ORDERS)
    for eta in (-0.5, 0.0, 1.0):
        z = tuned_gaussian_sigma_dp(0.25, 1e-5, 1.0, 10, eta, orders=orders)
        gamma = tnb_gamma(10, eta)
        rdp = orders / (2 * z**2)
        tuned = [
            min(r1 + (1 + eta) * (1 - 1 / a2) * r2 + (1 + eta) * math.log(1 / gamma) / a2 + math.log(10) / (a1 - 1)
                for a2, r2 in zip(orders, rdp))
            for a1, r1 in zip(orders, rdp)
        ]
        eps, _ = rdp_privacy_accountant.compute_epsilon(orders, tuned, 1e-5)
        assert eps == pytest.approx(0.25, rel=1e-6)
        assert z > 1.5 * sigma_dp  # tuning over ~10 runs needs much more noise


def test_tuned_noise_grows_with_eta():
    sigmas = [tuned_gaussian_sigma_dp(0.25, 1e-5, 1.0, 10, eta) for eta in (-0.5, 0.0, 0.5, 1.0, 2.0, 5.0)]
    assert np.all(np.diff(sigmas) > 0)


def test_tuning_budget_too_small_is_refused():
    # log E[h]/(a - 1) + log(1/gamma) terms alone exceed a tiny epsilon
    with pytest.raises(ValueError, match="even without noise"):
        tuned_gaussian_sigma_dp(0.01, 1e-5, 1.0, 10, 5.0)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "call",
    [
        lambda: local_variance(0.4, 0, 1.0),
        lambda: local_variance(0.4, 2.5, 1.0),
        lambda: local_variance(-1.0, 10),
        lambda: local_variance(0.4, 10, -1.0),
        lambda: optimal_lambda(1e-3, 0.0),
        lambda: optimal_lambda(1e-3, -0.1),
        lambda: optimal_lambda(0.0, 0.1),
        lambda: mrmtl_error(1.0, 1e-3, 0.1, 1),
        lambda: mrmtl_error(-0.5, 1e-3, 0.1, 20),
        lambda: mrmtl_error(np.nan, 1e-3, 0.1, 20),
        lambda: mrmtl_error(1.0, 1e-3, math.inf, 20),
        lambda: optimal_error(1e-3, 0.1, True),
        lambda: fedavg_error(1e-3, 0.0, 20),
        lambda: privacy_cost(1.0, 1.0, 0, 20),
        lambda: per_silo_optimal_lambdas([1e-3], 0.1),
        lambda: per_silo_optimal_lambdas([1e-3, -1.0], 0.1),
        lambda: per_silo_mrmtl_errors([1.0, 2.0], [1e-3, 1e-3, 1e-3], 0.1),
        lambda: gaussian_sigma_dp(0.25, 1e-5, 0.0),
        lambda: gaussian_sigma_dp(-1.0, 1e-5, 1.0),
        lambda: simulate_mean_estimation(1, 10, 0.4, 0.1, 0.0, 1.0, [0.0], 10, np.random.default_rng(0)),
        lambda: simulate_mean_estimation(3, 10, 0.4, 0.1, [1.0, 2.0], 1.0, [0.0], 10, np.random.default_rng(0)),
        lambda: simulate_mean_estimation(3, 10, 0.4, 0.1, 0.0, 1.0, [[0.0, 1.0]], 10, np.random.default_rng(0)),
        lambda: simulate_mean_estimation(3, 10, 0.4, 0.1, 0.0, 1.0, [0.0], 1, np.random.default_rng(0)),
        lambda: tnb_expected_runs(-1.0, 0.5),
        lambda: tnb_expected_runs(1.0, 1.0),
        lambda: tnb_gamma(1.0, 0.5),
        lambda: tnb_tuning_rdp([1.0, 2.0], [0.1, 0.2], 1.0, 0.1),
        lambda: tnb_tuning_rdp([2.0], [0.1, 0.2], 1.0, 0.1),
    ],
)
def test_bad_input_is_refused(call):
    with pytest.raises(ValueError):
        call()


# --------------------------------------------------------------------------- docs


def test_docs_example_runs_and_prints_what_the_page_shows(capsys):
    page = (Path(__file__).resolve().parents[2] / "docs" / "theory.md").read_text()
    code = re.search(r"```python\n(.*?)```", page, re.S).group(1)
    shown = re.search(r"```text\n(.*?)```", page, re.S).group(1)
    exec(compile(code, "docs/theory.md", "exec"), {})
    assert capsys.readouterr().out == shown
