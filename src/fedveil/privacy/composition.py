"""Epsilon of composed releases, with ``dp_accounting``'s RDP or PLD accountant.

Nothing here re-implements RDP or PLD arithmetic, except the Poisson-subsampled
Gaussian's RDP curve, which :mod:`fedveil.privacy.sgm_rdp` computes vectorised (same
numbers as ``dp_accounting``, checked in the tests).  Spec 002 section 1.3 (per-silo
RDP of the sampled Gaussian mechanism, orders, conversion).

Accountants: ``"rdp"`` (``RdpAccountant`` over :data:`DEFAULT_ORDERS`, with the
improved RDP->DP conversion of Canonne-Kamath-Steinke / Asoodeh et al., the
same as spec 002 eq. 1.4 and tf-privacy's ``_compute_eps``; note that for
fractional orders dp-accounting 0.6 bounds the Poisson series by the sum of
the absolute values of its terms, so at fractional orders it is slightly more
conservative than opacus / tf-privacy, identical at integer orders) and ``"pld"``
(``PLDAccountant`` with ``value_discretization_interval`` 1e-4, pessimistic); an
:class:`Accountant` is one of them with its settings.
PLD supports Poisson, full-batch and shuffle Gaussians; it does not support
sampling without replacement nor ``ZCDpEvent`` (report-noisy-max), and such
combinations raise ``ValueError``.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant

from . import checks
from .events import Release, check_sample_rate, event_from_dict, event_key, gaussian_steps_release
from .relations import ALL_RELATIONS, Sampling, as_sampling, relation_names, resolve_relation
from .sgm_rdp import poisson_gaussian_rdp
from .skellam import SKELLAM_RELATIONS, SkellamDpEvent, skellam_rdp

__all__ = ["ACCOUNTANTS", "MRMTL_ORDERS", "DEFAULT_ORDERS", "Accountant", "as_accountant", "epsilon", "schedule_epsilon"]

ACCOUNTANTS = ("rdp", "pld")

#: RDP orders of spec 002 section 1.3 (MR-MTL code, ``dp_accounting.py``).
MRMTL_ORDERS: tuple[float, ...] = tuple(
    [1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 3.0, 3.5, 4.0, 4.5]
    + [float(a) for a in range(5, 64)]
    + [128.0, 256.0, 512.0]
)

#: Default RDP orders (159): the spec's orders merged with dp_accounting's finer
#: default grid (1.1, 1.2, ..., 10.9, 11..63, 128, 256, 512, 1024).  More orders
#: can only lower the reported epsilon (the conversion takes a minimum over
#: orders, each of which is a valid bound): calibrated noise multipliers come out
#: up to ~0.5% below those computed with :data:`MRMTL_ORDERS` alone.
DEFAULT_ORDERS: tuple[float, ...] = tuple(
    sorted(
        {round(float(a), 10) for a in MRMTL_ORDERS}
        | {round(float(a), 10) for a in rdp_privacy_accountant.DEFAULT_RDP_ORDERS}
    )
)


# --------------------------------------------------------------------------- configuration


def check_accountant(accountant: Any) -> str:
    """``accountant`` if it is one of :data:`ACCOUNTANTS`; otherwise raise ``ValueError``."""
    return checks.one_of("accountant", accountant, ACCOUNTANTS)


def check_orders(orders: Any) -> tuple[float, ...]:
    """RDP orders as a tuple of floats > 1 (None: :data:`DEFAULT_ORDERS`)."""
    if orders is None or orders is DEFAULT_ORDERS:
        return DEFAULT_ORDERS
    try:
        out = tuple(float(a) for a in orders)
    except (TypeError, ValueError):
        raise ValueError(f"orders must be a sequence of numbers > 1; got {checks.shown(orders)}.") from None
    if not out or any(not (a > 1.0) or math.isinf(a) for a in out):
        raise ValueError(f"orders must be a non-empty sequence of finite numbers > 1; got {checks.shown(orders)}.")
    return out


def check_vdi(value: Any) -> float:
    """The PLD ``value_discretization_interval``: > 0 and fine enough to mean something."""
    value = checks.positive("value_discretization_interval", value)
    if value > 0.1:
        raise ValueError(
            f"value_discretization_interval={value} is too coarse for a meaningful epsilon; use <= 0.1 "
            "(1e-4 is a sensible default)."
        )
    return value


@dataclasses.dataclass(frozen=True)
class Accountant:
    """A ``dp_accounting`` accountant and its settings: ``kind`` one of :data:`ACCOUNTANTS`,
    the RDP ``orders`` (None: :data:`DEFAULT_ORDERS`) and the PLD ``value_discretization_interval``."""

    kind: str = "rdp"
    orders: tuple[float, ...] = DEFAULT_ORDERS
    value_discretization_interval: float = 1e-4

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", check_accountant(self.kind))
        object.__setattr__(self, "orders", check_orders(self.orders))
        object.__setattr__(self, "value_discretization_interval", check_vdi(self.value_discretization_interval))

    def fresh(self, relation: NeighboringRelation):
        """A fresh ``dp_accounting`` RDP or PLD accountant under ``relation``."""
        if self.kind == "rdp":
            return rdp_privacy_accountant.RdpAccountant(orders=list(self.orders), neighboring_relation=relation)
        return pld_privacy_accountant.PLDAccountant(
            neighboring_relation=relation, value_discretization_interval=self.value_discretization_interval
        )


def as_accountant(accountant: Accountant | str) -> Accountant:
    """``accountant`` itself, or the kind it names with the default settings."""
    return accountant if isinstance(accountant, Accountant) else Accountant(accountant)


# --------------------------------------------------------------------------- accountants


@functools.lru_cache(maxsize=4096)
def _supports_probe(kind: str, relation: NeighboringRelation, key: str) -> bool:
    event = event_from_dict(json.loads(key))
    if isinstance(event, SkellamDpEvent):  # fedveil's own event: an RDP bound, under zero-out
        return kind == "rdp" and relation in SKELLAM_RELATIONS
    return Accountant(kind, (2.0,), 1e-2).fresh(relation).supports(event)


def admissible_relations(kind: str, release: Release, key: str) -> frozenset:
    """The relations of ``release`` (event key ``key``) that accountant ``kind`` can account it under."""
    return frozenset(r for r in release.relations if _supports_probe(kind, r, key))


def unsupported_message(kind: str, release: Release, relations: frozenset) -> str:
    """Why accountant ``kind`` refuses ``release`` under ``relations``, and what to use instead."""
    name = type(release.event).__name__
    hint = ""
    if kind == "pld":
        hint = (
            " The PLD accountant supports Gaussian, Poisson-subsampled Gaussian and shuffle releases; "
            "use accountant='rdp' for sampling without replacement ('fixed'), zCDP / report-noisy-max events "
            "and Skellam (distributed DP) releases."
        )
    return (
        f"the {kind.upper()} accountant cannot account {name} ({release.label or release.event}) under "
        f"neighbouring relation(s) {relation_names(relations)}.{hint}"
    )


class _DropNonConvergence(logging.Filter):
    """Drops dp_accounting's "failed to converge ... Excluding this order" warnings.

    For small noise multipliers (visited while calibrating) the series for
    fractional orders close to 1 does not converge; dp_accounting then sets that
    order's RDP to infinity, which is conservative.  The message is noise here.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return "failed to converge" not in record.getMessage()


