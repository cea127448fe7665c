"""ECOS cloud side: cluster budgets, K-Center, the selection and its baselines."""
from __future__ import annotations

import numpy as np
import pytest

from fedveil.ecos import (
    assign_clusters,
    cloud_centroids,
    cluster_budgets,
    ecos_select,
    k_center_greedy,
    k_center_select,
    private_coverage,
    proximity_only_select,
    random_select,
)


def test_cluster_budgets_by_hand_with_the_cluster_size_cap():
    counts = np.array([40, 30, 20, 10])
    scores = [6.0, -2.0, 3.0, 1.0]  # -2 clipped to 0: score shares 0.6, 0, 0.3, 0.1
    # B = 15: by score 9, 0, 4.5, 1.5 -> floor 9, 0, 4, 1; every cluster holds more -> 9, 0, 4, 1 (14 of 15)
    budgets = cluster_budgets(counts, scores, budget=15, scale_s=1.0)
    assert budgets.dtype == np.int64
    np.testing.assert_array_equal(budgets, [9, 0, 4, 1])
    np.testing.assert_array_equal(cluster_budgets(counts, scores, 15, 1.0, cap="cluster_size"), [9, 0, 4, 1])
    # s = 2: psi = 36, 0, 9, 1 (sum 46) -> 11.74, 0, 2.93, 0.33 -> 11, 0, 2, 0
    np.testing.assert_array_equal(cluster_budgets(counts, scores, 15, 2.0), [11, 0, 2, 0])
    # The cap binds where a cluster holds fewer rows than its score asks: |C_0| = 3 < 9 -> 3, 0, 4, 1 (8 of 15)
    np.testing.assert_array_equal(cluster_budgets([3, 30, 20, 10], scores, 15, 1.0), [3, 0, 4, 1])
    # A cluster empty in the pool gets nothing, however high its score.
    np.testing.assert_array_equal(cluster_budgets([0, 10], [5.0, 5.0], 10, 1.0), [0, 5])


def test_cluster_budgets_by_hand_with_the_printed_pool_share_cap():
    counts = np.array([40, 30, 20, 10])  # pool shares 0.4, 0.3, 0.2, 0.1
    scores = [6.0, -2.0, 3.0, 1.0]
    # B = 15: pool 6, 4.5, 3, 1.5 and scores 9, 0, 4.5, 1.5 -> floor(min) = 6, 0, 3, 1 (10 of 15)
    np.testing.assert_array_equal(cluster_budgets(counts, scores, 15, 1.0, cap="pool_share"), [6, 0, 3, 1])
    # s = 2: scores 11.74, 0, 2.93, 0.33 -> min with pool = 6, 0, 2, 0
    np.testing.assert_array_equal(cluster_budgets(counts, scores, 15, 2.0, cap="pool_share"), [6, 0, 2, 0])
    # counts 3, 30, 20, 10 (sum 63): pool 15 * (3, 30, 20, 10) / 63 = 0.71, 7.14, 4.76, 2.38 -> 0, 0, 4, 1
    np.testing.assert_array_equal(cluster_budgets([3, 30, 20, 10], scores, 15, 1.0, cap="pool_share"), [0, 0, 4, 1])
    np.testing.assert_array_equal(cluster_budgets([0, 10], [5.0, 5.0], 10, 1.0, cap="pool_share"), [0, 5])
    # Only the printed cap scales with the pool share: one covered cluster of 10% of the pool,
    # B = 50 -> 5 samples (pool share) against 10 (its size) and 50 asked.
    np.testing.assert_array_equal(cluster_budgets([10, 90], [7.0, 0.0], 50, 1.0, cap="pool_share"), [5, 0])
    np.testing.assert_array_equal(cluster_budgets([10, 90], [7.0, 0.0], 50, 1.0), [10, 0])


def test_cluster_budgets_with_no_positive_score_are_zero():
    np.testing.assert_array_equal(cluster_budgets([5, 5, 5], [-1.0, 0.0, -3.0], 6, 1.0), [0, 0, 0])


