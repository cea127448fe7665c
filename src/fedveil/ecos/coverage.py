"""ECOS client side: centroid coverage of the private data and its noisy release.

Spec 000 part 2, B.3 Alg. 5.1 lines 1 and 3-6, and B.4.  The cloud clusters phi of its
open pool into R centroids (:func:`cloud_centroids`, line 1; public data, no privacy
cost); the client assigns each private row to its nearest centroid (line 4) and counts the
rows per centroid, ``v_r = |C^p_r|`` (line 5, :func:`coverage_counts`).  It uploads only
the R noisy counts (line 6, :func:`private_coverage`), a :class:`CoverageSummary` of
``4 R + 24`` bytes.

Decisions on the spec's open points (PART E items 7-8):

* Noise goes on the raw counts, ``v~_r = v_r + N(0, sigma^2)``; the score scale ``psi_s`` is
  applied afterwards by the cloud (post-processing, :mod:`.selection`), so the upload and
  its privacy cost do not depend on ``s``.
* The client Poisson-subsamples its rows at rate ``gamma`` (each kept independently with
  probability ``gamma``) before counting, for amplification.  The dissertation does not
  state ``gamma`` (its Lemma 6 samples with replacement); it is a parameter here.  The
  spec's autodp calibration reproduces the reported epsilon 0.22 with ``gamma = 0.8``.
* Sensitivity: under add/remove-one neighbours one private row changes exactly one count by
  1, so the L2 sensitivity of the count vector is 1 and the release is a
  ``PoissonSampledDpEvent(gamma, GaussianDpEvent(sigma))`` (:func:`coverage_release`).  The
  dissertation's proof uses 2 (replace-one would give sqrt(2): one count down, another up);
  ``sensitivity=2`` reports the paper's convention beside ours.
* The cost does not depend on R (each row touches one count, B.4).  The caller records the
  release once per upload in a :class:`fedveil.privacy.ledger.PrivacyLedger` under the
  client's subject.
"""
from __future__ import annotations

import dataclasses
import struct
from typing import Any

import numpy as np
import torch
from sklearn.cluster import KMeans

from ..privacy import checks
from ..privacy.events import Release, gaussian_steps_release
from ..privacy.randomness import RandomSource, check_source, standard_normal, uniform

__all__ = [
    "CoverageSummary",
    "as_feature_matrix",
    "assign_clusters",
    "cloud_centroids",
    "coverage_counts",
    "coverage_release",
    "private_coverage",
]


def as_feature_matrix(name: str, features: Any) -> np.ndarray:
    """``features`` (array or CPU tensor) as a non-empty, finite float32 ``N x d`` array."""
    array = np.asarray(features, dtype=np.float32)
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"{name} must be a non-empty N x d matrix; got shape {array.shape}.")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} contains NaN or infinite values.")
    return array


def cloud_centroids(features: Any, R: int, seed: int, n_init: int = 3) -> np.ndarray:
    """Alg. 5.1 line 1: ``KMeans_R`` of the cloud's phi features, float32 ``R x d`` centroids."""
    features = as_feature_matrix("features", features)
    R = checks.integer("R", R, minimum=1)
    if R > features.shape[0]:
        raise ValueError(f"R = {R} centroids need at least R rows; got {features.shape[0]}.")
    n_init = checks.integer("n_init", n_init, minimum=1)
    kmeans = KMeans(n_clusters=R, n_init=n_init, random_state=checks.integer("seed", seed))
    return kmeans.fit(features).cluster_centers_.astype(np.float32)


def assign_clusters(features: Any, centroids: Any) -> np.ndarray:
    """Alg. 5.1 lines 4 and 8: index of each row's nearest centroid (Euclidean, ties to the lower index)."""
    features = as_feature_matrix("features", features).astype(np.float64)
    centroids = as_feature_matrix("centroids", centroids).astype(np.float64)
    if features.shape[1] != centroids.shape[1]:
        raise ValueError(f"features have {features.shape[1]} columns but centroids have {centroids.shape[1]}.")
    sq = (centroids**2).sum(axis=1)[None, :] - 2.0 * features @ centroids.T
    return sq.argmin(axis=1)