_ABSL_LOGGER = logging.getLogger("absl")


def _is_poisson_gaussian(event: dp_event.DpEvent) -> bool:
    return isinstance(event, dp_event.PoissonSampledDpEvent) and isinstance(event.event, dp_event.GaussianDpEvent)


@functools.lru_cache(maxsize=8192)
def rdp_curve(key: str, relation: NeighboringRelation, orders: tuple) -> np.ndarray:
    """RDP curve (read-only, one entry per order) of one application of the event with key ``key``."""
    event = event_from_dict(json.loads(key))
    if isinstance(event, SkellamDpEvent):
        vec = skellam_rdp(event, orders)
        vec.setflags(write=False)
        return vec
    if relation is NeighboringRelation.ADD_OR_REMOVE_ONE and _is_poisson_gaussian(event):
        vec = poisson_gaussian_rdp(event.sampling_probability, event.event.noise_multiplier, orders)
        vec.setflags(write=False)
        return vec
    acc = rdp_privacy_accountant.RdpAccountant(orders=list(orders), neighboring_relation=relation)
    quiet = _DropNonConvergence()
    _ABSL_LOGGER.addFilter(quiet)
    try:
        acc.compose(event, 1)
    finally:
        _ABSL_LOGGER.removeFilter(quiet)
    vec = acc.rdp
    vec.setflags(write=False)
    return vec


def combined_relation(kind: str, releases: Sequence[Release], keys: Sequence[str]) -> NeighboringRelation:
    """The one relation all ``releases`` can be composed under by accountant ``kind``, or ValueError."""
    rels = ALL_RELATIONS
    for rel, key in zip(releases, keys):
        adm = admissible_relations(kind, rel, key)
        if not adm:
            raise ValueError(unsupported_message(kind, rel, rel.relations))
        new = rels & adm
        if not new:
            raise ValueError(
                f"cannot compose {rel.label or type(rel.event).__name__} (valid under {relation_names(adm)}) "
                f"with releases valid only under {relation_names(rels)}: their epsilons refer to different "
                "neighbouring relations. Use one sampling scheme per accounted subject."
            )
        rels = new
    return resolve_relation(rels)


