"""Private kNN labelling of cloud samples by the client (spec 000 part 2, B.5; Zhu et al.,
Private-kNN, CVPR 2020), used by Table 5.1 and use case 3 (B.6 Case 3, Table 5.4).

For every cloud query ``x`` (its phi features) the client:

1. Poisson-subsamples its own rows at rate ``gamma``, afresh for each query (B.4: 80%);
2. takes the ``K`` subsampled rows nearest to ``x`` (Euclidean in phi), ``N_K(x)``;
3. counts their labels, ``v_c = |{(x', y') in N_K(x) : y' = c}|`` (:func:`knn_votes`);
4. draws the noisy label ``argmax_c (v_c + N(0, sigma_v^2))`` and, with separate noise, the
   confidence ``max_c (v_c + N(0, sigma_c^2))`` (B.5: sigma_v 25, sigma_c 75).

It returns the labels of the ``per_class`` most confident queries of each noisy class
(B.5: the top 60 per class, 600 labels; class-balanced screening instead of a threshold), or
of every query with ``per_class=None``.

Privacy (:func:`labelling_release`), under add/remove-one neighbours of the client's rows:

* For a fixed subsample, adding a row that lands in ``N_K(x)`` pushes out the K-th neighbour:
  one vote goes up by 1 and another down by 1, so the vote vector's L2 sensitivity is
  ``sqrt(2)`` (1 when the subsample has fewer than K rows).  The shift depends on the
  subsample, but its norm never exceeds ``sqrt(2)``; by joint convexity of the hockey-stick
  divergence the Poisson-subsampled Gaussian with that sensitivity dominates.
* Both noisy vectors of a query read the same subsample and the same votes.  Two Gaussian
  views of one vector carry exactly the information of one view with the combined precision,
  ``sigma_eff = (sigma_v^-2 + sigma_c^-2)^-1/2`` (the precision-weighted mean is sufficient;
  the difference of the views does not depend on the votes).  So one query is one
  ``PoissonSampled(gamma, Gaussian(sigma_eff / sqrt(2)))`` event: 23.7 / sqrt(2) = 16.8 at
  B.5's noise.
* Every query counts, not only the released labels: the screening ranks all noisy
  confidences.  Q queries compose Q events (``count = Q``).
* The accounting is data-independent.  Private-kNN's paper analyses the released answers
  data-dependently (its epsilon differs per client domain in Tables 5.1 and 5.4), which needs
  a privately released smooth-sensitivity bound to be a DP guarantee; ours is an upper bound
  that holds for every data set, and is larger.

Decisions on the spec's open points: ``K`` is a parameter (not stated in the dissertation;
100 by default, four times sigma_v, so full agreement of the neighbours stands 4 sigma above
no votes); ties of the noisy maximum go to the lower class (they have probability 0); a
class with fewer queries than ``per_class`` releases all of its queries.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch

from ..privacy import checks
from ..privacy.events import Release, gaussian_steps_release
from ..privacy.randomness import RandomSource, check_source, standard_normal, uniform
from .coverage import as_feature_matrix

__all__ = ["KNNLabels", "KNNSettings", "combined_sigma", "knn_votes", "labelling_release", "private_knn_labels"]

#: L2 sensitivity of a query's vote vector under add/remove-one (one vote in, one out).
VOTE_SENSITIVITY = math.sqrt(2.0)


@dataclasses.dataclass(frozen=True)
class KNNSettings:
    """B.5's knobs: ``k`` neighbours, vote noise ``sigma_votes``, confidence noise
    ``sigma_confidence``, per-query Poisson rate ``sample_rate`` and ``per_class`` labels
    released per noisy class (None: every query's label)."""

    k: int = 100
    sigma_votes: float = 25.0
    sigma_confidence: float = 75.0
    sample_rate: float = 0.8
    per_class: int | None = 60

    def __post_init__(self) -> None:
        object.__setattr__(self, "k", checks.integer("k", self.k, minimum=1))
        object.__setattr__(self, "sigma_votes", checks.positive("sigma_votes", self.sigma_votes))
        object.__setattr__(self, "sigma_confidence", checks.positive("sigma_confidence", self.sigma_confidence))
        object.__setattr__(self, "sample_rate", checks.fraction("sample_rate", self.sample_rate, one=True))
        if self.per_class is not None:
            object.__setattr__(self, "per_class", checks.integer("per_class", self.per_class, minimum=1))


def combined_sigma(sigma_votes: float, sigma_confidence: float) -> float:
    """The noise of one Gaussian view equivalent to both: ``(sigma_v^-2 + sigma_c^-2)^-1/2``."""
    sv, sc = checks.positive("sigma_votes", sigma_votes), checks.positive("sigma_confidence", sigma_confidence)
    return 1.0 / math.sqrt(sv**-2 + sc**-2)


def labelling_release(num_queries: int, settings: KNNSettings) -> Release:
    """The :class:`Release` of labelling ``num_queries`` queries (see the module docstring)."""
    if not isinstance(settings, KNNSettings):
        raise ValueError(f"settings must be KNNSettings; got {type(settings).__name__}.")
    num_queries = checks.integer("num_queries", num_queries, minimum=1)
    z = combined_sigma(settings.sigma_votes, settings.sigma_confidence) / VOTE_SENSITIVITY
    return dataclasses.replace(gaussian_steps_release(z, settings.sample_rate, num_queries), label="ecos/private-knn")


def _labels(client_labels: Any, rows: int, num_classes: int) -> np.ndarray:
    labels = np.asarray(client_labels)
    if labels.shape != (rows,) or labels.dtype.kind not in "iu":
        raise ValueError(f"client_labels must be {rows} integers (one per client row); got {labels.dtype} {labels.shape}.")
    if rows and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"client_labels must lie in [0, {num_classes}); got {labels.min()} .. {labels.max()}.")
    return labels.astype(np.int64)


