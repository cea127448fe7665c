"""The ECOS pipeline: one client, one cloud, one selection (spec 000 part 2, B.3 Alg. 5.1,
B.4, B.7, B.9); no federated round loop.

:func:`plan` lists the releases a client will make and their epsilon, and refuses a setting
over its budget before any work.  :func:`select` runs one selection method end to end and
returns the chosen cloud indices, the client's epsilon and the cost of every stage
(:class:`StageCost`: seconds and bytes, B.7).  A :class:`CloudPool` holds what the cloud
computes once on its pool (phi features, the R centroids of Alg. 5.1 line 1), so several
selections from the same pool (budgets, methods) share it.

Decisions on the spec's open points:

* One upload per selection: ``"ecos"`` and ``"proximity"`` (Table 5.5's proximity-only
  ablation) each make exactly one coverage release (:func:`.coverage.coverage_release`,
  add/remove-one neighbours, sensitivity 1), recorded in the caller's
  :class:`~fedveil.privacy.ledger.PrivacyLedger` under the client's subject once the summary
  is computed; the ledger's epsilon is then checked against the plan's.  ``"random"`` and
  ``"k_center"`` read nothing of the client and record nothing (epsilon 0, B.9).
* ``epsilon_budget`` is checked twice before any work: the plan alone (:func:`plan`), and
  the client's ledger total with the plan added (:func:`select`), so a client that already
  spent part of its budget is refused too.
* Costs (B.7): the client downloads the centroids as float32 (``4 R d_e`` bytes; phi itself
  is public code, e.g. HOG, not counted) and uploads ``summary.nbytes = 4 R + 24`` bytes.
  Seconds are wall-clock: the cloud's phi of its pool and its ``KMeans_R`` (reported with
  every selection that uses them, though a shared :class:`CloudPool` computes them once),
  the client's phi of its rows plus counting and noise, and the cloud's selection.
* Randomness: every draw comes from a stream named by the seed and its purpose
  (:mod:`fedveil.seeding`): ``ecos/kmeans``, ``ecos/coverage``, ``ecos/select/<method>``;
  a selection is a deterministic function of its inputs and seed.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from functools import cached_property
from typing import Any, TypeVar

import numpy as np
import torch

from ..privacy import checks
from ..privacy.composition import check_accountant
from ..privacy.events import Release
from ..privacy.ledger import PrivacyLedger, Subject
from ..privacy.randomness import NoiseSource
from ..seeding import derive_seed, numpy_generator
from .coverage import CoverageSummary, cloud_centroids, coverage_release, private_coverage
from .features import EXTRACTORS, extract
from .private_knn import KNNLabels, KNNSettings, labelling_release, private_knn_labels
from .selection import check_cap, ecos_select, k_center_select, proximity_only_select, random_select

__all__ = [
    "METHODS",
    "PRIVATE_METHODS",
    "CloudPool",
    "ECOSSettings",
    "Labelling",
    "Plan",
    "Selection",
    "StageCost",
    "label",
    "plan",
    "plan_labelling",
    "select",
]

#: Selection methods: ECOS (Alg. 5.1), the baselines of B.9 and Table 5.5's proximity-only ablation.
METHODS = ("ecos", "random", "k_center", "proximity")
#: The methods that read the client's data (one noisy coverage upload each).
PRIVATE_METHODS = ("ecos", "proximity")

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class ECOSSettings:
    """ECOS's knobs (B.3-B.4): phi and its options, ``R`` centroids, noise ``sigma``, Poisson
    rate ``sample_rate`` (gamma), score scale ``scale_s``, the reading ``cap`` of Alg. 5.1
    line 9 (:data:`.selection.CAPS`), the accountant and ``delta`` the epsilon is reported
    at, an optional ``epsilon_budget`` the client may not exceed, and ``secure_rng``: draw the
    coverage and kNN noise and subsamples from the OS's secure generator, not the seed."""

    extractor: str = "hog"
    extractor_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    R: int = 100
    sigma: float = 25.0
    sample_rate: float = 0.8
    scale_s: float = 1.0
    cap: str = "cluster_size"
    delta: float = 1e-5
    accountant: str = "pld"
    epsilon_budget: float | None = None
    secure_rng: bool = False

    def __post_init__(self) -> None:
        if self.extractor not in EXTRACTORS:
            raise ValueError(f"unknown feature extractor {self.extractor!r}; choose one of {sorted(EXTRACTORS)}.")
        if not isinstance(self.extractor_options, Mapping):
            raise ValueError(f"extractor_options must be a mapping; got {checks.shown(self.extractor_options)}.")
        object.__setattr__(self, "extractor_options", dict(self.extractor_options))
        object.__setattr__(self, "R", checks.integer("R", self.R, minimum=1))
        object.__setattr__(self, "sigma", checks.positive("sigma", self.sigma))
        object.__setattr__(self, "sample_rate", checks.fraction("sample_rate", self.sample_rate, one=True))
        object.__setattr__(self, "scale_s", checks.positive("scale_s", self.scale_s))
        check_cap(self.cap)
        object.__setattr__(self, "delta", checks.fraction("delta", self.delta))
        object.__setattr__(self, "accountant", check_accountant(self.accountant))
        if self.epsilon_budget is not None:
            object.__setattr__(self, "epsilon_budget", checks.positive("epsilon_budget", self.epsilon_budget))
        if not isinstance(self.secure_rng, bool):
            raise ValueError(f"secure_rng must be true or false; got {checks.shown(self.secure_rng)}.")

    def features(self, x: torch.Tensor) -> np.ndarray:
        """phi(x): the shared, public feature extractor (Alg. 5.1 lines 1 and 3)."""
        return extract(self.extractor, x, **self.extractor_options)


