"""Private kNN labelling (spec B.5): votes, screening, the release's accounting, the ledger."""
from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting.pld import pld_privacy_accountant

from fedveil.ecos.pipeline import ECOSSettings, label, plan, plan_labelling, select
from fedveil.ecos.private_knn import (
    KNNSettings,
    combined_sigma,
    knn_votes,
    labelling_release,
    private_knn_labels,
)
from fedveil.privacy.ledger import PrivacyLedger

torch.set_num_threads(1)


def brute_votes(client, labels, queries, k, num_classes):
    """Votes by an explicit loop over queries: sort each query's distances, count the first k labels."""
    out = np.zeros((len(queries), num_classes), dtype=np.int64)
    for q, x in enumerate(queries):
        d = [float(np.sum((c - x) ** 2)) for c in client]
        for i in sorted(range(len(client)), key=lambda i: (d[i], i))[:k]:
            out[q, labels[i]] += 1
    return out


def test_votes_match_a_brute_force_count():
    rng = np.random.default_rng(0)
    client, queries = rng.normal(size=(40, 3)), rng.normal(size=(7, 3))
    labels = rng.integers(0, 4, 40)
    np.testing.assert_array_equal(knn_votes(client, labels, queries, 5, 4), brute_votes(client, labels, queries, 5, 4))


def test_votes_only_count_kept_rows_and_all_of_them_when_fewer_than_k():
    client = np.array([[0.0], [1.0], [2.0], [3.0]])
    labels = np.array([0, 1, 2, 2])
    keep = np.array([[True, False, True, True], [False, False, False, True]])
    votes = knn_votes(client, labels, np.array([[0.9], [0.0]]), 2, 3, keep)
    # query 0.9 among rows {0, 2, 3}: nearest are 0 (label 0) and 2 (label 2); query 0 keeps row 3 only
    np.testing.assert_array_equal(votes, [[1, 0, 1], [0, 0, 1]])


def test_adding_one_row_moves_the_votes_by_at_most_sqrt2_and_sqrt2_is_reached():
    rng = np.random.default_rng(1)
    client, labels = rng.normal(size=(30, 2)), rng.integers(0, 3, 30)
    queries = rng.normal(size=(200, 2))
    base = knn_votes(client, labels, queries, 6, 3)
    worst = 0.0
    for new_label in range(3):
        extra = rng.normal(size=(1, 2))
        moved = knn_votes(np.vstack([client, extra]), np.append(labels, new_label), queries, 6, 3)
        worst = max(worst, float(np.linalg.norm(moved - base, axis=1).max()))
    assert worst == pytest.approx(math.sqrt(2))


def test_two_gaussian_views_compose_to_one_with_the_combined_precision():
    """The release's key step, checked with dp_accounting's PLD: Gaussians of noise 25 and 75
    on the same vector compose to exactly one Gaussian of noise (25^-2 + 75^-2)^-1/2."""
    sigma = combined_sigma(25.0, 75.0)
    assert sigma == pytest.approx(1 / math.sqrt(1 / 625 + 1 / 5625))

    def eps(event):
        acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
        return acc.compose(event).get_epsilon(1e-5)

    two = dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(25 / math.sqrt(2)),
                                         dp_accounting.GaussianDpEvent(75 / math.sqrt(2))])
    assert eps(two) == pytest.approx(eps(dp_accounting.GaussianDpEvent(sigma / math.sqrt(2))), rel=2e-3)


def test_labelling_release_epsilon_matches_dp_accounting_composed_by_hand():
    settings = KNNSettings(sigma_votes=25.0, sigma_confidence=75.0, sample_rate=0.8)
    z = 1 / math.sqrt(25.0**-2 + 75.0**-2) / math.sqrt(2)  # sensitivity sqrt(2): one vote in, one out
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.8, dp_accounting.GaussianDpEvent(z)), 400)
    expected = pld_privacy_accountant.PLDAccountant().compose(event).get_epsilon(1e-5)
    got = PrivacyLedger("pld").epsilon_of([labelling_release(400, settings)], 1e-5)
    assert got == pytest.approx(expected, rel=1e-3)
    assert labelling_release(400, settings).count == 400


