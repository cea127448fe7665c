"""Noisy releases as ``dp_accounting`` DpEvents: the :class:`Release` type, the releases of
DP-SGD / DP-FedAvg steps under each sampling scheme, and their JSON (de)serialisation.

Spec 002 section 1.3 (sampled Gaussian mechanism) and section 1.4 (report-noisy-max
selection cost); DESIGN.md idea 3 (every release is an event in a ledger).

Noise-multiplier convention (same as opacus, tf-privacy and
``dp_accounting.GaussianDpEvent``): per-unit contributions (per-example
gradients, or per-client updates) are clipped to L2 norm ``C``, summed, and
Gaussian noise with standard deviation ``z * C`` is added; ``z`` is the noise
multiplier.  Dividing by a fixed batch / cohort size afterwards is
post-processing.

Sampling schemes and the neighbouring relation each is accounted under
(:func:`fedveil.privacy.relations.sampling_relation` returns it):

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
"""
from __future__ import annotations

import dataclasses
import json
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

import attr
from dp_accounting import dp_event

from . import checks
from .relations import ALL_RELATIONS, SAMPLING_RELATIONS, Sampling, as_sampling, parse_relation
from .skellam import FEDVEIL_EVENTS

__all__ = [
    "Release",
    "gaussian_steps_release",
    "report_noisy_max_release",
    "gaussian_std",
    "shuffle_epochs",
    "as_releases",
    "event_to_dict",
    "event_from_dict",
    "event_key",
    "check_sample_rate",
]


# --------------------------------------------------------------------------- (de)serialisation


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
    cls = FEDVEIL_EVENTS.get(str(data["type"])) or getattr(dp_event, str(data["type"]), None)
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


def event_key(event: dp_event.DpEvent) -> str:
    """Canonical JSON of ``event``: equal events have equal keys (a cache key)."""
    return json.dumps(event_to_dict(event), sort_keys=True)


# --------------------------------------------------------------------------- releases


@dataclasses.dataclass(frozen=True)
class Release:
    """One accountable noisy release: ``event`` composed ``count`` times.

    ``relations`` is the set of neighbouring relations under which the event's
    parameters are correct (e.g. shuffling is accounted under zero-out only).
    """

    event: dp_event.DpEvent
    count: int = 1
    relations: frozenset = ALL_RELATIONS
    label: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.event, dp_event.DpEvent):
            raise ValueError(f"Release.event must be a dp_accounting DpEvent; got {self.event!r}.")
        object.__setattr__(self, "count", checks.integer("count", self.count))
        rels = frozenset(parse_relation(r) for r in self.relations)
        if not rels:
            raise ValueError("Release.relations must name at least one neighbouring relation.")
        object.__setattr__(self, "relations", rels)


def as_releases(extra: Any) -> list[Release]:
    """A list of Releases from a Release, a DpEvent, an ``(event, count)`` pair, a sequence of them, or None."""
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


def _batch_size(sample_rate: float, population_size: int) -> int:
    exact = sample_rate * population_size
    b = int(round(exact))
    if b < 1 or abs(exact - b) > 1e-6 * max(1.0, exact):
        raise ValueError(
            f"sample_rate * population_size = {sample_rate} * {population_size} = {exact:.6g} is not a whole batch "
            "size; pass sample_rate = batch_size / population_size exactly."
        )
    return b


def shuffle_epochs(steps: int, population_size: int, batch_size: int, drop_last: bool = True) -> int:
    """Most times one example can be used in ``steps`` steps of epoch-wise shuffling.

    ``ceil(steps / steps_per_epoch)`` with ``steps_per_epoch = n // B`` (drop_last)
    or ``ceil(n / B)``; a partial epoch counts as a full one.
    """
    steps = checks.integer("steps", steps)
    n = checks.integer("population_size", population_size, minimum=1)
    b = checks.integer("batch_size", batch_size, minimum=1)
    if b > n:
        raise ValueError(f"batch_size {b} exceeds population_size {n}.")
    per_epoch = n // b if drop_last else -(-n // b)
    return -(-steps // per_epoch)


def check_sample_rate(sample_rate: Any) -> float:
    """``q`` in (0, 1]."""
    return checks.fraction("sample_rate", sample_rate, one=True, hint=" (batch size / population size)")


def gaussian_steps_release(
    noise_multiplier: float, sample_rate: float, steps: int, sampling: Sampling | str = "poisson"
) -> Release:
    """The Release for ``steps`` steps of a (sub)sampled Gaussian mechanism (see module doc);
    a plain ``sampling`` string is that scheme without a population."""
    z = checks.positive("noise_multiplier", noise_multiplier)
    q = check_sample_rate(sample_rate)
    steps = checks.integer("steps", steps)
    sampling = as_sampling(sampling)
    relations = SAMPLING_RELATIONS[sampling.scheme]
    if sampling.scheme == "full" and q != 1.0:
        raise ValueError(f"sampling='full' uses every example in every step; sample_rate must be 1.0, got {q}.")
    if sampling.scheme in ("poisson", "full"):
        event = dp_event.GaussianDpEvent(z) if q == 1.0 else dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z))
        return Release(event, steps, relations, label=f"gaussian/{sampling.scheme}")
    n = sampling.population_size
    b = _batch_size(q, n)
    if sampling.scheme == "fixed":
        # Replace-one L2 sensitivity of a sum of vectors clipped to C is 2C: noise multiplier z/2.
        event = dp_event.SampledWithoutReplacementDpEvent(n, b, dp_event.GaussianDpEvent(z / 2.0))
        return Release(event, steps, relations, label="gaussian/fixed")
    epochs = shuffle_epochs(steps, n, b, sampling.drop_last)
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
    eps = checks.positive("epsilon_sel", epsilon_sel)
    return Release(dp_event.ZCDpEvent(rho=eps * eps / 8.0), checks.integer("count", count), label="report_noisy_max")


def gaussian_std(noise_multiplier: float, clip: float, cohort_size: int) -> float:
    """Std of the noise on the *averaged* update in client-level DP (DP-FedAvg).

    Each sampled client's update is clipped to L2 norm ``clip`` = C, the server
    adds ``N(0, (z C)^2 I)`` to the sum and divides by the (fixed, expected)
    cohort size ``m``: the average carries noise of std ``z * C / m``.  Account it
    with ``record_gaussian_steps("population", z, m / num_clients, rounds)``.
    """
    z = checks.positive("noise_multiplier", noise_multiplier, allow_zero=True)
    c = checks.positive("clip", clip)
    m = checks.integer("cohort_size", cohort_size, minimum=1)
    return z * c / m