@pytest.mark.parametrize(
    "args, match",
    [
        (([5, 5], [1.0, 1.0], 11, 1.0), "budget B = 11 exceeds the 10 samples"),
        (([5, 5], [1.0, 1.0], 4, 0.0), "scale_s"),
        (([5, 5], [1.0], 4, 1.0), "2 finite numbers"),
        (([5.0, 5.0], [1.0, 1.0], 4, 1.0), "non-negative integers"),
        (([0, 0], [1.0, 1.0], 0, 1.0), "positive sum"),
        (([5, 5], [1.0, 1.0], 4, 1.0, "pool"), "cap must be one of"),
    ],
)
def test_cluster_budget_errors(args, match):
    with pytest.raises(ValueError, match=match):
        cluster_budgets(*args)


def test_k_center_greedy_on_a_line_by_hand():
    x = np.array([0.0, 1.0, 3.0, 7.0, 10.0, 4.0])[:, None]
    # From 0: farthest 10 (index 4); min distances to {0, 10}: 1, 3, 3, 4 -> 4 (index 5);
    # to {0, 10, 4}: 1, 1, 3 -> 7 (index 3); to {0, 10, 4, 7}: 1, 1 -> tie, lower index 1; then 3.
    np.testing.assert_array_equal(k_center_greedy(x, 6, 0), [0, 4, 5, 3, 1, 2])
    np.testing.assert_array_equal(k_center_greedy(x, 3, 4), [4, 0, 5])  # from 10: 0, then 4
    assert k_center_greedy(x, 0, 0).size == 0


def test_k_center_greedy_never_repeats_duplicate_rows():
    picked = k_center_greedy(np.ones((4, 3)), 4, 2)
    assert sorted(picked) == [0, 1, 2, 3] and picked[0] == 2
    with pytest.raises(ValueError, match="k = 5 exceeds the 4 rows"):
        k_center_greedy(np.ones((4, 3)), 5, 0)
    with pytest.raises(ValueError, match="first_index 4 is out of range"):
        k_center_greedy(np.ones((4, 3)), 2, 4)


def _two_blobs(seed: int = 0):
    """Cloud: 300 rows of blob A around 0 and 300 of blob B around 8 (5-d); client: 200 fresh rows of A."""
    rng = np.random.default_rng(seed)
    cloud = np.concatenate([rng.normal(0.0, 1.0, (300, 5)), rng.normal(8.0, 1.0, (300, 5))]).astype(np.float32)
    client = rng.normal(0.0, 1.0, (200, 5)).astype(np.float32)
    return cloud, client, np.arange(600) < 300


def test_ecos_selects_the_clients_blob_and_random_does_not():
    cloud, client, in_a = _two_blobs()
    centroids = cloud_centroids(cloud, R=10, seed=0)
    summary = private_coverage(client, centroids, sigma=5.0, sample_rate=0.8, generator=np.random.default_rng(1))
    chosen = ecos_select(cloud, centroids, summary.scores, budget=100, scale_s=2.0, rng=np.random.default_rng(2))
    # Cluster-size cap: the score shares split B, less at most one per cluster by rounding down.
    assert 90 <= chosen.size <= 100 and np.unique(chosen).size == chosen.size
    assert in_a[chosen].mean() >= 0.95
    # The printed pool-share cap: b_r <= (pool share of r) * B, blob A is half of the pool -> about B / 2.
    literal = ecos_select(cloud, centroids, summary.scores, 100, 2.0, np.random.default_rng(2), cap="pool_share")
    assert 40 <= literal.size <= 60 and in_a[literal].mean() >= 0.95
    with pytest.raises(ValueError, match="cap must be one of"):
        ecos_select(cloud, centroids, summary.scores, 100, 2.0, np.random.default_rng(2), cap="size")
    baseline = random_select(600, 100, np.random.default_rng(3))
    assert 0.35 <= in_a[baseline].mean() <= 0.65  # Hypergeometric: sd about 0.046


