"""Privacy accounting for DP-SGD and DP-FedAvg, built on ``dp_accounting`` DpEvents.

Every noisy release is described by a ``dp_accounting`` DpEvent and composed by
``dp_accounting``'s RDP accountant (default) or PLD accountant; nothing here
re-implements RDP or PLD arithmetic.  Spec 002, section 1.3 (per-silo RDP of the
sampled Gaussian mechanism, orders, conversion) and section 1.4 (report-noisy-max
selection cost); DESIGN.md idea 3 (every release is an event in a ledger).

Noise-multiplier convention (same as opacus, tf-privacy and
``dp_accounting.GaussianDpEvent``): per-unit contributions (per-example
gradients, or per-client updates) are clipped to L2 norm ``C``, summed, and
Gaussian noise with standard deviation ``z * C`` is added; ``z`` is the noise
multiplier.  Dividing by a fixed batch / cohort size afterwards is
post-processing.

Sampling schemes and the neighbouring relation each is accounted under
(``sampling_relation`` returns it):

``"poisson"``
    Each example joins a step's batch independently with probability ``q``.
    ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` per step, add/remove-one
    neighbours (sensitivity ``C``); RDP and PLD both support it.  This is what
    opacus' RDPAccountant reports.
``"full"``
    Every example in every step (``q = 1``): ``GaussianDpEvent(z)`` per step,
    add/remove-one neighbours.
``"fixed"``
    Batches of exactly ``B = q * n`` examples drawn uniformly *without
    replacement* (independently each step) from ``n = population_size``.
    ``dp_accounting`` accounts ``SampledWithoutReplacementDpEvent`` only with the
    RDP accountant and only under **replace-one** neighbours
    (``NeighboringRelation.REPLACE_ONE``; Wang, Balle & Kasiviswanathan 2019,
    Thm 27: ``n`` is public, one example is swapped for another).  Its formula
    takes the noise multiplier relative to the *replace-one* L2 sensitivity of
    the batch sum, which is ``2C`` (one clipped vector leaves, another arrives),
    so the event is built with ``GaussianDpEvent(z / 2)``.  The resulting epsilon
    is a replace-one epsilon and is *not* comparable to a Poisson add/remove
    epsilon for the same ``z`` (typically several times larger).  PLD refuses it.
``"shuffle"``
    Each epoch a fresh random permutation is cut into disjoint batches of size
    ``B = q * n`` (``drop_last`` as in the data loader), so every example is in
    at most one batch per epoch.  No sound *amplification* by shuffling is
    available in ``dp_accounting``, so we use none: with the permutation
    independent of the data, a change to one example changes only the one
    release of its batch in that epoch (parallel composition), so an epoch costs
    at most one un-amplified ``GaussianDpEvent(z)`` per example, and ``steps``
    steps cost ``ceil(steps / steps_per_epoch)`` such Gaussians (the last,
    partial epoch counted in full).  ``steps_per_epoch = n // B`` with
    ``drop_last=True`` (the default, also conservative if the loader keeps the
    last partial batch) and ``ceil(n / B)`` otherwise.  Sensitivity ``C`` holds
    under **zero-out** neighbours (``NeighboringRelation.REPLACE_SPECIAL``:
    one example replaced by a null example contributing a zero gradient; the
    dataset size and the batch layout are unchanged), which is the relation
    reported.  This is loose for few epochs but never optimistic.  Recording
    each round separately assumes a fresh permutation per round; if the loader
    carries on across rounds this over-counts, which is still sound.

Accountants: ``"rdp"`` (``RdpAccountant`` over :data:`DEFAULT_ORDERS`, with the
improved RDP->DP conversion of Canonne-Kamath-Steinke / Asoodeh et al., the
same as spec 002 eq. 1.4 and tf-privacy's ``_compute_eps``; note that for
fractional orders dp-accounting 0.6 bounds the Poisson series by the sum of
the absolute values of its terms, so at fractional orders it is slightly more
conservative than opacus / tf-privacy, identical at integer orders) and ``"pld"``
(``PLDAccountant`` with ``value_discretization_interval`` 1e-4, pessimistic).
PLD supports Poisson, full-batch and shuffle Gaussians; it does not support
sampling without replacement nor ``ZCDpEvent`` (report-noisy-max), and such
combinations raise ``ValueError``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import logging
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Union

import attr
import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant
from .sgm_rdp import poisson_gaussian_rdp

__all__ = [
    "ACCOUNTANTS",
    "SAMPLINGS",
    "MRMTL_ORDERS",
    "DEFAULT_ORDERS",
    "NeighboringRelation",
    "Release",
    "PrivacyLedger",
    "epsilon",
    "calibrate_noise",
    "calibrate_noise_schedule",
    "schedule_epsilon",
    "gaussian_std",
    "gaussian_steps_release",
    "report_noisy_max_release",
    "zcdp_release",
    "sampling_relation",
    "shuffle_epochs",
    "event_to_dict",
    "event_from_dict",
]

ACCOUNTANTS = ("rdp", "pld")
SAMPLINGS = ("poisson", "fixed", "shuffle", "full")

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

_ALL_RELATIONS = frozenset(NeighboringRelation)
# When several relations are admissible for a subject, report the first of these.
_RELATION_PREFERENCE = (
    NeighboringRelation.ADD_OR_REMOVE_ONE,
    NeighboringRelation.REPLACE_SPECIAL,
    NeighboringRelation.REPLACE_ONE,
)
_SAMPLING_RELATIONS = {
    "poisson": frozenset({NeighboringRelation.ADD_OR_REMOVE_ONE, NeighboringRelation.REPLACE_SPECIAL}),
    "full": frozenset({NeighboringRelation.ADD_OR_REMOVE_ONE, NeighboringRelation.REPLACE_SPECIAL}),
    "fixed": frozenset({NeighboringRelation.REPLACE_ONE}),
    "shuffle": frozenset({NeighboringRelation.REPLACE_SPECIAL}),
}

Subject = Union[str, int]


# --------------------------------------------------------------------------- validation


def _check_positive(name: str, value: Any, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number; got {value!r}.")
    value = float(value)
    ok = value >= 0.0 if allow_zero else value > 0.0
    if math.isnan(value) or math.isinf(value) or not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}; got {value!r}.")
    return value


def _check_int(name: str, value: Any, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if isinstance(value, numbers.Real) and float(value).is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name} must be an integer; got {value!r}.")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}.")
    return value


def _check_delta(delta: Any) -> float:
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not (0.0 < float(delta) < 1.0):
        raise ValueError(f"delta must lie in the open interval (0, 1); got {delta!r}.")
    return float(delta)


def _check_sample_rate(sample_rate: Any) -> float:
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, numbers.Real):
        raise ValueError(f"sample_rate must be a number in (0, 1]; got {sample_rate!r}.")
    q = float(sample_rate)
    if not (0.0 < q <= 1.0):
        raise ValueError(
            f"sample_rate must lie in (0, 1] (batch size / population size); got {sample_rate!r}."
        )
    return q


def _check_accountant(accountant: Any) -> str:
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {ACCOUNTANTS}; got {accountant!r}.")
    return accountant


def _check_sampling(sampling: Any) -> str:
    if sampling not in SAMPLINGS:
        raise ValueError(f"sampling must be one of {SAMPLINGS}; got {sampling!r}.")
    return sampling


def _check_orders(orders: Any) -> tuple[float, ...]:
    if orders is None:
        return DEFAULT_ORDERS
    try:
        out = tuple(float(a) for a in orders)
    except TypeError:
        raise ValueError(f"orders must be a sequence of numbers > 1; got {orders!r}.") from None
    if not out or any(not (a > 1.0) or math.isinf(a) for a in out):
        raise ValueError(f"orders must be a non-empty sequence of finite numbers > 1; got {orders!r}.")
    return out


def _check_vdi(value: Any) -> float:
    value = _check_positive("value_discretization_interval", value)
    if value > 0.1:
        raise ValueError(
            f"value_discretization_interval={value} is too coarse for a meaningful epsilon; use <= 0.1 "
            "(1e-4 is a sensible default)."
        )
    return value


def _check_subject(subject: Any) -> Subject:
    if isinstance(subject, bool) or not isinstance(subject, (str, numbers.Integral)):
        raise ValueError(
            f"subject must be a str (e.g. 'population') or an int (a silo / client id); got {subject!r}."
        )
    return subject if isinstance(subject, str) else int(subject)


def _relation_from_any(relation: Any) -> NeighboringRelation:
    if isinstance(relation, NeighboringRelation):
        return relation
    if isinstance(relation, str):
        aliases = {
            "add_or_remove_one": NeighboringRelation.ADD_OR_REMOVE_ONE,
            "add_remove": NeighboringRelation.ADD_OR_REMOVE_ONE,
            "replace_special": NeighboringRelation.REPLACE_SPECIAL,
            "zero_out": NeighboringRelation.REPLACE_SPECIAL,
            "replace_one": NeighboringRelation.REPLACE_ONE,
        }
        key = relation.strip().lower()
        if key in aliases:
            return aliases[key]
    raise ValueError(
        f"unknown neighbouring relation {relation!r}; use a dp_accounting NeighboringRelation or one of "
        "'add_or_remove_one', 'replace_special' (zero-out), 'replace_one'."
    )


def _resolve_relation(relations: frozenset) -> NeighboringRelation:
    for rel in _RELATION_PREFERENCE:
        if rel in relations:
            return rel
    raise ValueError("no admissible neighbouring relation")  # callers check emptiness first


def _relation_names(relations: Iterable[NeighboringRelation]) -> str:
    names = [r.name for r in _RELATION_PREFERENCE if r in set(relations)]
    return "{" + ", ".join(names) + "}"


# --------------------------------------------------------------------------- events


def event_to_dict(event: dp_event.DpEvent) -> dict:
    """JSON-compatible nested dict of a DpEvent (``{"type": class name, **fields}``)."""
    if not isinstance(event, dp_event.DpEvent):
        raise ValueError(f"expected a dp_accounting DpEvent; got {event!r}.")

    def ser(value: Any) -> Any:
        if isinstance(value, dp_event.DpEvent):
            return event_to_dict(value)
        if isinstance(value, (list, tuple)):
            return [ser(v) for v in value]
        if isinstance(value, (bool, str)) or value is None:
            return value
        if isinstance(value, numbers.Integral):
            return int(value)
        if isinstance(value, numbers.Real):
            return float(value)
        raise ValueError(f"cannot serialise field value {value!r} of {type(event).__name__}.")

    out = {"type": type(event).__name__}
    for field in attr.fields(type(event)):
        out[field.name] = ser(getattr(event, field.name))
    return out


def event_from_dict(data: Mapping) -> dp_event.DpEvent:
    """Inverse of :func:`event_to_dict`."""
    if not isinstance(data, Mapping) or "type" not in data:
        raise ValueError(f"not a serialised DpEvent (missing 'type'): {data!r}.")
    cls = getattr(dp_event, str(data["type"]), None)
    if not (isinstance(cls, type) and issubclass(cls, dp_event.DpEvent)):
        raise ValueError(f"unknown DpEvent type {data['type']!r} in serialised ledger.")

    def de(value: Any) -> Any:
        if isinstance(value, Mapping):
            return event_from_dict(value)
        if isinstance(value, (list, tuple)):
            return [de(v) for v in value]
        return value

    kwargs = {k: de(v) for k, v in data.items() if k != "type"}
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ValueError(f"cannot rebuild {cls.__name__} from {dict(data)!r}: {exc}") from None


def _event_key(event: dp_event.DpEvent) -> str:
    return json.dumps(event_to_dict(event), sort_keys=True)


@dataclasses.dataclass(frozen=True)
class Release:
    """One accountable noisy release: ``event`` composed ``count`` times.

    ``relations`` is the set of neighbouring relations under which the event's
    parameters are correct (e.g. shuffling is accounted under zero-out only).
    """

    event: dp_event.DpEvent
    count: int = 1
    relations: frozenset = _ALL_RELATIONS
    label: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.event, dp_event.DpEvent):
            raise ValueError(f"Release.event must be a dp_accounting DpEvent; got {self.event!r}.")
        object.__setattr__(self, "count", _check_int("count", self.count))
        rels = frozenset(_relation_from_any(r) for r in self.relations)
        if not rels:
            raise ValueError("Release.relations must name at least one neighbouring relation.")
        object.__setattr__(self, "relations", rels)


def sampling_relation(sampling: str) -> NeighboringRelation:
    """Neighbouring relation under which :func:`epsilon` reports for ``sampling``."""
    return _resolve_relation(_SAMPLING_RELATIONS[_check_sampling(sampling)])


def _batch_size(sample_rate: float, population_size: Any, sampling: str) -> tuple[int, int]:
    if population_size is None:
        raise ValueError(
            f"sampling={sampling!r} needs population_size (the number of examples n the batches are drawn "
            "from); the batch size is sample_rate * population_size."
        )
    n = _check_int("population_size", population_size, minimum=1)
    exact = sample_rate * n
    b = int(round(exact))
    if b < 1 or abs(exact - b) > 1e-6 * max(1.0, exact):
        raise ValueError(
            f"sample_rate * population_size = {sample_rate} * {n} = {exact:.6g} is not a whole batch size; "
            f"pass sample_rate = batch_size / population_size exactly."
        )
    return n, b


def shuffle_epochs(steps: int, population_size: int, batch_size: int, drop_last: bool = True) -> int:
    """Most times one example can be used in ``steps`` steps of epoch-wise shuffling.

    ``ceil(steps / steps_per_epoch)`` with ``steps_per_epoch = n // B`` (drop_last)
    or ``ceil(n / B)``; a partial epoch counts as a full one.
    """
    steps = _check_int("steps", steps)
    n = _check_int("population_size", population_size, minimum=1)
    b = _check_int("batch_size", batch_size, minimum=1)
    if b > n:
        raise ValueError(f"batch_size {b} exceeds population_size {n}.")
    per_epoch = n // b if drop_last else -(-n // b)
    return -(-steps // per_epoch)


def gaussian_steps_release(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    sampling: str = "poisson",
    *,
    population_size: int | None = None,
    drop_last: bool = True,
) -> Release:
    """The Release for ``steps`` steps of a (sub)sampled Gaussian mechanism (see module doc)."""
    z = _check_positive("noise_multiplier", noise_multiplier)
    q = _check_sample_rate(sample_rate)
    steps = _check_int("steps", steps)
    sampling = _check_sampling(sampling)
    relations = _SAMPLING_RELATIONS[sampling]
    if sampling == "full" and q != 1.0:
        raise ValueError(f"sampling='full' uses every example in every step; sample_rate must be 1.0, got {q}.")
    if sampling in ("poisson", "full"):
        event = dp_event.GaussianDpEvent(z) if q == 1.0 else dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z))
        return Release(event, steps, relations, label=f"gaussian/{sampling}")
    n, b = _batch_size(q, population_size, sampling)
    if sampling == "fixed":
        # Replace-one L2 sensitivity of a sum of vectors clipped to C is 2C: noise multiplier z/2.
        event = dp_event.SampledWithoutReplacementDpEvent(n, b, dp_event.GaussianDpEvent(z / 2.0))
        return Release(event, steps, relations, label="gaussian/fixed")
    epochs = shuffle_epochs(steps, n, b, drop_last)
    return Release(dp_event.GaussianDpEvent(z), epochs, relations, label="gaussian/shuffle")


def report_noisy_max_release(epsilon_sel: float, count: int = 1) -> Release:
    """Report-noisy-max with Gumbel noise (= exponential mechanism), spec 002 eq. 1.5.

    An epsilon_sel exponential mechanism is ``epsilon_sel^2 / 8``-zCDP (bounded range,
    Cesar & Rogers 2021), i.e. ``(alpha, alpha * epsilon_sel^2 / 8)``-RDP; it is
    recorded as ``dp_accounting.ZCDpEvent(rho=epsilon_sel^2 / 8)``, which the RDP
    accountant composes exactly and the PLD accountant does not support.
    ``epsilon_sel`` must be calibrated to the score sensitivity under the relation
    of the subject it is recorded for.
    """
    eps = _check_positive("epsilon_sel", epsilon_sel)
    return Release(dp_event.ZCDpEvent(rho=eps * eps / 8.0), _check_int("count", count), label="report_noisy_max")


def zcdp_release(rho: float, count: int = 1) -> Release:
    """A rho-zCDP release (``ZCDpEvent``); RDP accountant only."""
    rho = _check_positive("rho", rho, allow_zero=True)
    return Release(dp_event.ZCDpEvent(rho=rho), _check_int("count", count), label="zcdp")


def _as_releases(extra: Any) -> list[Release]:
    if extra is None:
        return []
    if isinstance(extra, (Release, dp_event.DpEvent)):
        extra = [extra]
    if not isinstance(extra, Iterable) or isinstance(extra, (str, bytes, Mapping)):
        raise ValueError(f"expected a Release, a DpEvent or a sequence of them; got {extra!r}.")
    out = []
    for item in extra:
        if isinstance(item, Release):
            out.append(item)
        elif isinstance(item, dp_event.DpEvent):
            out.append(Release(item))
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], dp_event.DpEvent):
            out.append(Release(item[0], item[1]))
        else:
            raise ValueError(f"expected a Release, a DpEvent or an (event, count) pair; got {item!r}.")
    return out


# --------------------------------------------------------------------------- accountants


def _new_accountant(kind: str, relation: NeighboringRelation, orders: tuple, vdi: float):
    if kind == "rdp":
        return rdp_privacy_accountant.RdpAccountant(orders=list(orders), neighboring_relation=relation)
    return pld_privacy_accountant.PLDAccountant(neighboring_relation=relation, value_discretization_interval=vdi)


@functools.lru_cache(maxsize=4096)
def _supports_probe(kind: str, relation: NeighboringRelation, key: str) -> bool:
    probe = _new_accountant(kind, relation, (2.0,), 1e-2)
    return probe.supports(event_from_dict(json.loads(key)))


def _admissible(kind: str, release: Release, key: str) -> frozenset:
    return frozenset(r for r in release.relations if _supports_probe(kind, r, key))


def _unsupported_message(kind: str, release: Release, relations: frozenset) -> str:
    name = type(release.event).__name__
    hint = ""
    if kind == "pld":
        hint = (
            " The PLD accountant supports Gaussian, Poisson-subsampled Gaussian and shuffle releases; "
            "use accountant='rdp' for sampling without replacement ('fixed') and zCDP / report-noisy-max events."
        )
    return (
        f"the {kind.upper()} accountant cannot account {name} ({release.label or release.event}) under "
        f"neighbouring relation(s) {_relation_names(relations)}.{hint}"
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
def _rdp_unit(key: str, relation: NeighboringRelation, orders: tuple) -> np.ndarray:
    """RDP curve of one application of the event with JSON key ``key``."""
    event = event_from_dict(json.loads(key))
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


def _combined_relation(kind: str, releases: Sequence[Release], keys: Sequence[str]) -> NeighboringRelation:
    rels = _ALL_RELATIONS
    for rel, key in zip(releases, keys):
        adm = _admissible(kind, rel, key)
        if not adm:
            raise ValueError(_unsupported_message(kind, rel, rel.relations))
        new = rels & adm
        if not new:
            raise ValueError(
                f"cannot compose {rel.label or type(rel.event).__name__} (valid under {_relation_names(adm)}) "
                f"with releases valid only under {_relation_names(rels)}: their epsilons refer to different "
                "neighbouring relations. Use one sampling scheme per accounted subject."
            )
        rels = new
    return _resolve_relation(rels)


def _rdp_epsilon(vec: np.ndarray, orders: tuple, delta: float) -> float:
    eps, _ = rdp_privacy_accountant.compute_epsilon(list(orders), list(vec), delta)
    return float(eps)


def _epsilon_of(releases: Sequence[Release], delta: float, kind: str, orders: tuple, vdi: float) -> float:
    keys = [_event_key(r.event) for r in releases]
    relation = _combined_relation(kind, releases, keys)
    if kind == "rdp":
        total = np.zeros(len(orders))
        for rel, key in zip(releases, keys):
            if rel.count:
                total = total + rel.count * _rdp_unit(key, relation, orders)
        return _rdp_epsilon(total, orders, delta)
    acc = _new_accountant(kind, relation, orders, vdi)
    for rel in releases:
        if rel.count:
            acc.compose(rel.event, rel.count)
    return float(acc.get_epsilon(delta))


# --------------------------------------------------------------------------- public functions


@functools.lru_cache(maxsize=4096)
def _epsilon_cached(z, q, steps, delta, sampling, accountant, population_size, drop_last, orders, vdi) -> float:
    release = gaussian_steps_release(z, q, steps, sampling, population_size=population_size, drop_last=drop_last)
    return _epsilon_of([release], delta, accountant, orders, vdi)


def epsilon(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    sampling: str = "poisson",
    accountant: str = "rdp",
    *,
    population_size: int | None = None,
    drop_last: bool = True,
    orders: Sequence[float] | None = None,
    value_discretization_interval: float = 1e-4,
) -> float:
    """Epsilon of ``steps`` compositions of the subsampled Gaussian mechanism.

    Args:
      noise_multiplier: ``z`` = noise std / clipping norm (module doc).
      sample_rate: ``q`` in (0, 1]; for ``"fixed"``/``"shuffle"`` the batch size is
        ``q * population_size`` and must be a whole number.
      steps: number of noisy steps (>= 0).
      delta: target delta in (0, 1).
      sampling: ``"poisson"`` | ``"fixed"`` | ``"shuffle"`` | ``"full"``; the
        neighbouring relation of the result is :func:`sampling_relation`.
      accountant: ``"rdp"`` or ``"pld"`` (PLD refuses ``"fixed"``).
      population_size: number of examples ``n`` (``"fixed"`` and ``"shuffle"``).
      drop_last: shuffle only: whether the loader drops the last partial batch.
      orders: RDP orders (default :data:`DEFAULT_ORDERS`).
      value_discretization_interval: PLD discretisation.
    """
    return _epsilon_cached(
        _check_positive("noise_multiplier", noise_multiplier),
        _check_sample_rate(sample_rate),
        _check_int("steps", steps),
        _check_delta(delta),
        _check_sampling(sampling),
        _check_accountant(accountant),
        None if population_size is None else _check_int("population_size", population_size, minimum=1),
        bool(drop_last),
        _check_orders(orders),
        _check_vdi(value_discretization_interval),
    )


def calibrate_noise(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    sampling: str = "poisson",
    accountant: str = "rdp",
    *,
    population_size: int | None = None,
    drop_last: bool = True,
    orders: Sequence[float] | None = None,
    value_discretization_interval: float = 1e-4,
    extra_events: Any = None,
    rtol: float = 1e-4,
    max_noise_multiplier: float = 1e6,
    min_noise_multiplier: float = 1e-3,
) -> float:
    """Smallest noise multiplier whose :func:`epsilon` (plus ``extra_events``) is <= ``target_epsilon``.

    Brackets the root of the monotone ``epsilon(z) - target`` (factors of 4 from
    ``z = 1``) and shrinks the bracket (bisection, accelerated by regula falsi
    in ``log z``) until ``hi - lo <= rtol * hi``; returns the upper end, so the
    target is always met and ``z * (1 - rtol)`` misses it.  ``extra_events``
    (Releases / DpEvents, e.g. report-noisy-max selections, spec 002 section
    1.4) are composed with the Gaussian steps, so the noise is recalibrated to
    keep the total at the target.  Results without ``extra_events`` are cached.

    Raises ValueError when the target cannot be met with
    ``z <= max_noise_multiplier`` (e.g. ``extra_events`` alone exceed it) or is met
    even by ``z = min_noise_multiplier``.
    """
    target = _check_positive("target_epsilon", target_epsilon)
    delta = _check_delta(delta)
    q = _check_sample_rate(sample_rate)
    steps = _check_int("steps", steps)
    sampling = _check_sampling(sampling)
    kind = _check_accountant(accountant)
    orders_t = _check_orders(orders)
    vdi = _check_vdi(value_discretization_interval)
    rtol = _check_positive("rtol", rtol)
    z_max = _check_positive("max_noise_multiplier", max_noise_multiplier)
    z_min = _check_positive("min_noise_multiplier", min_noise_multiplier)
    if z_min >= z_max:
        raise ValueError("min_noise_multiplier must be smaller than max_noise_multiplier.")
    extras = _as_releases(extra_events)
    if population_size is not None:
        population_size = _check_int("population_size", population_size, minimum=1)
    args = (target, delta, q, steps, sampling, kind, population_size, bool(drop_last), orders_t, vdi, rtol, z_max, z_min)
    if not extras:
        return _calibrate_cached(*args)
    return _calibrate(*args, extras)


@functools.lru_cache(maxsize=1024)
def _calibrate_cached(*args) -> float:
    return _calibrate(*args, [])


def _calibrate(target, delta, q, steps, sampling, kind, population_size, drop_last, orders_t, vdi, rtol, z_max, z_min, extras):
    if steps == 0:
        raise ValueError("steps must be >= 1 to calibrate a noise multiplier (0 steps release nothing).")
    # Validates the sampling arguments and that the Gaussian steps and `extra_events` share a relation.
    probe = gaussian_steps_release(1.0, q, steps, sampling, population_size=population_size, drop_last=drop_last)
    extra_keys = [_event_key(r.event) for r in extras]
    relation = _combined_relation(kind, [probe, *extras], [_event_key(probe.event), *extra_keys])

    if kind == "rdp":
        extra_vec = np.zeros(len(orders_t))
        for rel, key in zip(extras, extra_keys):
            if rel.count:
                extra_vec = extra_vec + rel.count * _rdp_unit(key, relation, orders_t)

        def eps_of(z: float) -> float:
            r = gaussian_steps_release(z, q, steps, sampling, population_size=population_size, drop_last=drop_last)
            vec = r.count * _rdp_unit(_event_key(r.event), relation, orders_t) + extra_vec
            return _rdp_epsilon(vec, orders_t, delta)

    else:

        def eps_of(z: float) -> float:
            r = gaussian_steps_release(z, q, steps, sampling, population_size=population_size, drop_last=drop_last)
            return _epsilon_of([r, *extras], delta, kind, orders_t, vdi)

    if extras:
        eps_extra = _epsilon_of(extras, delta, kind, orders_t, vdi)
        if eps_extra >= target:
            raise ValueError(
                f"target epsilon {target} is unreachable: the extra releases alone cost epsilon={eps_extra:.6g} "
                f"at delta={delta:g}, before any Gaussian step."
            )
    return _solve_noise(eps_of, target, delta, z_min, z_max, rtol)


def _solve_noise(
    eps_of, target: float, delta: float, z_min: float, z_max: float, rtol: float,
    start: float = 1.0, factor: float = 4.0,
) -> float:
    """Smallest ``z`` in ``[z_min, z_max]`` (up to ``rtol``) with ``eps_of(z) <= target``.

    Brackets the root of the decreasing ``eps_of(z) - target`` from ``z = start`` by
    steps of ``factor`` (squared after each step when ``factor < 4``, so a close
    initial guess costs few evaluations and a poor one still brackets quickly), then
    :func:`_shrink_bracket`.
    """
    z = min(max(start, z_min), z_max)
    e = eps_of(z)

    def widen(f: float) -> float:
        return f if f >= 4.0 else f * f

    if e <= target:
        hi, e_hi = z, e
        while True:
            if hi <= z_min:
                raise ValueError(
                    f"target epsilon {target} is met even by noise_multiplier={z_min:g}; the target is too loose "
                    "to calibrate against (lower min_noise_multiplier if this is intended)."
                )
            lo = max(hi / factor, z_min)
            e_lo = eps_of(lo)
            if e_lo > target:
                break
            hi, e_hi = lo, e_lo
            factor = widen(factor)
    else:
        lo, e_lo = z, e
        while True:
            if lo >= z_max:
                raise ValueError(
                    f"target epsilon {target} is unreachable: even noise_multiplier={z_max:g} gives epsilon="
                    f"{e_lo:.6g} at delta={delta:g}."
                )
            hi = min(lo * factor, z_max)
            e_hi = eps_of(hi)
            if e_hi <= target:
                break
            lo, e_lo = hi, e_hi
            factor = widen(factor)
    return _shrink_bracket(eps_of, target, lo, e_lo, hi, e_hi, rtol)


def _shrink_bracket(eps_of, target: float, lo: float, e_lo: float, hi: float, e_hi: float, rtol: float) -> float:
    """Shrink ``[lo, hi]`` (eps(lo) > target >= eps(hi)) until ``hi - lo <= rtol * hi``; return ``hi``.

    Bisection accelerated by regula falsi (Illinois variant) in ``log z``: each
    trial point stays strictly inside the bracket and the bracket only ever
    shrinks, so the invariant (and hence the returned ``hi`` meeting the
    target) holds exactly as for plain bisection; every few steps a plain
    bisection step guarantees progress.
    """
    a, b = math.log(lo), math.log(hi)
    fa, fb = e_lo - target, e_hi - target
    tol = -math.log1p(-rtol)  # b - a <= tol  <=>  lo >= hi * (1 - rtol)
    side = 0
    for it in range(200):
        width = b - a
        if width <= tol:
            break
        if it % 4 == 3 or not (fa > 0 >= fb) or fa == fb:
            c = 0.5 * (a + b)
        else:
            c = b - fb * width / (fb - fa)
            c = min(max(c, a + 0.4 * tol), b - 0.4 * tol)
        fc = eps_of(math.exp(c)) - target
        if fc <= 0:
            b, fb = c, fc
            if side == -1:
                fa *= 0.5
            side = -1
        else:
            a, fa = c, fc
            if side == 1:
                fb *= 0.5
            side = 1
    return math.exp(b) if b < math.log(hi) else hi


def _schedule_releases(
    noise_multipliers: np.ndarray, q: float, steps: int, sampling: str, population_size, drop_last: bool
) -> list[Release]:
    """One Release per distinct noise multiplier, its count the entries sharing it.

    Entry ``t`` is ``steps`` steps at ``noise_multipliers[t]``; for ``"shuffle"`` every
    entry starts a fresh permutation, so each costs ``shuffle_epochs(steps)`` Gaussians.
    """
    values, counts = np.unique(noise_multipliers, return_counts=True)
    releases = []
    for z, count in zip(values, counts):
        one = gaussian_steps_release(float(z), q, steps, sampling, population_size=population_size, drop_last=drop_last)
        releases.append(dataclasses.replace(one, count=one.count * int(count)))
    return releases


def _check_schedule(name: str, values: Any) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr <= 0):
        raise ValueError(f"{name} must be a non-empty 1-d sequence of positive finite numbers.")
    return arr


def schedule_epsilon(
    noise_multipliers: Sequence[float],
    sample_rate: float,
    delta: float,
    steps_per_entry: int = 1,
    sampling: str = "poisson",
    accountant: str = "rdp",
    *,
    population_size: int | None = None,
    drop_last: bool = True,
    orders: Sequence[float] | None = None,
    value_discretization_interval: float = 1e-4,
) -> float:
    """Epsilon of a noise schedule: entry ``t`` is ``steps_per_entry`` subsampled-Gaussian
    steps with noise multiplier ``noise_multipliers[t]`` (e.g. one entry per round)."""
    zs = _check_schedule("noise_multipliers", noise_multipliers)
    q = _check_sample_rate(sample_rate)
    steps = _check_int("steps_per_entry", steps_per_entry, minimum=1)
    sampling = _check_sampling(sampling)
    if population_size is not None:
        population_size = _check_int("population_size", population_size, minimum=1)
    releases = _schedule_releases(zs, q, steps, sampling, population_size, bool(drop_last))
    return _epsilon_of(
        releases, _check_delta(delta), _check_accountant(accountant), _check_orders(orders),
        _check_vdi(value_discretization_interval),
    )


def calibrate_noise_schedule(
    shape: Sequence[float],
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps_per_entry: int = 1,
    sampling: str = "poisson",
    accountant: str = "rdp",
    *,
    population_size: int | None = None,
    drop_last: bool = True,
    orders: Sequence[float] | None = None,
    value_discretization_interval: float = 1e-4,
    rtol: float = 1e-4,
    max_noise_multiplier: float = 1e6,
    min_noise_multiplier: float = 1e-3,
) -> np.ndarray:
    """Noise multipliers ``z_t = s * shape_t / min(shape)`` with the smallest scale ``s``
    whose :func:`schedule_epsilon` is <= ``target_epsilon``.

    The schedule's *shape* (e.g. a chapter-2 dynamic schedule, decaying over rounds)
    is kept and the accountant of the sampling actually used decides its overall
    level, so the budget is spent exactly by the last entry (spec 000 §1.8 mode (i),
    with a tight subsampled-Gaussian accountant in place of the zCDP sum).
    ``min_noise_multiplier`` / ``max_noise_multiplier`` bound the smallest entry ``s``.

    Each distinct value costs one accountant evaluation per trial scale (about 0.2 s
    for RDP, 0.7 s for PLD), so quantise long shapes first
    (:func:`fedveil.privacy.schedules.quantise_shape`).  The search starts from the
    constant schedule of the same total Gaussian cost (``1/z^2`` averaged), which
    is exact for unsampled Gaussians and close for subsampled ones.
    """
    base = _check_schedule("shape", shape)
    base = base / base.min()
    target = _check_positive("target_epsilon", target_epsilon)
    delta = _check_delta(delta)
    q = _check_sample_rate(sample_rate)
    steps = _check_int("steps_per_entry", steps_per_entry, minimum=1)
    sampling = _check_sampling(sampling)
    kind = _check_accountant(accountant)
    orders_t = _check_orders(orders)
    vdi = _check_vdi(value_discretization_interval)
    rtol = _check_positive("rtol", rtol)
    z_max = _check_positive("max_noise_multiplier", max_noise_multiplier)
    z_min = _check_positive("min_noise_multiplier", min_noise_multiplier)
    if z_min >= z_max:
        raise ValueError("min_noise_multiplier must be smaller than max_noise_multiplier.")
    if population_size is not None:
        population_size = _check_int("population_size", population_size, minimum=1)

    def eps_of(scale: float) -> float:
        releases = _schedule_releases(scale * base, q, steps, sampling, population_size, bool(drop_last))
        return _epsilon_of(releases, delta, kind, orders_t, vdi)

    total_steps = base.size * steps
    constant = _calibrate_cached(target, delta, q, total_steps, sampling, kind, population_size, bool(drop_last),
                                 orders_t, vdi, rtol, z_max, z_min)
    guess = constant * math.sqrt(np.mean(base**-2.0))
    scale = _solve_noise(eps_of, target, delta, z_min, z_max, rtol, start=guess, factor=1.02)
    return scale * base


def gaussian_std(noise_multiplier: float, clip: float, cohort_size: int) -> float:
    """Std of the noise on the *averaged* update in client-level DP (DP-FedAvg).

    Each sampled client's update is clipped to L2 norm ``clip`` = C, the server
    adds ``N(0, (z C)^2 I)`` to the sum and divides by the (fixed, expected)
    cohort size ``m``: the average carries noise of std ``z * C / m``.  Account it
    with ``record_gaussian_steps("population", z, m / num_clients, rounds)``.
    """
    z = _check_positive("noise_multiplier", noise_multiplier, allow_zero=True)
    c = _check_positive("clip", clip)
    m = _check_int("cohort_size", cohort_size, minimum=1)
    return z * c / m


# --------------------------------------------------------------------------- ledger


class _SubjectState:
    __slots__ = ("releases", "keys", "relations", "relation", "rdp", "pld", "eps_cache")

    def __init__(self) -> None:
        self.releases: list[Release] = []
        self.keys: list[str] = []
        self.relations = _ALL_RELATIONS
        self.relation = _resolve_relation(_ALL_RELATIONS)
        self.rdp: np.ndarray | None = None
        self.pld = None
        self.eps_cache: dict[float, float] = {}


class PrivacyLedger:
    """Per-subject record of every noisy release, as dp_accounting DpEvents.

    A *subject* is whoever the guarantee protects: a silo / client id for
    example-level (silo-specific) DP, where each silo's epsilon covers its own
    examples only (spec 002 Def 1.3.1), or :attr:`POPULATION` for client-level
    DP.  Subjects are accounted independently.  Each subject's releases must
    share a neighbouring relation (see module doc); mixing, e.g., ``"fixed"``
    (replace-one) with ``"poisson"`` (add/remove) raises ``ValueError``.

    RDP ledgers keep each subject's RDP curve as a running sum (one cached
    curve per distinct event), so recording and querying every round is cheap;
    PLD ledgers compose each record into a per-subject ``PLDAccountant``.  The
    state (:meth:`state_dict`) is plain JSON-compatible data; loading it
    rebuilds the same events in the same order and gives identical epsilons.
    """

    POPULATION = "population"
    STATE_FORMAT = "fedveil.PrivacyLedger"
    STATE_VERSION = 1

    def __init__(
        self,
        accountant: str = "rdp",
        *,
        orders: Sequence[float] | None = None,
        value_discretization_interval: float = 1e-4,
    ) -> None:
        self.accountant = _check_accountant(accountant)
        self.orders = _check_orders(orders)
        self.value_discretization_interval = _check_vdi(value_discretization_interval)
        self._subjects: dict[Subject, _SubjectState] = {}
        self._log: list[tuple[Subject, int]] = []  # (subject, index in its releases): global record order

    # ------------------------------------------------------------------ recording

    def record(
        self,
        subject: Subject,
        event: dp_event.DpEvent | Release,
        count: int = 1,
        *,
        relation: Any = None,
        label: str | None = None,
    ) -> None:
        """Record ``event`` (a DpEvent or a :class:`Release`) applied ``count`` times to ``subject``.

        A bare DpEvent's parameters must be stated for the subject's neighbouring
        relation (e.g. a ``GaussianDpEvent``'s noise multiplier is std /
        sensitivity under that relation); ``relation`` restricts the relations
        the event is valid under.
        """
        subject = _check_subject(subject)
        count = _check_int("count", count)
        if isinstance(event, Release):
            release = dataclasses.replace(event, count=event.count * count, label=label or event.label)
        elif isinstance(event, dp_event.DpEvent):
            release = Release(event, count, label=label)
        else:
            raise ValueError(f"record() needs a dp_accounting DpEvent or a Release; got {event!r}.")
        if relation is not None:
            rel = _relation_from_any(relation)
            if rel not in release.relations:
                raise ValueError(
                    f"{release.label or type(release.event).__name__} is not valid under {rel.name}; "
                    f"valid under {_relation_names(release.relations)}."
                )
            release = dataclasses.replace(release, relations=frozenset({rel}))
        self._add(subject, release)

    def record_gaussian_steps(
        self,
        subject: Subject,
        noise_multiplier: float,
        sample_rate: float,
        steps: int,
        sampling: str = "poisson",
        *,
        population_size: int | None = None,
        drop_last: bool = True,
        label: str | None = None,
    ) -> None:
        """Record ``steps`` DP-SGD / DP-FedAvg steps (:func:`gaussian_steps_release`)."""
        release = gaussian_steps_release(
            noise_multiplier, sample_rate, steps, sampling, population_size=population_size, drop_last=drop_last
        )
        self.record(subject, release, label=label)

    def record_report_noisy_max(self, subject: Subject, epsilon_sel: float, count: int = 1, *, label: str | None = None) -> None:
        """Record ``count`` report-noisy-max selections, each ``epsilon_sel^2/8``-zCDP (RDP only)."""
        self.record(subject, report_noisy_max_release(epsilon_sel, count), label=label)

    def record_zcdp(self, subject: Subject, rho: float, count: int = 1, *, label: str | None = None) -> None:
        """Record ``count`` rho-zCDP releases (RDP only)."""
        self.record(subject, zcdp_release(rho, count), label=label)

    def _add(self, subject: Subject, release: Release) -> None:
        state = self._subjects.get(subject)
        new_state = state is None
        if new_state:
            state = _SubjectState()
        key = _event_key(release.event)
        adm = _admissible(self.accountant, release, key)
        if not adm:
            raise ValueError(_unsupported_message(self.accountant, release, release.relations))
        relations = state.relations & adm
        if not relations:
            raise ValueError(
                f"subject {subject!r}: cannot compose {release.label or type(release.event).__name__} (valid under "
                f"{_relation_names(adm)}) with its earlier releases (valid only under "
                f"{_relation_names(state.relations)}); their epsilons refer to different neighbouring relations. "
                "Use one sampling scheme per subject."
            )
        relation = _resolve_relation(relations)
        if relation != state.relation and state.releases:
            self._rebuild(state, relation, extra=(release, key))
        else:
            state.relation = relation
            self._compose_into(state, release, key)
        state.relations = relations
        state.releases.append(release)
        state.keys.append(key)
        state.eps_cache.clear()
        if new_state:
            self._subjects[subject] = state
        self._log.append((subject, len(state.releases) - 1))

    def _compose_into(self, state: _SubjectState, release: Release, key: str) -> None:
        if self.accountant == "rdp":
            if state.rdp is None:
                state.rdp = np.zeros(len(self.orders))
            if release.count:
                state.rdp = state.rdp + release.count * _rdp_unit(key, state.relation, self.orders)
        else:
            if state.pld is None:
                state.pld = _new_accountant("pld", state.relation, self.orders, self.value_discretization_interval)
            if release.count:
                state.pld.compose(release.event, release.count)

    def _rebuild(self, state: _SubjectState, relation: NeighboringRelation, extra: tuple[Release, str]) -> None:
        fresh = _SubjectState()
        fresh.relation = relation
        for rel, key in [*zip(state.releases, state.keys), extra]:
            self._compose_into(fresh, rel, key)
        state.relation, state.rdp, state.pld = relation, fresh.rdp, fresh.pld

    # ------------------------------------------------------------------ queries

    @property
    def subjects(self) -> list[Subject]:
        """Subjects with at least one record, in first-record order."""
        return list(self._subjects)

    def releases(self, subject: Subject) -> list[Release]:
        """The releases recorded for ``subject`` (empty for an unknown subject)."""
        state = self._subjects.get(_check_subject(subject))
        return [] if state is None else list(state.releases)

    def relation(self, subject: Subject) -> NeighboringRelation:
        """Neighbouring relation the subject's epsilon refers to."""
        state = self._subjects.get(_check_subject(subject))
        return _resolve_relation(_ALL_RELATIONS) if state is None else state.relation

    def epsilon(self, subject: Subject, delta: float) -> float:
        """Epsilon spent by ``subject`` at ``delta`` (0.0 if nothing was recorded)."""
        subject = _check_subject(subject)
        delta = _check_delta(delta)
        state = self._subjects.get(subject)
        if state is None:
            return 0.0
        cached = state.eps_cache.get(delta)
        if cached is None:
            if self.accountant == "rdp":
                cached = _rdp_epsilon(state.rdp, self.orders, delta)
            else:
                cached = float(state.pld.get_epsilon(delta))
            state.eps_cache[delta] = cached
        return cached

    def epsilons(self, delta: float) -> dict[Subject, float]:
        """``{subject: epsilon}`` for every subject with records."""
        return {s: self.epsilon(s, delta) for s in self._subjects}

    def epsilon_of(self, releases: Any, delta: float) -> float:
        """Epsilon of ``releases`` (Releases / DpEvents) composed afresh with this ledger's
        accountant configuration, e.g. a plan to compare the ledger with."""
        releases = _as_releases(releases)
        if not releases:
            return 0.0
        return _epsilon_of(releases, _check_delta(delta), self.accountant, self.orders, self.value_discretization_interval)

    def records_since(self, start: int) -> list[tuple[Subject, Release]]:
        """``(subject, release)`` of every record from the ``start``-th (0-based) on, in record order."""
        return [(subject, self._subjects[subject].releases[idx]) for subject, idx in self._log[start:]]

    def epsilon_with(self, subject: Subject, extra_events: Any, delta: float) -> float:
        """Epsilon ``subject`` would have after also recording ``extra_events`` (Releases / DpEvents)."""
        subject = _check_subject(subject)
        delta = _check_delta(delta)
        extras = _as_releases(extra_events)
        state = self._subjects.get(subject)
        releases = ([] if state is None else state.releases) + extras
        if not releases:
            return 0.0
        if state is None:
            return _epsilon_of(releases, delta, self.accountant, self.orders, self.value_discretization_interval)
        keys = [_event_key(r.event) for r in extras]
        relation = _combined_relation(self.accountant, [*state.releases, *extras], [*state.keys, *keys])
        if relation != state.relation:
            return _epsilon_of(releases, delta, self.accountant, self.orders, self.value_discretization_interval)
        if self.accountant == "rdp":
            vec = state.rdp
            for rel, key in zip(extras, keys):
                if rel.count:
                    vec = vec + rel.count * _rdp_unit(key, relation, self.orders)
            return _rdp_epsilon(vec, self.orders, delta)
        acc = copy.deepcopy(state.pld)
        for rel in extras:
            if rel.count:
                acc.compose(rel.event, rel.count)
        return float(acc.get_epsilon(delta))

    def would_exceed(self, subject: Subject, extra_events: Any, target_epsilon: float, delta: float) -> bool:
        """True if recording ``extra_events`` would push ``subject`` above ``target_epsilon``.

        Call before a step to refuse it (DESIGN idea 3: stop before a budget is exceeded).
        """
        target = _check_positive("target_epsilon", target_epsilon)
        return self.epsilon_with(subject, extra_events, delta) > target

    def __len__(self) -> int:
        return len(self._log)

    def __repr__(self) -> str:
        return f"PrivacyLedger(accountant={self.accountant!r}, subjects={len(self._subjects)}, records={len(self)})"

    # ------------------------------------------------------------------ state

    def state_dict(self) -> dict:
        """Plain JSON-compatible state: config plus ``[subject, event, count, relations, label]`` records."""
        records = []
        for subject, idx in self._log:
            rel = self._subjects[subject].releases[idx]
            records.append(
                [
                    subject,
                    event_to_dict(rel.event),
                    rel.count,
                    [r.name for r in _RELATION_PREFERENCE if r in rel.relations],
                    rel.label,
                ]
            )
        return {
            "format": self.STATE_FORMAT,
            "version": self.STATE_VERSION,
            "accountant": self.accountant,
            "orders": list(self.orders),
            "value_discretization_interval": self.value_discretization_interval,
            "records": records,
        }

    @classmethod
    def from_state_dict(cls, state: Mapping) -> PrivacyLedger:
        """Build a ledger with the configuration and records stored in ``state``."""
        cls._check_state_header(state)
        ledger = cls(
            state["accountant"],
            orders=state["orders"],
            value_discretization_interval=state["value_discretization_interval"],
        )
        ledger._load_records(state["records"])
        return ledger

    def load_state_dict(self, state: Mapping) -> None:
        """Replace this ledger's records with those in ``state`` (same accountant config required)."""
        self._check_state_header(state)
        mismatches = []
        if state["accountant"] != self.accountant:
            mismatches.append(f"accountant {state['accountant']!r} != {self.accountant!r}")
        if tuple(float(a) for a in state["orders"]) != self.orders:
            mismatches.append("RDP orders differ")
        if float(state["value_discretization_interval"]) != self.value_discretization_interval:
            mismatches.append(
                f"value_discretization_interval {state['value_discretization_interval']} != "
                f"{self.value_discretization_interval}"
            )
        if mismatches:
            raise ValueError(
                "ledger state was saved with a different accountant configuration ("
                + "; ".join(mismatches)
                + "); use PrivacyLedger.from_state_dict(state) to restore it as saved."
            )
        fresh = PrivacyLedger(self.accountant, orders=self.orders, value_discretization_interval=self.value_discretization_interval)
        fresh._load_records(state["records"])
        self._subjects, self._log = fresh._subjects, fresh._log

    @classmethod
    def _check_state_header(cls, state: Any) -> None:
        if not isinstance(state, Mapping) or state.get("format") != cls.STATE_FORMAT:
            raise ValueError("not a PrivacyLedger state (missing or wrong 'format' field).")
        if state.get("version") != cls.STATE_VERSION:
            raise ValueError(f"unsupported PrivacyLedger state version {state.get('version')!r}.")
        missing = [k for k in ("accountant", "orders", "value_discretization_interval", "records") if k not in state]
        if missing:
            raise ValueError(f"PrivacyLedger state lacks field(s) {missing}.")

    def _load_records(self, records: Any) -> None:
        for i, rec in enumerate(records):
            if not isinstance(rec, (list, tuple)) or len(rec) != 5:
                raise ValueError(f"ledger record {i} is malformed: {rec!r}.")
            subject, event, count, relations, label = rec
            release = Release(event_from_dict(event), count, frozenset(_relation_from_any(r) for r in relations), label)
            self._add(_check_subject(subject), release)