def noise_of(settings: ECOSSettings, noise: NoiseSource | None) -> NoiseSource:
    """``noise``, or the source ``settings.secure_rng`` asks for."""
    return NoiseSource.for_config(settings.secure_rng) if noise is None else noise


@dataclasses.dataclass(frozen=True)
class Plan:
    """The releases a client will make for one private selection, and their epsilon at ``delta``."""

    releases: tuple[Release, ...]
    epsilon: float
    delta: float


@dataclasses.dataclass(frozen=True)
class StageCost:
    """Seconds and bytes per stage of one selection (B.7); 0 for a stage the method skips."""

    cloud_features_s: float = 0.0  # the cloud's phi of its pool (K-Center, ECOS, proximity)
    cloud_clustering_s: float = 0.0  # Alg. 5.1 line 1: KMeans_R of those features
    download_bytes: int = 0  # line 3: the R centroids, float32 R x d_e
    client_summary_s: float = 0.0  # lines 4-6: phi of the client's rows, nearest centroid, counts, noise
    upload_bytes: int = 0  # line 6: the CoverageSummary, 4 R + 24 bytes
    cloud_selection_s: float = 0.0  # lines 8-16, or the baseline's selection


@dataclasses.dataclass(frozen=True, eq=False)
class Selection:
    """One method's pick: ``indices`` into the cloud pool, the client's ledger ``epsilon`` after
    it (0 if it never released anything), the stage costs and, for a private method, the upload."""

    method: str
    indices: np.ndarray
    epsilon: float
    cost: StageCost
    summary: CoverageSummary | None = None


def _timed(fn: Callable[[], T]) -> tuple[T, float]:
    """``fn()`` and the wall-clock seconds it took."""
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _check_settings(settings: Any) -> ECOSSettings:
    if not isinstance(settings, ECOSSettings):
        raise ValueError(f"settings must be ECOSSettings; got {type(settings).__name__}.")
    return settings


def _check_images(name: str, x: Any) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.ndim != 4 or len(x) == 0:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} images must be a non-empty N x C x H x W tensor; got {got}.")
    return x


class CloudPool:
    """The cloud's open pool (images ``N x C x H x W``) and what the cloud derives from it once:
    phi features and the R centroids (Alg. 5.1 line 1, seeded by ``seed``), each timed when
    first computed."""

    def __init__(self, images: torch.Tensor, settings: ECOSSettings, seed: int) -> None:
        self.images, self.settings = _check_images("cloud", images), _check_settings(settings)
        self.seed = checks.integer("seed", seed)
        self.features_seconds = self.clustering_seconds = 0.0

    def __len__(self) -> int:
        return len(self.images)

    @cached_property
    def features(self) -> np.ndarray:
        """phi of every pool image, float32 ``N x d_e``."""
        features, self.features_seconds = _timed(lambda: self.settings.features(self.images))
        return features

    @cached_property
    def centroids(self) -> np.ndarray:
        """Alg. 5.1 line 1: the float32 ``R x d_e`` centroids of :attr:`features`."""
        features = self.features
        kmeans_seed = derive_seed(self.seed, "ecos/kmeans") % 2**32  # scikit-learn takes 32-bit seeds
        centroids, self.clustering_seconds = _timed(lambda: cloud_centroids(features, self.settings.R, kmeans_seed))
        return centroids

    def matches(self, settings: ECOSSettings) -> bool:
        """Whether this pool's phi and R are those of ``settings``."""
        key = lambda s: (s.extractor, s.extractor_options, s.R)  # noqa: E731
        return key(self.settings) == key(_check_settings(settings))


