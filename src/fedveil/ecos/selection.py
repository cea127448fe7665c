"""ECOS cloud side: per-cluster budgets from the noisy coverage, diverse sampling, baselines.

Spec 000 part 2, B.3 Alg. 5.1 lines 8-16, B.9 (baselines) and B.10 Table 5.5 (ablation).
Everything here reads only the cloud's pool and the client's noisy upload, so it is
post-processing and costs no privacy.

Decisions on the spec's open points (PART E item 8):

* Negative noisy scores are clipped at 0 before ``psi_s(v) = v**s`` (which needs ``s > 0``).
* Line 9's cap (``cap``, :data:`CAPS`).  As printed, ``b_r = min{|C^q_r| / sum_j |C^q_j|,
  v'_r / sum_j v'_j} * B`` caps every cluster at its *pool share* of B, so the number
  selected is about B times the pool share of the covered clusters: far below B whenever the
  client's clusters are a small part of the pool, at *every* budget (171 of B = 400 in our
  first Digits run, while the baselines label B).  Fig. D.2 contradicts that reading: a larger
  s "cuts effective samples" only "for budgets > 2000", i.e. only once the budget a few
  clusters ask for exceeds what those clusters hold.  That is a cap at the cluster's *size*;
  a pool-share cap keeps ``B * sum_r min(pool share_r, score share_r)`` samples, the same
  fraction of B at every budget, so it would cut small budgets as much as large ones.  Our
  default, ``cap="cluster_size"``, therefore reads line 9 as
  ``b_r = min(|C^q_r|, floor(B * v'_r / sum_j v'_j))``: the client's score shares split B,
  and a cluster cannot give more samples than it has.  ``cap="pool_share"`` is the printed
  formula, ``b_r = floor(min(|C^q_r| / sum_j |C^q_j|, v'_r / sum_j v'_j) * B)``, kept for
  comparison.  Both round down, so ``sum_r b_r <= B`` and ``b_r <= |C^q_r|``; the selection
  can hold fewer than B (the effective counts of Figs. D.1/D.2).
* If every clipped score is 0 (no cluster covered) all budgets are 0 and nothing is selected.
* A cluster with ``b_r = 0`` contributes nothing: Alg. 5.1 line 11 as printed would put one
  random sample of *every* cluster into S, against ``sum_r b_r <= B`` and the rejection of
  uncovered (out-of-distribution) centroids.
* Diversity (``-H``, a covering radius, B.2) is K-Center greedy on the phi features, inside
  each cluster from one uniformly random first sample (line 11).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..privacy import checks

from .coverage import as_feature_matrix, assign_clusters

__all__ = [
    "CAPS",
    "cluster_budgets",
    "ecos_select",
    "k_center_greedy",
    "k_center_select",
    "proximity_only_select",
    "random_select",
]


#: Readings of Alg. 5.1 line 9's cap on a cluster's budget (see the module docstring).
CAPS = ("cluster_size", "pool_share")


def check_cap(cap: object) -> str:
    """``cap`` if it is one of :data:`CAPS`, else a one-line ValueError."""
    return checks.one_of("cap", cap, CAPS)


def _scores(noisy_scores: Any, R: int) -> np.ndarray:
    scores = np.asarray(noisy_scores, dtype=np.float64)
    if scores.shape != (R,) or not np.isfinite(scores).all():
        raise ValueError(f"noisy_scores must be {R} finite numbers (one per centroid); got shape {scores.shape}.")
    return scores


def _budget(budget: Any, pool_size: int) -> int:
    budget = checks.integer("budget", budget)
    if budget > pool_size:
        raise ValueError(f"budget B = {budget} exceeds the {pool_size} samples of the cloud pool.")
    return budget


def _check_rng(rng: Any) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng must be a numpy Generator; got {type(rng).__name__}.")
    return rng


def cluster_budgets(
    cloud_assign_counts: Any, noisy_scores: Any, budget: int, scale_s: float, cap: str = "cluster_size"
) -> np.ndarray:
    """Alg. 5.1 line 9, int64 budgets with ``v'_r = psi_s(max(v~_r, 0)) = max(v~_r, 0)**s``;
    all zeros if no score is positive.

    ``cap="cluster_size"`` (our reading): ``b_r = min(|C^q_r|, floor(B * v'_r / sum v'))``;
    ``cap="pool_share"`` (the printed formula):
    ``b_r = floor(min(|C^q_r| / sum|C^q|, v'_r / sum v') * B)``.
    """
    counts = np.asarray(cloud_assign_counts)
    if counts.ndim != 1 or counts.dtype.kind not in "iu" or (counts < 0).any() or counts.sum() == 0:
        raise ValueError("cloud_assign_counts must be a 1-d array of non-negative integers |C^q_r| with a positive sum.")
    counts = counts.astype(np.int64)
    scores = _scores(noisy_scores, counts.size)
    budget = _budget(budget, int(counts.sum()))
    s = checks.positive("scale_s", scale_s)
    cap = check_cap(cap)
    scaled = np.maximum(scores, 0.0) ** s
    if scaled.sum() == 0.0:
        return np.zeros(counts.size, dtype=np.int64)
    by_score = np.floor(scaled * budget / scaled.sum()).astype(np.int64)
    if cap == "cluster_size":
        return np.minimum(counts, by_score)
    by_pool = counts * budget // counts.sum()  # exact integer floor
    return np.minimum(by_pool, by_score)


def k_center_greedy(features: Any, k: int, first_index: int) -> np.ndarray:
    """Farthest-first traversal (Sener & Savarese 2018; Alg. 5.1 lines 11-13): ``k`` row
    indices, starting at ``first_index``, each next row the one farthest (Euclidean) from
    those picked so far (ties to the lowest index, up to rounding).  O(N k d): a running
    minimum squared distance per row is updated once per pick."""
    x = as_feature_matrix("features", features).astype(np.float64)
    n = x.shape[0]
    k = checks.integer("k", k)
    if k > n:
        raise ValueError(f"k = {k} exceeds the {n} rows to pick from.")
    first_index = checks.integer("first_index", first_index)
    if first_index >= n:
        raise ValueError(f"first_index {first_index} is out of range for {n} rows.")
    picked = np.empty(k, dtype=np.int64)
    if k == 0:
        return picked
    sq_norms = (x**2).sum(axis=1)

    def sq_distances(i: int) -> np.ndarray:
        return np.maximum(sq_norms - 2.0 * (x @ x[i]) + sq_norms[i], 0.0)

    picked[0] = first_index
    nearest = sq_distances(first_index)
    for step in range(1, k):
        nearest[picked[step - 1]] = -np.inf  # never re-picked, even among duplicate rows
        picked[step] = int(nearest.argmax())
        nearest = np.minimum(nearest, sq_distances(picked[step]))
    return picked


def ecos_select(
    cloud_features: Any,
    centroids: Any,
    noisy_scores: Any,
    budget: int,
    scale_s: float,
    rng: np.random.Generator,
    cap: str = "cluster_size",
) -> np.ndarray:
    """Alg. 5.1 lines 8-16: indices into the cloud pool, at most ``budget`` of them.

    Assign the pool to the centroids, set the budgets :func:`cluster_budgets` (with ``cap``),
    then in each
    cluster with ``b_r > 0`` take a uniformly random first sample and ``b_r - 1`` more by
    :func:`k_center_greedy` on the phi features of that cluster.
    """
    x = as_feature_matrix("cloud_features", cloud_features)
    rng = _check_rng(rng)
    cap = check_cap(cap)
    assignment = assign_clusters(x, centroids)
    R = np.asarray(centroids).shape[0]
    budgets = cluster_budgets(np.bincount(assignment, minlength=R), noisy_scores, budget, scale_s, cap)
    chosen = []
    for r in np.flatnonzero(budgets):
        members = np.flatnonzero(assignment == r)
        first = int(rng.integers(members.size))
        chosen.append(members[k_center_greedy(x[members], int(budgets[r]), first)])
    return np.concatenate(chosen) if chosen else np.empty(0, dtype=np.int64)


def random_select(n: int, budget: int, rng: np.random.Generator) -> np.ndarray:
    """Baseline (B.9): ``budget`` distinct indices of a pool of ``n``, uniformly at random."""
    n = checks.integer("n", n, minimum=1)
    return _check_rng(rng).choice(n, size=_budget(budget, n), replace=False).astype(np.int64)


def k_center_select(cloud_features: Any, budget: int, rng: np.random.Generator) -> np.ndarray:
    """Baseline (B.9): global K-Center coreset on the pool's features from a random first
    sample, without any client information (epsilon 0)."""
    x = as_feature_matrix("cloud_features", cloud_features)
    budget = _budget(budget, x.shape[0])
    return k_center_greedy(x, budget, int(_check_rng(rng).integers(x.shape[0])))


def proximity_only_select(
    cloud_features: Any, centroids: Any, noisy_scores: Any, budget: int, rng: np.random.Generator
) -> np.ndarray:
    """Ablation of Table 5.5 (proximity without diversity): walk the clusters from the
    highest noisy score down (ties to the lower index; ``psi_s`` is monotone, so ``s`` does
    not matter) and take uniformly random samples of each until ``budget`` are taken."""
    x = as_feature_matrix("cloud_features", cloud_features)
    rng = _check_rng(rng)
    assignment = assign_clusters(x, centroids)
    scores = _scores(noisy_scores, np.asarray(centroids).shape[0])
    left = _budget(budget, x.shape[0])
    chosen = []
    for r in np.argsort(-scores, kind="stable"):
        if left == 0:
            break
        members = np.flatnonzero(assignment == r)
        take = rng.permutation(members)[:left]
        chosen.append(take)
        left -= take.size
    return np.concatenate(chosen).astype(np.int64) if chosen else np.empty(0, dtype=np.int64)
