"""The Skellam mechanism's accounting, checked against values computed here independently.

* The RDP bound (Agarwal, Kairouz & Liu 2021, Thm 3.5) is never below the exact Renyi
  divergence of two shifted one-dimensional Skellam distributions, summed here from
  scipy's Skellam pmf, and approaches it as the variance grows.
* A ledger's epsilon for T Skellam releases equals the theorem's RDP composed and converted
  to (epsilon, delta) here by the Canonne-Kamath-Steinke / Asoodeh et al. formula, written
  out in this file; and it approaches dp-accounting's epsilon of the Gaussian of the same
  variance from above.
* The secure Poisson sampler draws Poisson counts (chi-square against scipy's pmf), and a
  sum of silos' shares has the summed variance.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant
from scipy.special import logsumexp
from scipy.stats import chisquare, poisson, skellam

from fedveil.privacy.calibration import calibrate_skellam, skellam_releases
from fedveil.privacy.composition import DEFAULT_ORDERS
from fedveil.privacy.events import event_from_dict, event_to_dict
from fedveil.privacy.ledger import PrivacyLedger
from fedveil.privacy.ledger_check import dominates
from fedveil.privacy.randomness import SECURE, ZeroNoiseStream, skellam as skellam_draws
from fedveil.privacy.skellam import skellam_event, skellam_rdp

P_FLOOR = 1e-6  # chi-square p-values below this fail: a correct sampler fails once in a million runs


def exact_shift_rdp(variance: float, shift: int, alpha: int) -> float:
    """D_alpha(Sk + shift || Sk) in one dimension, summed over the support."""
    half, reach = variance / 2, int(12 * math.sqrt(variance)) + shift + 20
    k = np.arange(-reach, reach + 1)
    log_q = skellam.logpmf(k, half, half)
    log_p = skellam.logpmf(k - shift, half, half)
    return float(logsumexp(alpha * log_p + (1 - alpha) * log_q) / (alpha - 1))


@pytest.mark.parametrize("variance", [10.0, 50.0, 400.0])
@pytest.mark.parametrize("shift", [1, 3])
def test_the_rdp_bound_holds_over_the_exact_one_dimensional_divergence(variance, shift):
    for alpha in (2, 3, 5, 16):
        exact = exact_shift_rdp(variance, shift, alpha)
        bound = float(skellam_rdp(skellam_event(variance, shift, shift), [alpha])[0])
        assert exact <= bound
        gaussian = alpha * shift**2 / (2 * variance)
        assert bound - gaussian <= 0.5 * gaussian  # the correction term is small ...
    big = 1e4  # ... and vanishes as the variance grows: the bound meets the exact divergence
    assert float(skellam_rdp(skellam_event(big, shift, shift), [4])[0]) == pytest.approx(
        exact_shift_rdp(big, shift, 4), rel=2e-3
    )


def test_fractional_orders_take_the_next_integer_orders_bound():
    event = skellam_event(100.0, 2.0, 2.0)
    assert skellam_rdp(event, [2.5])[0] == skellam_rdp(event, [3.0])[0]
    assert skellam_rdp(event, [3.0])[0] == pytest.approx(3 * 4 / 200 + min((5 * 4 + 12) / 40000, 6 / 200))


def rdp_to_epsilon_by_hand(rdp: np.ndarray, orders, delta: float) -> float:
    """eps = min_a rdp(a) + log((a-1)/a) - (log(delta) + log(a)) / (a - 1)."""
    a = np.asarray(orders, dtype=float)
    return float(np.min(rdp + np.log((a - 1) / a) - (math.log(delta) + np.log(a)) / (a - 1)))


def theorem_rdp(variance: float, d2: float, d1: float, orders) -> np.ndarray:
    a = np.ceil(np.asarray(orders, dtype=float) - 1e-12)
    return a * d2**2 / (2 * variance) + np.minimum(((2 * a - 1) * d2**2 + 6 * d1) / (4 * variance**2), 3 * d1 / (2 * variance))


def test_a_ledger_of_skellam_releases_matches_the_theorem_composed_here():
    d2, d1, rounds, delta = 1000.0, 30000.0, 40, 1e-5
    variances = [(z * d2) ** 2 for z in np.linspace(4.0, 6.0, rounds)]  # epsilon about 4
    ledger = PrivacyLedger("rdp")
    for variance in variances:
        ledger.record("population", skellam_releases([math.sqrt(variance) / d2], d2, d1)[0])
    by_hand = rdp_to_epsilon_by_hand(sum(theorem_rdp(v, d2, d1, DEFAULT_ORDERS) for v in variances), DEFAULT_ORDERS, delta)
    assert ledger.epsilon("population", delta) == pytest.approx(by_hand, rel=1e-9)
    # dp-accounting's Gaussian of the same variances: the Skellam bound lies just above it (at a
    # fractional order it takes the next integer order's bound, which costs most at large epsilon)
    gaussian = rdp_privacy_accountant.RdpAccountant(list(DEFAULT_ORDERS))
    for variance in variances:
        gaussian.compose(dp_event.GaussianDpEvent(math.sqrt(variance) / d2))
    eps_gaussian = gaussian.get_epsilon(delta)
    assert eps_gaussian <= ledger.epsilon("population", delta) <= eps_gaussian * 1.01


def test_calibration_spends_the_budget_and_no_more():
    d2, d1 = 5e5, 1e7
    zs = calibrate_skellam(np.ones(30), 3.0, 1e-5, d2, d1)
    assert np.all(zs == zs[0])
    eps = lambda z: rdp_to_epsilon_by_hand(30 * theorem_rdp((z * d2) ** 2, d2, d1, DEFAULT_ORDERS), DEFAULT_ORDERS, 1e-5)
    assert eps(zs[0]) <= 3.0 < eps(zs[0] * (1 - 2e-4))


def test_skellam_releases_survive_the_ledgers_json_and_only_rdp_accounts_them():
    release = skellam_releases([2.0], 10.0, 40.0)[0]
    assert event_from_dict(event_to_dict(release.event)) == release.event
    ledger = PrivacyLedger("rdp")
    ledger.record(0, release)
    restored = PrivacyLedger.from_state_dict(ledger.state_dict())
    assert restored.epsilon(0, 1e-5) == ledger.epsilon(0, 1e-5)
    assert restored.relation(0).name == "REPLACE_SPECIAL"
    with pytest.raises(ValueError, match="PLD accountant cannot account SkellamDpEvent"):
        PrivacyLedger("pld").record(0, release)
    with pytest.raises(ValueError, match="replace_one|REPLACE_ONE"):
        ledger.record(0, release, relation="replace_one")


def test_more_noise_or_less_sensitivity_dominates_a_planned_release():
    planned = skellam_event(100.0, 2.0, 4.0)
    assert dominates(planned, skellam_event(150.0, 2.0, 4.0))
    assert not dominates(planned, skellam_event(90.0, 2.0, 4.0))
    assert not dominates(planned, skellam_event(100.0, 2.5, 4.0))


@pytest.mark.parametrize("bad", [dict(variance=0.0), dict(l2_sensitivity=-1.0), dict(l1_sensitivity=1.0)])
def test_a_malformed_skellam_release_is_refused(bad):
    args = {"variance": 10.0, "l2_sensitivity": 2.0, "l1_sensitivity": 3.0, **bad}
    with pytest.raises(ValueError, match="Skellam release"):
        skellam_event(**args)


@pytest.mark.parametrize("lam", [4.0, 30.0])
def test_the_secure_poisson_sampler_draws_poisson_counts(lam):
    draws = SECURE.poisson(lam, 100_000)
    ks = np.arange(draws.max() + 1)
    expected = poisson.pmf(ks, lam) * draws.size
    observed = np.bincount(draws, minlength=ks.size).astype(float)
    keep = expected > 5
    observed, expected = observed[keep], expected[keep]
    assert chisquare(observed, expected * observed.sum() / expected.sum()).pvalue > P_FLOOR


def test_shares_sum_to_the_skellam_of_the_summed_variance():
    rng = np.random.default_rng(3)
    shares = [4.0, 9.0, 7.0]
    total = sum(skellam_draws(200_000, s, rng) for s in shares)
    ks = np.arange(-40, 41)
    expected = skellam.pmf(ks, 10.0, 10.0) * total.size
    observed = np.array([(total == k).sum() for k in ks], dtype=float)
    keep = expected > 5
    assert chisquare(observed[keep], expected[keep] * observed[keep].sum() / expected[keep].sum()).pvalue > P_FLOOR
    secure = SECURE.poisson(5e10, 50_000) - SECURE.poisson(5e10, 50_000)
    assert secure.var() == pytest.approx(1e11, rel=0.03)  # std of a variance estimate from 5e4 draws: 0.6%
    assert not skellam_draws(10, 100.0, ZeroNoiseStream(rng)).any()
