"""ECOS's noisy coverage upload against the closed forms of spec 000 part 2, B.4.

The release is ``v~_r = v_r + N(0, sigma^2)`` on the counts of a Poisson(gamma) subsample of
the client's rows. Each angle below is an independent guard of that noise:

* the residuals ``v~ - v`` of many uploads (gamma = 1) are N(0, sigma^2): mean, std, KS;
* with subsampling the moments are those of Binomial(v_r, gamma) + N(0, sigma^2):
  ``E = gamma v_r``, ``Var = gamma (1 - gamma) v_r + sigma^2``;
* on one seeded stream the noise is ``sigma`` times the same standard normals, so
  ``k v~(sigma) - v~(k sigma)`` is ``(k - 1)`` times an integer count vector;
* the accountant's epsilon is the exact hockey-stick divergence of the Gaussian mechanism
  (Balle & Wang 2018) and of its Poisson-subsampled version, written out here with Phi;
  sensitivity 1 under add/remove-one (one row moves one count by 1), and 2 for the paper's
  convention, whose numbers the spec quotes from autodp;
* the pipeline's ``select`` adds noise of std ``settings.sigma`` and its ledger holds the
  closed-form epsilon of that same sigma.

A mutant of the noise (``sigma -> sigma / 2``, ``sigma ** 2``, ``sqrt(sigma)``, no noise),
of the sensitivity (``sigma / s -> sigma * s``) or of the sampling fails at least two of them;
each statistical test asserts that the mutant's value lies far outside its tolerance.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats
from scipy.optimize import brentq

from fedveil.ecos import coverage_counts, coverage_release, private_coverage
from fedveil.ecos.pipeline import CloudPool, ECOSSettings, plan, select
from fedveil.privacy.composition import DEFAULT_ORDERS
from fedveil.privacy.ledger import PrivacyLedger

CENTROIDS = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]], dtype=np.float32)
# Nearest centroids by hand: 0, 0, 1, 1, 1, 2 -> counts [2, 3, 1].
POINTS = np.array([[1, 1], [-1, 0], [9, 1], [11, -1], [8, 0], [0, 12]], dtype=np.float32)
COUNTS = np.array([2, 3, 1])
DELTA = 1e-5


# ------------------------------------------------------------------ closed forms


def gaussian_delta(eps: float, sigma: float, gamma: float, sensitivity: float = 1.0) -> float:
    """Exact delta(eps) of ``x + N(0, sigma^2)`` for a count moved by ``sensitivity`` by one
    row that is kept with probability ``gamma`` (add/remove-one; gamma = 1: no subsampling).

    In units of the sensitivity (s = sigma / sensitivity) the neighbours give P = (1 - gamma)
    N(0, s^2) + gamma N(1, s^2) (with the row) and Q = N(0, s^2). Their ratio P/Q = (1 - gamma)
    + gamma exp((2x - 1) / (2 s^2)) grows with x, so each hockey stick is a tail:
    remove: int (P - e^eps Q)_+ over x > x1, P/Q(x1) = e^eps;
    add:    int (Q - e^eps P)_+ over x < x2, P/Q(x2) = e^-eps (empty if e^-eps <= 1 - gamma).
    """
    s = sigma / sensitivity
    x1 = s * s * math.log((math.exp(eps) - (1 - gamma)) / gamma) + 0.5
    remove = gamma * stats.norm.sf((x1 - 1) / s) + (1 - gamma) * stats.norm.sf(x1 / s) - math.exp(eps) * stats.norm.sf(x1 / s)
    add = 0.0
    if math.exp(-eps) > 1 - gamma:
        x2 = s * s * math.log((math.exp(-eps) - (1 - gamma)) / gamma) + 0.5
        add = stats.norm.cdf(x2 / s) - math.exp(eps) * ((1 - gamma) * stats.norm.cdf(x2 / s) + gamma * stats.norm.cdf((x2 - 1) / s))
    return max(remove, add)


def exact_epsilon(sigma: float, gamma: float, sensitivity: float = 1.0, delta: float = DELTA) -> float:
    return brentq(lambda e: gaussian_delta(e, sigma, gamma, sensitivity) - delta, 1e-9, 50.0, xtol=1e-13)


def gaussian_rdp_epsilon(sigma: float, sensitivity: float, delta: float, orders) -> float:
    """RDP of the Gaussian mechanism, alpha Delta^2 / (2 sigma^2), converted to (eps, delta) by
    eps = min_alpha rdp + log(1 - 1/alpha) - log(delta alpha) / (alpha - 1) (spec 002 eq. 1.4)."""
    return min(a * sensitivity**2 / (2 * sigma**2) + math.log1p(-1 / a) - math.log(delta * a) / (a - 1)
               for a in orders if a > 1.01)


def pld_epsilon(release) -> float:
    ledger = PrivacyLedger("pld")
    ledger.record("client", release)
    return ledger.epsilon("client", DELTA)


# ------------------------------------------------------------------ the noise itself


def test_residuals_of_many_uploads_are_normal_with_std_sigma():
    """gamma = 1: v~ - v is N(0, sigma^2). 4000 uploads x 3 counts: the std's relative s.e. is
    sqrt(1 / (2 N)) = 0.65%, the test allows 4%; sigma / 2, 2 sigma, sigma^2 and sqrt(sigma)
    all lie 30% or more away."""
    sigma, uploads = 3.0, 4000
    rng = np.random.default_rng(11)
    residuals = np.concatenate([
        private_coverage(POINTS, CENTROIDS, sigma, 1.0, rng).scores.astype(np.float64) - COUNTS for _ in range(uploads)
    ])
    n = residuals.size
    assert abs(residuals.mean()) < 4 * sigma / math.sqrt(n)
    std = residuals.std(ddof=1)
    assert std == pytest.approx(sigma, rel=0.04)
    for mutant in (sigma / 2, 2 * sigma, sigma**2, math.sqrt(sigma)):
        assert abs(mutant / sigma - 1) > 0.3
    assert stats.kstest(residuals / sigma, "norm").pvalue > 1e-3
    # the three counts get independent noise
    per_count = residuals.reshape(uploads, 3)
    assert np.abs(np.corrcoef(per_count.T) - np.eye(3)).max() < 4 / math.sqrt(uploads)


def test_subsampled_scores_have_binomial_plus_gaussian_moments():
    """gamma = 0.8, sigma = 5 on 500 and 100 rows: E = gamma v = [400, 80] and
    Var = gamma (1 - gamma) v + sigma^2 = [105, 41]. Both variances are checked to 12% (their
    relative s.e. at 3000 uploads is about 2.6%); sigma / 2 gives [86.25, 22.25], no noise
    [80, 16] and 2 sigma [180, 116]: each at least 18% off in the first or 45% in the second."""
    sigma, gamma, uploads = 5.0, 0.8, 3000
    centroids = np.array([[0.0, 0.0], [10.0, 0.0]], dtype=np.float32)
    rows = np.concatenate([np.zeros((500, 2)), np.tile([[10.0, 0.0]], (100, 1))]).astype(np.float32)
    v = np.array([500, 100])
    rng = np.random.default_rng(12)
    scores = np.stack([private_coverage(rows, centroids, sigma, gamma, rng).scores.astype(np.float64)
                       for _ in range(uploads)])
    mean_want = gamma * v
    var_want = gamma * (1 - gamma) * v + sigma**2
    assert np.all(np.abs(scores.mean(0) - mean_want) < 4 * np.sqrt(var_want / uploads))
    np.testing.assert_allclose(scores.var(0, ddof=1), var_want, rtol=0.12)
    for s_mutant in (sigma / 2, 0.0, 2 * sigma):
        var_mutant = gamma * (1 - gamma) * v + s_mutant**2
        assert np.max(np.abs(var_mutant / var_want - 1)) > 0.12 * 1.5


@pytest.mark.parametrize("gamma", [1.0, 0.7])
def test_noise_is_sigma_times_the_same_standard_normals_on_one_stream(gamma):
    """Same seed, same subsample: v~(sigma) = v' + sigma Z and v~(k sigma) = v' + k sigma Z, so
    k v~(sigma) - v~(k sigma) = (k - 1) v' with v' the (integer) subsampled counts. Noise of
    sigma^2 or sqrt(sigma), or an offset, would leave a non-integer remainder."""
    rows = np.random.default_rng(3).normal(0.0, 6.0, (300, 2)).astype(np.float32)
    sigma = 1.7
    base = private_coverage(rows, CENTROIDS, sigma, gamma, np.random.default_rng(99)).scores.astype(np.float64)
    for k in (2.0, 3.0, 10.0):
        scaled = private_coverage(rows, CENTROIDS, k * sigma, gamma, np.random.default_rng(99)).scores.astype(np.float64)
        kept = (k * base - scaled) / (k - 1)
        np.testing.assert_allclose(kept, np.round(kept), atol=5e-3)
        assert np.all(np.round(kept) <= coverage_counts(rows, CENTROIDS)) and np.all(np.round(kept) >= 0)
        noise = (scaled - base) / ((k - 1) * sigma)  # the standard normals themselves
        np.testing.assert_allclose(base - np.round(kept), sigma * noise, atol=5e-3)
    if gamma == 1.0:
        np.testing.assert_allclose(np.round(kept), coverage_counts(rows, CENTROIDS))
    else:  # Binomial(300, 0.7): 210 +- 8 rows kept, not all 300
        assert abs(np.round(kept).sum() - gamma * len(rows)) < 4 * math.sqrt(len(rows) * gamma * (1 - gamma))


# ------------------------------------------------------------------ its privacy cost


@pytest.mark.parametrize("sigma, sensitivity, autodp", [(25.0, 1.0, 0.125), (10.0, 1.0, 0.341),
                                                        (25.0, 2.0, 0.267), (10.0, 2.0, 0.726)])
def test_unsampled_release_epsilon_is_the_analytic_gaussian(sigma, sensitivity, autodp):
    """gamma = 1: PLD's epsilon is the exact Gaussian-mechanism epsilon (Balle & Wang 2018,
    Thm 8: delta = Phi(D/(2s) - eps s/D) - e^eps Phi(-D/(2s) - eps s/D)), the spec's autodp
    numbers (B.4, "without subsampling") to 3 digits, and RDP's is the Gaussian RDP bound."""
    want = exact_epsilon(sigma, 1.0, sensitivity)
    d = sensitivity
    balle_wang = (stats.norm.cdf(d / (2 * sigma) - want * sigma / d)
                  - math.exp(want) * stats.norm.cdf(-d / (2 * sigma) - want * sigma / d))
    assert balle_wang == pytest.approx(DELTA, rel=1e-9)
    assert want == pytest.approx(autodp, abs=6e-4)
    release = coverage_release(sigma, 1.0, sensitivity)
    got = pld_epsilon(release)
    assert want <= got <= want * (1 + 1e-5)  # PLD is pessimistic and fine at vdi 1e-4
    rdp = PrivacyLedger("rdp")
    rdp.record("client", release)
    assert rdp.epsilon("client", DELTA) == pytest.approx(gaussian_rdp_epsilon(sigma, d, DELTA, DEFAULT_ORDERS), rel=1e-9)
    # sigma / sensitivity -> sigma * sensitivity (or dropping it) changes epsilon far beyond 1e-5
    if sensitivity != 1.0:
        assert exact_epsilon(sigma * sensitivity, 1.0) < 0.3 * want
        assert exact_epsilon(sigma, 1.0) < 0.55 * want