def _plan_of(settings: ECOSSettings, releases: tuple[Release, ...], what: str) -> Plan:
    epsilon = PrivacyLedger(settings.accountant).epsilon_of(list(releases), settings.delta)
    if settings.epsilon_budget is not None and epsilon > settings.epsilon_budget:
        raise ValueError(
            f"{what} costs epsilon {epsilon:.4g} at delta {settings.delta:g}, over the budget "
            f"{settings.epsilon_budget:g}; raise the noise or lower the sampling rate."
        )
    return Plan(releases, epsilon, settings.delta)


def plan(settings: ECOSSettings) -> Plan:
    """B.4: the one coverage release of a private selection and its epsilon at ``settings.delta``
    with ``settings.accountant``; a one-line ValueError if it exceeds ``settings.epsilon_budget``."""
    _check_settings(settings)
    return _plan_of(settings, (coverage_release(settings.sigma, settings.sample_rate),),
                    f"the ECOS upload (sigma {settings.sigma:g}, gamma {settings.sample_rate:g})")


def plan_labelling(settings: ECOSSettings, knn: KNNSettings, num_queries: int) -> Plan:
    """B.5: the release of labelling ``num_queries`` cloud samples by private kNN
    (:func:`.private_knn.labelling_release`) and its epsilon alone, checked like :func:`plan`."""
    _check_settings(settings)
    release = labelling_release(num_queries, knn)
    return _plan_of(settings, (release,), f"private kNN labelling of {num_queries} queries")


def _pool(cloud_x: CloudPool | torch.Tensor, settings: ECOSSettings, seed: int) -> CloudPool:
    if isinstance(cloud_x, CloudPool):
        if not cloud_x.matches(settings):
            raise ValueError("the CloudPool was built with another feature extractor or R than these settings.")
        return cloud_x
    return CloudPool(cloud_x, settings, seed)


def _spend(ledger: PrivacyLedger, subject: Subject, settings: ECOSSettings, spend: Plan) -> tuple[Plan, float]:
    """The plan and the client's ledger total once it is recorded; refuses, before any work, a
    ledger of another accountant or a total over ``epsilon_budget``."""
    if ledger.accountant.kind != settings.accountant:
        raise ValueError(
            f"the ledger accounts with {ledger.accountant.kind!r} but the settings plan with {settings.accountant!r}."
        )
    total = ledger.epsilon_with(subject, list(spend.releases), settings.delta)
    if settings.epsilon_budget is not None and total > settings.epsilon_budget:
        raise ValueError(
            f"client {subject!r} would reach epsilon {total:.4g} with this upload, "
            f"over the budget {settings.epsilon_budget:g}."
        )
    return spend, total


def _record(ledger: PrivacyLedger, subject: Subject, spend: Plan, expected: float) -> float:
    """Record the planned releases, then check the ledger's epsilon is the one planned."""
    for release in spend.releases:
        ledger.record(subject, release)
    epsilon = ledger.epsilon(subject, spend.delta)
    if not math.isclose(epsilon, expected, rel_tol=1e-9, abs_tol=1e-12):
        raise RuntimeError(f"ledger epsilon {epsilon!r} for {subject!r} differs from the planned {expected!r}.")
    return epsilon