def test_without_noise_labels_are_the_majority_of_the_neighbours_and_screening_is_per_class():
    rng = np.random.default_rng(2)
    client = np.vstack([rng.normal(0, 0.1, (30, 2)), rng.normal(5, 0.1, (30, 2))])
    labels = np.repeat([0, 1], 30)
    queries = np.vstack([rng.normal(0, 0.1, (8, 2)), rng.normal(5, 0.1, (5, 2))])
    tiny = KNNSettings(k=5, sigma_votes=1e-9, sigma_confidence=1e-9, sample_rate=1.0, per_class=None)
    answer = private_knn_labels(client, labels, queries, 2, tiny, np.random.default_rng(0))
    np.testing.assert_array_equal(answer.indices, np.arange(13))
    np.testing.assert_array_equal(answer.labels, [0] * 8 + [1] * 5)
    capped = private_knn_labels(client, labels, queries, 2, KNNSettings(k=5, sigma_votes=1e-9, sigma_confidence=1e-9,
                                                                        sample_rate=1.0, per_class=3),
                                np.random.default_rng(0))
    assert np.bincount(capped.labels).tolist() == [3, 3] and capped.num_queries == 13
    assert capped.nbytes == 5 * 6


def test_screening_keeps_the_most_confident_queries_of_each_class():
    # five rows at each of -20, 0, 10, 20 with label mixes (0s, 1s): (3, 2), (4, 1), (0, 5), (2, 3)
    client = np.repeat([[-20.0], [0.0], [10.0], [20.0]], 5, axis=0)
    labels = np.array([0, 0, 0, 1, 1] + [0, 0, 0, 0, 1] + [1] * 5 + [0, 0, 1, 1, 1])
    queries = np.array([[-20.0], [0.0], [10.0], [20.0]])
    settings = KNNSettings(k=5, sigma_votes=1e-9, sigma_confidence=1e-9, sample_rate=1.0, per_class=1)
    answer = private_knn_labels(client, labels, queries, 2, settings, np.random.default_rng(0))
    # noisy classes 0, 0, 1, 1 with confidences 3, 4, 5, 3: the top one per class is query 1 (4) and query 2 (5)
    np.testing.assert_array_equal(answer.indices, [1, 2])
    np.testing.assert_array_equal(answer.labels, [0, 1])


def test_bad_inputs_are_one_line_errors():
    with pytest.raises(ValueError, match="k must"):
        KNNSettings(k=0)
    with pytest.raises(ValueError, match="sample_rate"):
        KNNSettings(sample_rate=1.5)
    with pytest.raises(ValueError, match="client_labels must lie in"):
        knn_votes(np.zeros((2, 1)), np.array([0, 3]), np.zeros((1, 1)), 1, 3)
    with pytest.raises(ValueError, match="columns"):
        knn_votes(np.zeros((2, 1)), np.array([0, 1]), np.zeros((1, 2)), 1, 2)


IMAGES = torch.rand(60, 1, 8, 8, generator=torch.Generator().manual_seed(0))
SETTINGS = ECOSSettings(extractor="pixels", R=5, accountant="rdp")
KNN = KNNSettings(k=5, per_class=2)


def test_label_records_its_planned_release_and_composes_with_the_coverage_upload():
    ledger = PrivacyLedger("rdp")
    labels = torch.arange(60) % 3
    done = label(IMAGES[:40], labels[:40], IMAGES[40:], 3, SETTINGS, KNN, ledger, "client", seed=0)
    assert done.epsilon == pytest.approx(plan_labelling(SETTINGS, KNN, 20).epsilon)
    assert ledger.releases("client") == [labelling_release(20, KNN)]
    assert len(done.answer.indices) <= 3 * 2 and done.answer.num_queries == 20
    chosen = select("ecos", IMAGES[:40], IMAGES[40:], 10, SETTINGS, ledger, "client", seed=0)
    both = ledger.epsilon_of([labelling_release(20, KNN), *plan(SETTINGS).releases], 1e-5)
    assert chosen.epsilon == pytest.approx(both) and both > done.epsilon


def test_label_is_refused_before_any_work_over_the_client_budget():
    ledger = PrivacyLedger("rdp")
    small = ECOSSettings(extractor="pixels", R=5, accountant="rdp", epsilon_budget=0.5)
    with pytest.raises(ValueError, match="private kNN labelling of 20 queries costs epsilon .* over the budget 0.5"):
        label(IMAGES[:40], torch.zeros(40, dtype=torch.long), IMAGES[40:], 3, small, KNN, ledger, "client", seed=0)
    assert ledger.releases("client") == []


def test_label_is_deterministic_for_a_seed():
    labels = torch.arange(40) % 3
    runs = [label(IMAGES[:40], labels, IMAGES[40:], 3, SETTINGS, KNN, PrivacyLedger("rdp"), 0, seed=4) for _ in range(2)]
    np.testing.assert_array_equal(runs[0].answer.indices, runs[1].answer.indices)
    np.testing.assert_array_equal(runs[0].answer.labels, runs[1].answer.labels)