@pytest.mark.parametrize("sigma, gamma, sensitivity, autodp", [(25.0, 0.8, 2.0, 0.215), (10.0, 0.8, 2.0, 0.607),
                                                               (25.0, 0.8, 1.0, None), (5.0, 0.5, 1.0, None)])
def test_subsampled_release_epsilon_is_the_exact_poisson_gaussian(sigma, gamma, sensitivity, autodp):
    """Poisson gamma: PLD's epsilon of the upload equals the exact epsilon of the subsampled
    Gaussian (both hockey sticks written out above); with the paper's sensitivity 2 it is the
    spec's autodp calibration (0.215 at sigma 25, 0.607 at sigma 10, gamma 0.8)."""
    want = exact_epsilon(sigma, gamma, sensitivity)
    if autodp is not None:
        assert want == pytest.approx(autodp, abs=6e-4)
    got = pld_epsilon(coverage_release(sigma, gamma, sensitivity))
    assert want <= got <= want * (1 + 1e-5)
    assert abs(exact_epsilon(sigma / 2, gamma, sensitivity) / want - 1) > 0.5  # a sigma mutant is far off
    assert abs(exact_epsilon(sigma, 1.0, sensitivity) / want - 1) > 0.1  # so is ignoring the subsampling


def test_plan_of_the_default_settings_is_the_closed_form():
    """The pipeline's plan for the defaults (sigma 25, gamma 0.8, PLD at 1e-5, add/remove-one)."""
    settings = ECOSSettings()
    assert plan(settings).epsilon == pytest.approx(exact_epsilon(settings.sigma, settings.sample_rate), rel=1e-5)