@pytest.mark.parametrize("cap", ["cluster_size", "pool_share"])
@pytest.mark.parametrize("budget, scale_s, seed", [(7, 1.0, 0), (50, 1.0, 1), (120, 3.0, 2), (600, 0.5, 3)])
def test_ecos_select_respects_the_budgets(budget, scale_s, seed, cap):
    cloud, client, _ = _two_blobs(seed)
    centroids = cloud_centroids(cloud, R=8, seed=seed)
    scores = private_coverage(client, centroids, 3.0, 1.0, np.random.default_rng(seed)).scores
    chosen = ecos_select(cloud, centroids, scores, budget, scale_s, np.random.default_rng(seed), cap)
    assignment = assign_clusters(cloud, centroids)
    budgets = cluster_budgets(np.bincount(assignment, minlength=8), scores, budget, scale_s, cap)
    assert chosen.size == budgets.sum() <= budget
    assert np.unique(chosen).size == chosen.size
    np.testing.assert_array_equal(np.bincount(assignment[chosen], minlength=8), budgets)  # none where b_r = 0
    again = ecos_select(cloud, centroids, scores, budget, scale_s, np.random.default_rng(seed), cap)
    np.testing.assert_array_equal(chosen, again)


def test_ecos_select_is_k_center_inside_each_cluster():
    cloud, _, _ = _two_blobs()
    centroids = cloud_centroids(cloud, R=2, seed=0)
    chosen = ecos_select(cloud, centroids, [10.0, 0.0], 40, 1.0, np.random.default_rng(4))
    members = np.flatnonzero(assign_clusters(cloud, centroids) == 0)
    assert members.size == 300  # b_0 = min(300, floor(10 / 10 * 40)) = 40
    first = int(np.flatnonzero(members == chosen[0])[0])
    np.testing.assert_array_equal(chosen, members[k_center_greedy(cloud[members], 40, first)])
    literal = ecos_select(cloud, centroids, [10.0, 0.0], 40, 1.0, np.random.default_rng(4), "pool_share")
    assert literal[0] == chosen[0]  # b_0 = floor(min(300 / 600, 10 / 10) * 40) = 20, same first draw
    np.testing.assert_array_equal(literal, members[k_center_greedy(cloud[members], 20, first)])


def test_ecos_select_with_no_positive_score_selects_nothing():
    cloud, _, _ = _two_blobs()
    centroids = cloud_centroids(cloud, R=3, seed=0)
    assert ecos_select(cloud, centroids, [-1.0, -2.0, 0.0], 50, 1.0, np.random.default_rng(0)).size == 0


def test_baselines():
    chosen = random_select(10, 10, np.random.default_rng(0))
    assert sorted(chosen) == list(range(10))
    with pytest.raises(ValueError, match="budget B = 11 exceeds the 10 samples"):
        random_select(10, 11, np.random.default_rng(0))
    x = np.array([0.0, 1.0, 3.0, 7.0, 10.0, 4.0])[:, None]
    picked = k_center_select(x, 4, np.random.default_rng(5))
    np.testing.assert_array_equal(picked, k_center_greedy(x, 4, int(picked[0])))
    with pytest.raises(ValueError, match="numpy Generator"):
        k_center_select(x, 2, 0)


def test_proximity_only_takes_the_top_scored_clusters_first():
    centroids = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    cloud = np.array([[0, 1], [1, 0], [0, -1], [10, 1], [11, 0], [9, 0], [10, -1], [1, 10], [0, 11]], dtype=float)
    scores = [1.0, 5.0, 3.0]  # cluster order 1 (rows 3-6), 2 (rows 7-8), 0 (rows 0-2)
    chosen = proximity_only_select(cloud, centroids, scores, 5, np.random.default_rng(0))
    assert sorted(chosen[:4]) == [3, 4, 5, 6] and chosen[4] in (7, 8)
    assert sorted(proximity_only_select(cloud, centroids, scores, 9, np.random.default_rng(1))) == list(range(9))
    assert proximity_only_select(cloud, centroids, scores, 0, np.random.default_rng(2)).size == 0