def coverage_counts(client_features: Any, centroids: Any) -> np.ndarray:
    """Alg. 5.1 line 5: ``v_r = |C^p_r|``, the int64 number of client rows nearest to each centroid."""
    R = as_feature_matrix("centroids", centroids).shape[0]
    return np.bincount(assign_clusters(client_features, centroids), minlength=R).astype(np.int64)


@dataclasses.dataclass(frozen=True, eq=False)
class CoverageSummary:
    """The client's whole upload (Alg. 5.1 line 6): R noisy coverage scores and the noise
    parameters needed to account them; nothing else about the client's rows."""

    scores: np.ndarray
    sigma: float
    sample_rate: float

    _HEADER = struct.Struct("<4sIdd")  # magic, R, sigma, sample_rate
    _MAGIC = b"ECOS"

    def __post_init__(self) -> None:
        scores = np.array(self.scores, dtype=np.float32)
        if scores.ndim != 1 or scores.size == 0 or not np.isfinite(scores).all():
            raise ValueError(f"scores must be a non-empty 1-d array of finite numbers; got shape {scores.shape}.")
        scores.setflags(write=False)
        object.__setattr__(self, "scores", scores)
        object.__setattr__(self, "sigma", checks.positive("sigma", self.sigma))
        object.__setattr__(self, "sample_rate", checks.fraction("sample_rate", self.sample_rate, one=True))

    @property
    def R(self) -> int:
        """Number of centroids scored."""
        return int(self.scores.size)

    @property
    def nbytes(self) -> int:
        """Size of :meth:`to_bytes`: ``4 R`` score bytes plus a 24-byte header."""
        return self._HEADER.size + 4 * self.R

    def to_bytes(self) -> bytes:
        """Little-endian: a header (``b'ECOS'``, R as uint32, sigma and sample_rate as float64),
        then the scores as float32."""
        header = self._HEADER.pack(self._MAGIC, self.R, self.sigma, self.sample_rate)
        return header + self.scores.astype("<f4").tobytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> CoverageSummary:
        """Inverse of :meth:`to_bytes`."""
        size = cls._HEADER.size
        if len(data) < size or data[:4] != cls._MAGIC:
            raise ValueError("not an ECOS coverage summary (missing the b'ECOS' header).")
        _, R, sigma, sample_rate = cls._HEADER.unpack(data[:size])
        if len(data) != size + 4 * R:
            raise ValueError(f"coverage summary of R = {R} needs {size + 4 * R} bytes; got {len(data)}.")
        return cls(np.frombuffer(data[size:], dtype="<f4"), sigma, sample_rate)


def private_coverage(
    client_features: Any, centroids: Any, sigma: float, sample_rate: float, generator: RandomSource
) -> CoverageSummary:
    """Alg. 5.1 lines 4-6 with B.4's privacy: Poisson-subsample the rows at rate ``gamma``,
    count per centroid and add ``N(0, sigma^2)`` to each count. ``generator``: a numpy
    generator or the run's ``"ecos-coverage"`` stream (:mod:`fedveil.privacy.randomness`)."""
    client_features = as_feature_matrix("client_features", client_features)
    sigma = checks.positive("sigma", sigma)
    gamma = checks.fraction("sample_rate", sample_rate, one=True)
    check_source(generator)
    R = as_feature_matrix("centroids", centroids).shape[0]
    nearest = assign_clusters(client_features, centroids)
    counts = np.bincount(nearest[uniform(nearest.size, generator, torch.float64).numpy() < gamma], minlength=R)
    return CoverageSummary(counts + sigma * standard_normal((R,), generator, torch.float64).numpy(), sigma, gamma)


def coverage_release(sigma: float, sample_rate: float, sensitivity: float = 1.0) -> Release:
    """The :class:`Release` of one :func:`private_coverage` upload: a Poisson-subsampled
    Gaussian with noise multiplier ``sigma / sensitivity`` (1 for add/remove-one; the paper's 2)."""
    sigma = checks.positive("sigma", sigma)
    sensitivity = checks.positive("sensitivity", sensitivity)
    release = gaussian_steps_release(sigma / sensitivity, sample_rate, 1)
    return dataclasses.replace(release, label="ecos/coverage")