# ------------------------------------------------------------------ end to end


from test_ecos_pipeline import stripes  # noqa: E402  (the pipeline tests' striped images)


def test_select_uploads_noise_of_std_sigma_and_records_its_closed_form_epsilon():
    """``select("ecos")`` with gamma = 1 over 60 seeds: the upload minus the client's true
    counts (phi of its rows against the pool's centroids) has std sigma (600 residuals,
    relative s.e. 2.9%, tolerance 12%; sigma / 2 or 2 sigma are 50% off), and the ledger holds
    the exact Gaussian epsilon of that sigma for each upload (one upload: eps(sigma, 1))."""
    client = stripes(120, vertical=True, seed=0)
    cloud = torch.cat([stripes(80, vertical=True, seed=1), stripes(80, vertical=False, seed=2)])
    sigma = 4.0
    settings = ECOSSettings(extractor_options={"cells": 2}, R=10, sigma=sigma, sample_rate=1.0, accountant="pld")
    pool = CloudPool(cloud, settings, seed=0)
    true_counts = coverage_counts(settings.features(client), pool.centroids)
    assert true_counts.sum() == len(client)
    residuals = []
    for seed in range(60):
        ledger = PrivacyLedger("pld")
        chosen = select("ecos", client, pool, 20, settings, ledger, "client", seed=seed)
        residuals.append(chosen.summary.scores.astype(np.float64) - true_counts)
        if seed < 2:
            assert chosen.summary.sigma == sigma
            want = exact_epsilon(sigma, 1.0)
            assert want <= ledger.epsilon("client", DELTA) <= want * (1 + 1e-5)
            assert chosen.epsilon == ledger.epsilon("client", DELTA)
    residuals = np.concatenate(residuals)
    assert abs(residuals.mean()) < 4 * sigma / math.sqrt(residuals.size)
    assert residuals.std(ddof=1) == pytest.approx(sigma, rel=0.12)