def knn_votes(
    client_features: Any, client_labels: Any, query_features: Any, k: int, num_classes: int,
    keep: np.ndarray | None = None,
) -> np.ndarray:
    """Step 3: int64 ``Q x C`` votes of each query's ``k`` nearest client rows (Euclidean; ties
    to the lower row index), among the rows ``keep[q]`` marks for query ``q`` (``Q x n`` bool;
    None: every row).  A query with fewer than ``k`` kept rows votes with all of them."""
    client = as_feature_matrix("client_features", client_features).astype(np.float64)
    queries = as_feature_matrix("query_features", query_features).astype(np.float64)
    if client.shape[1] != queries.shape[1]:
        raise ValueError(f"client features have {client.shape[1]} columns but queries have {queries.shape[1]}.")
    num_classes = checks.integer("num_classes", num_classes, minimum=2)
    labels = _labels(client_labels, client.shape[0], num_classes)
    k = checks.integer("k", k, minimum=1)
    n, Q = client.shape[0], queries.shape[0]
    if keep is not None and (keep.shape != (Q, n) or keep.dtype != np.bool_):
        raise ValueError(f"keep must be a {Q} x {n} boolean mask; got {keep.dtype} {keep.shape}.")
    votes = np.zeros((Q, num_classes), dtype=np.int64)
    chunk = max(1, 2**22 // max(n, 1))  # bound the Q x n distance block to ~32 MB
    sq_client = (client**2).sum(axis=1)
    for lo in range(0, Q, chunk):
        hi = min(Q, lo + chunk)
        dist = sq_client[None, :] - 2.0 * queries[lo:hi] @ client.T  # + |q|^2, the same for a row
        if keep is not None:
            dist = np.where(keep[lo:hi], dist, np.inf)
        order = np.argsort(dist, axis=1, kind="stable")[:, :k]
        valid = np.take_along_axis(np.isfinite(dist), order, axis=1)
        rows = np.repeat(np.arange(hi - lo), order.shape[1])
        np.add.at(votes[lo:hi], (rows[valid.ravel()], labels[order.ravel()][valid.ravel()]), 1)
    return votes


@dataclasses.dataclass(frozen=True, eq=False)
class KNNLabels:
    """The client's answer: ``indices`` of the labelled queries (sorted) and their ``labels``
    (what crosses the wire), and the number of queries answered (what the release counts)."""

    indices: np.ndarray
    labels: np.ndarray
    num_queries: int

    @property
    def nbytes(self) -> int:
        """Upload size: a 4-byte index and a 1-byte label per released label."""
        return 5 * int(self.indices.size)


def normals(shape: tuple[int, ...], source: RandomSource) -> np.ndarray:
    """float64 standard normals of ``shape`` from ``source``, as a numpy array."""
    return standard_normal(shape, source, torch.float64).numpy()


def private_knn_labels(
    client_features: Any, client_labels: Any, query_features: Any, num_classes: int, settings: KNNSettings,
    generator: RandomSource,
) -> KNNLabels:
    """Steps 1-4 and the class-balanced screening for every query (module docstring).  The
    caller records :func:`labelling_release` for the queries in its ledger."""
    if not isinstance(settings, KNNSettings):
        raise ValueError(f"settings must be KNNSettings; got {type(settings).__name__}.")
    check_source(generator)
    client = as_feature_matrix("client_features", client_features)
    queries = as_feature_matrix("query_features", query_features)
    keep = uniform((queries.shape[0], client.shape[0]), generator, torch.float64).numpy() < settings.sample_rate
    votes = knn_votes(client, client_labels, queries, settings.k, num_classes, keep).astype(np.float64)
    noisy_label = (votes + settings.sigma_votes * normals(votes.shape, generator)).argmax(axis=1)
    confidence = (votes + settings.sigma_confidence * normals(votes.shape, generator)).max(axis=1)
    if settings.per_class is None:
        chosen = np.arange(queries.shape[0])
    else:
        chosen = np.concatenate([
            np.flatnonzero(noisy_label == c)[np.argsort(-confidence[noisy_label == c], kind="stable")[: settings.per_class]]
            for c in range(num_classes)
        ])
        chosen = np.sort(chosen)
    return KNNLabels(chosen, noisy_label[chosen].astype(np.int64), int(queries.shape[0]))