def select(
    method: str,
    client_x: torch.Tensor,
    cloud_x: CloudPool | torch.Tensor,
    budget: int,
    settings: ECOSSettings,
    ledger: PrivacyLedger,
    subject: Subject,
    seed: int,
    noise: NoiseSource | None = None,
) -> Selection:
    """Pick at most ``budget`` cloud samples for the client by ``method`` (:data:`METHODS`).

    ``client_x``: the client's private images; ``cloud_x``: the pool's images, or a
    :class:`CloudPool` to share its features and centroids across calls.  ``"ecos"``: Alg.
    5.1 (lines 1, 3-6 on the client, 8-16 on the cloud); ``"proximity"``: Table 5.5's
    proximity-only ablation on the same upload; ``"random"`` / ``"k_center"``: B.9's
    baselines, blind to the client.  Private methods record their one release for
    ``subject`` in ``ledger`` (see the module docstring).
    """
    if method not in METHODS:
        raise ValueError(f"unknown selection method {method!r}; choose one of {list(METHODS)}.")
    if not isinstance(ledger, PrivacyLedger):
        raise ValueError(f"ledger must be a PrivacyLedger; got {type(ledger).__name__}.")
    settings = _check_settings(settings)
    seed = checks.integer("seed", seed)
    pool = _pool(cloud_x, settings, seed)
    budget = checks.integer("budget", budget)
    if budget > len(pool):
        raise ValueError(f"budget B = {budget} exceeds the {len(pool)} samples of the cloud pool.")
    rng = numpy_generator(seed, "ecos/select", method)
    if method == "random":
        indices, seconds = _timed(lambda: random_select(len(pool), budget, rng))
        return Selection(method, indices, ledger.epsilon(subject, settings.delta), StageCost(cloud_selection_s=seconds))
    if method == "k_center":
        features = pool.features
        indices, seconds = _timed(lambda: k_center_select(features, budget, rng))
        cost = StageCost(cloud_features_s=pool.features_seconds, cloud_selection_s=seconds)
        return Selection(method, indices, ledger.epsilon(subject, settings.delta), cost)
    client_x = _check_images("client", client_x)
    spend, expected = _spend(ledger, subject, settings, plan(settings))
    centroids = pool.centroids
    coverage_rng = noise_of(settings, noise).stream("ecos-coverage", numpy_generator(seed, "ecos/coverage"))
    summary, client_seconds = _timed(lambda: private_coverage(
        settings.features(client_x), centroids, settings.sigma, settings.sample_rate, coverage_rng
    ))
    epsilon = _record(ledger, subject, spend, expected)
    features, scores = pool.features, summary.scores
    if method == "ecos":
        indices, seconds = _timed(lambda: ecos_select(
            features, centroids, scores, budget, settings.scale_s, rng, settings.cap
        ))
    else:
        indices, seconds = _timed(lambda: proximity_only_select(features, centroids, scores, budget, rng))
    cost = StageCost(
        cloud_features_s=pool.features_seconds, cloud_clustering_s=pool.clustering_seconds,
        download_bytes=int(centroids.nbytes), client_summary_s=client_seconds,
        upload_bytes=summary.nbytes, cloud_selection_s=seconds,
    )
    return Selection(method, indices, epsilon, cost, summary)


@dataclasses.dataclass(frozen=True, eq=False)
class Labelling:
    """The client's private kNN answer (:class:`.private_knn.KNNLabels`), its ledger epsilon
    after the release, and the seconds it took the client."""

    answer: KNNLabels
    epsilon: float
    client_seconds: float


def label(
    client_x: torch.Tensor,
    client_y: torch.Tensor,
    queries_x: torch.Tensor,
    num_classes: int,
    settings: ECOSSettings,
    knn: KNNSettings,
    ledger: PrivacyLedger,
    subject: Subject,
    seed: int,
    noise: NoiseSource | None = None,
) -> Labelling:
    """B.5 / Case 3: the client labels the cloud's ``queries_x`` (e.g. a selection) by private
    kNN in phi space (``settings``' extractor) and records the release for ``subject`` in
    ``ledger``; refused before any work when the client's total would exceed
    ``settings.epsilon_budget``.  Noise and subsamples come from the ``ecos/private-knn`` stream."""
    if not isinstance(ledger, PrivacyLedger):
        raise ValueError(f"ledger must be a PrivacyLedger; got {type(ledger).__name__}.")
    settings = _check_settings(settings)
    client_x, queries_x = _check_images("client", client_x), _check_images("query", queries_x)
    if not isinstance(client_y, torch.Tensor) or client_y.shape != (len(client_x),):
        raise ValueError(f"client labels must be a tensor of {len(client_x)} class indices (one per client image).")
    spend, expected = _spend(ledger, subject, settings, plan_labelling(settings, knn, len(queries_x)))
    rng = noise_of(settings, noise).stream("ecos-knn", numpy_generator(checks.integer("seed", seed), "ecos/private-knn"))
    answer, seconds = _timed(lambda: private_knn_labels(
        settings.features(client_x), client_y.numpy(), settings.features(queries_x), num_classes, knn, rng
    ))
    return Labelling(answer, _record(ledger, subject, spend, expected), seconds)