def rdp_to_epsilon(vec: np.ndarray, orders: tuple, delta: float) -> float:
    """Epsilon at ``delta`` of the RDP curve ``vec`` over ``orders``."""
    eps, _ = rdp_privacy_accountant.compute_epsilon(list(orders), list(vec), delta)
    return float(eps)


def releases_epsilon(releases: Sequence[Release], delta: float, accountant: Accountant) -> float:
    """Epsilon at ``delta`` of ``releases`` composed afresh (arguments already checked)."""
    keys = [event_key(r.event) for r in releases]
    relation = combined_relation(accountant.kind, releases, keys)
    if accountant.kind == "rdp":
        total = np.zeros(len(accountant.orders))
        for rel, key in zip(releases, keys):
            if rel.count:
                total = total + rel.count * rdp_curve(key, relation, accountant.orders)
        return rdp_to_epsilon(total, accountant.orders, delta)
    acc = accountant.fresh(relation)
    for rel in releases:
        if rel.count:
            acc.compose(rel.event, rel.count)
    return float(acc.get_epsilon(delta))


# --------------------------------------------------------------------------- public functions


@functools.lru_cache(maxsize=4096)
def _epsilon_cached(z: float, q: float, steps: int, delta: float, sampling: Sampling, accountant: Accountant) -> float:
    return releases_epsilon([gaussian_steps_release(z, q, steps, sampling)], delta, accountant)


def epsilon(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    sampling: Sampling | str = "poisson",
    accountant: Accountant | str = "rdp",
) -> float:
    """Epsilon of ``steps`` compositions of the subsampled Gaussian mechanism.

    Args:
      noise_multiplier: ``z`` = noise std / clipping norm (:mod:`fedveil.privacy.events`).
      sample_rate: ``q`` in (0, 1]; for ``"fixed"``/``"shuffle"`` the batch size is
        ``q * population_size`` and must be a whole number.
      steps: number of noisy steps (>= 0).
      delta: target delta in (0, 1).
      sampling: a :class:`~fedveil.privacy.relations.Sampling`, or a scheme without a
        population (``"poisson"`` | ``"full"``); the neighbouring relation of the result
        is :func:`~fedveil.privacy.relations.sampling_relation`.
      accountant: an :class:`Accountant`, or ``"rdp"`` / ``"pld"`` with its default
        settings (PLD refuses ``"fixed"``).
    """
    return _epsilon_cached(
        checks.positive("noise_multiplier", noise_multiplier),
        check_sample_rate(sample_rate),
        checks.integer("steps", steps),
        checks.fraction("delta", delta),
        as_sampling(sampling),
        as_accountant(accountant),
    )


def schedule_releases(noise_multipliers: np.ndarray, q: float, steps: int, sampling: Sampling) -> list[Release]:
    """One Release per distinct noise multiplier, its count the entries sharing it.

    Entry ``t`` is ``steps`` steps at ``noise_multipliers[t]``; for ``"shuffle"`` every
    entry starts a fresh permutation, so each costs ``shuffle_epochs(steps)`` Gaussians.
    """
    values, counts = np.unique(noise_multipliers, return_counts=True)
    releases = []
    for z, count in zip(values, counts):
        one = gaussian_steps_release(float(z), q, steps, sampling)
        releases.append(dataclasses.replace(one, count=one.count * int(count)))
    return releases


def schedule_epsilon(
    noise_multipliers: Sequence[float],
    sample_rate: float,
    delta: float,
    steps_per_entry: int = 1,
    sampling: Sampling | str = "poisson",
    accountant: Accountant | str = "rdp",
) -> float:
    """Epsilon of a noise schedule: entry ``t`` is ``steps_per_entry`` subsampled-Gaussian
    steps with noise multiplier ``noise_multipliers[t]`` (e.g. one entry per round);
    ``sampling`` and ``accountant`` as for :func:`epsilon`."""
    zs = checks.positive_vector("noise_multipliers", noise_multipliers)
    q = check_sample_rate(sample_rate)
    steps = checks.integer("steps_per_entry", steps_per_entry, minimum=1)
    releases = schedule_releases(zs, q, steps, as_sampling(sampling))
    return releases_epsilon(releases, checks.fraction("delta", delta), as_accountant(accountant))
