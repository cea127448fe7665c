"""ECOS client side: cloud centroids, coverage counts, the noisy upload and its privacy cost."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from fedveil.ecos import (
    CoverageSummary,
    assign_clusters,
    cloud_centroids,
    coverage_counts,
    coverage_release,
    private_coverage,
)
from fedveil.privacy.composition import DEFAULT_ORDERS
from fedveil.privacy.ledger import PrivacyLedger

CENTROIDS = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]], dtype=np.float32)
# Nearest centroids by hand: 0, 0, 1, 1, 1, 2.
POINTS = np.array([[1, 1], [-1, 0], [9, 1], [11, -1], [8, 0], [0, 12]], dtype=np.float32)


def test_coverage_counts_by_hand():
    np.testing.assert_array_equal(assign_clusters(POINTS, CENTROIDS), [0, 0, 1, 1, 1, 2])
    counts = coverage_counts(POINTS, CENTROIDS)
    assert counts.dtype == np.int64
    np.testing.assert_array_equal(counts, [2, 3, 1])
    np.testing.assert_array_equal(coverage_counts(POINTS[:2], CENTROIDS), [2, 0, 0])


def test_cloud_centroids_find_two_blobs_deterministically():
    rng = np.random.default_rng(0)
    cloud = np.concatenate([rng.normal(0.0, 1.0, (100, 4)), rng.normal(20.0, 1.0, (100, 4))])
    c = cloud_centroids(cloud, R=2, seed=3)
    assert c.shape == (2, 4) and c.dtype == np.float32
    means = sorted(float(m) for m in c.mean(axis=1))
    assert means[0] == pytest.approx(0.0, abs=0.3) and means[1] == pytest.approx(20.0, abs=0.3)
    np.testing.assert_array_equal(c, cloud_centroids(cloud, R=2, seed=3))
    with pytest.raises(ValueError, match="R = 201 centroids need at least R rows"):
        cloud_centroids(cloud, R=201, seed=0)


def test_private_coverage_without_noise_or_subsampling_is_the_counts():
    summary = private_coverage(POINTS, CENTROIDS, sigma=1e-6, sample_rate=1.0, generator=np.random.default_rng(0))
    assert summary.scores.dtype == np.float32
    np.testing.assert_allclose(summary.scores, [2.0, 3.0, 1.0], atol=1e-4)
    assert (summary.sigma, summary.sample_rate, summary.R) == (1e-6, 1.0, 3)


def test_private_coverage_subsamples_and_adds_gaussian_noise():
    one = np.zeros((1, 2), dtype=np.float32)
    rows = np.zeros((10_000, 2), dtype=np.float32)
    kept = private_coverage(rows, one, sigma=1e-6, sample_rate=0.5, generator=np.random.default_rng(1)).scores[0]
    assert abs(kept - 5000) < 4 * 50  # Binomial(10000, 0.5): sd 50
    rng = np.random.default_rng(2)
    noisy = [private_coverage(rows[:10], one, sigma=3.0, sample_rate=1.0, generator=rng).scores[0] for _ in range(400)]
    assert np.mean(noisy) == pytest.approx(10.0, abs=4 * 3.0 / 20)  # sd of the mean 3 / sqrt(400)
    assert np.std(noisy) == pytest.approx(3.0, rel=0.15)


def test_summary_bytes_hold_4R_score_bytes_and_a_fixed_header():
    summary = private_coverage(POINTS, CENTROIDS, sigma=25.0, sample_rate=0.8, generator=np.random.default_rng(3))
    data = summary.to_bytes()
    assert len(data) == summary.nbytes == 24 + 4 * 3
    assert data[24:] == np.asarray(summary.scores, dtype="<f4").tobytes()
    back = CoverageSummary.from_bytes(data)
    np.testing.assert_array_equal(back.scores, summary.scores)
    assert (back.sigma, back.sample_rate, back.R) == (25.0, 0.8, 3)
    big = CoverageSummary(np.zeros(100), 25.0, 0.8)
    assert len(big.to_bytes()) == big.nbytes == 424  # R = 100 (the paper's choice): 400 score bytes
    with pytest.raises(ValueError, match="needs 36 bytes; got 35"):
        CoverageSummary.from_bytes(data[:-1])
    with pytest.raises(ValueError, match="not an ECOS coverage summary"):
        CoverageSummary.from_bytes(b"PNG" + data[3:])


def test_summary_holds_only_the_noisy_scores_and_noise_parameters():
    rows = np.random.default_rng(4).normal(size=(50, 2)).astype(np.float32)
    summary = private_coverage(rows, CENTROIDS, sigma=2.0, sample_rate=0.9, generator=np.random.default_rng(5))
    assert [f.name for f in dataclasses.fields(summary)] == ["scores", "sigma", "sample_rate"]
    assert set(vars(summary)) == {"scores", "sigma", "sample_rate"}
    assert summary.scores.shape == (3,)
    assert not summary.scores.flags.writeable
    with pytest.raises(ValueError, match="sigma"):
        CoverageSummary(np.zeros(3), 0.0, 0.5)


def test_release_is_the_poisson_subsampled_gaussian_with_sensitivity():
    event = coverage_release(25.0, 0.8).event
    assert event == dp_event.PoissonSampledDpEvent(0.8, dp_event.GaussianDpEvent(25.0))
    assert coverage_release(25.0, 0.8, sensitivity=2.0).event.event.noise_multiplier == 12.5
    assert coverage_release(10.0, 1.0).event == dp_event.GaussianDpEvent(10.0)
    assert coverage_release(25.0, 0.8).label == "ecos/coverage"


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
@pytest.mark.parametrize("sensitivity", [1.0, 2.0])
def test_ledger_epsilon_equals_dp_accounting(accountant, sensitivity):
    sigma, gamma, delta = 25.0, 0.8, 1e-5
    ledger = PrivacyLedger(accountant)
    ledger.record("client", coverage_release(sigma, gamma, sensitivity))
    if accountant == "rdp":
        reference = rdp_privacy_accountant.RdpAccountant(orders=list(DEFAULT_ORDERS))
    else:
        reference = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    reference.compose(dp_event.PoissonSampledDpEvent(gamma, dp_event.GaussianDpEvent(sigma / sensitivity)))
    assert ledger.epsilon("client", delta) == pytest.approx(reference.get_epsilon(delta), rel=1e-9)


def test_paper_convention_lands_near_the_autodp_value():
    # Spec B.4: autodp 0.2.3.1 gives 0.215 for sigma 25, sensitivity 2, Poisson gamma 0.8, delta 1e-5.
    pld = PrivacyLedger("pld")
    rdp = PrivacyLedger("rdp")
    for ledger in (pld, rdp):
        ledger.record(0, coverage_release(25.0, 0.8, sensitivity=2.0))
    assert pld.epsilon(0, 1e-5) == pytest.approx(0.215, rel=0.02)  # PLD is tight: 0.2152
    assert rdp.epsilon(0, 1e-5) == pytest.approx(0.215, rel=0.15)  # RDP is looser: 0.239
    ours = PrivacyLedger("pld")
    ours.record(0, coverage_release(25.0, 0.8))  # add/remove-one, sensitivity 1: about half
    assert ours.epsilon(0, 1e-5) == pytest.approx(0.0995, rel=0.02)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: coverage_counts(POINTS, CENTROIDS[:, :1]), "features have 2 columns but centroids have 1"),
        (lambda: coverage_counts(np.zeros((0, 2)), CENTROIDS), "non-empty N x d"),
        (lambda: coverage_counts(np.array([[np.nan, 0.0]]), CENTROIDS), "NaN"),
        (lambda: private_coverage(POINTS, CENTROIDS, 0.0, 0.5, np.random.default_rng()), "sigma"),
        (lambda: private_coverage(POINTS, CENTROIDS, 1.0, 0.0, np.random.default_rng()), "sample_rate"),
        (lambda: private_coverage(POINTS, CENTROIDS, 1.0, 0.5, 7), "numpy Generator"),
        (lambda: coverage_release(1.0, 0.5, sensitivity=0.0), "sensitivity"),
    ],
)
def test_coverage_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()
