"""The Skellam mechanism: integer noise that secure aggregation can sum (distributed DP).

Agarwal, Kairouz & Liu 2021 ("The Skellam Mechanism for Differentially Private Federated
Learning", NeurIPS). The symmetric Skellam noise of variance ``mu`` is
``Poisson(mu/2) - Poisson(mu/2)`` per coordinate; it is integer (so it survives the modular
arithmetic of secure aggregation) and closed under summation: silos adding independent
``Sk(mu_i)`` shares give exactly ``Sk(sum_i mu_i)`` in the sum the server unmasks.

Privacy (their Thm 3.5 / Cor 3.6): adding ``Sk(mu)`` to an integer vector whose L2 and L1
sensitivities are ``D2`` and ``D1`` is (alpha, eps(alpha))-RDP for integer alpha > 1 with

    eps(alpha) <= alpha D2^2 / (2 mu) + min(((2 alpha - 1) D2^2 + 6 D1) / (4 mu^2), 3 D1 / (2 mu)).

At a fractional order the bound of the next integer order is used (a Renyi divergence
does not decrease with its order), so every order of the ledger's grid holds a valid bound.
The release is recorded as a :class:`SkellamDpEvent`, which only the RDP accountant
composes; the sensitivities hold under zero-out neighbours (a silo's update replaced by
zeros while the silo still adds its noise share), the relation it is valid under.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import attr
import numpy as np
from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation

__all__ = ["SkellamDpEvent", "SKELLAM_RELATIONS", "skellam_rdp", "skellam_event", "FEDVEIL_EVENTS"]

#: The relation a Skellam release's sensitivities are stated for (module docstring).
SKELLAM_RELATIONS = frozenset({NeighboringRelation.REPLACE_SPECIAL})


@attr.s(frozen=True, slots=True, auto_attribs=True)
class SkellamDpEvent(dp_event.DpEvent):
    """One release of the (summed) Skellam mechanism: per-coordinate noise ``variance``
    (mu, in the integer units of the released vector) on a vector whose L2 and L1
    sensitivities are ``l2_sensitivity`` and ``l1_sensitivity`` (same units)."""

    variance: float
    l2_sensitivity: float
    l1_sensitivity: float


#: fedveil's own DpEvent types, by class name (for the ledger's JSON).
FEDVEIL_EVENTS = {"SkellamDpEvent": SkellamDpEvent}


def skellam_event(variance: float, l2_sensitivity: float, l1_sensitivity: float) -> SkellamDpEvent:
    """A checked :class:`SkellamDpEvent` (positive finite variance and sensitivities; an integer
    vector's L1 norm lies between its L2 norm and its squared L2 norm)."""
    values = {"variance": variance, "l2_sensitivity": l2_sensitivity, "l1_sensitivity": l1_sensitivity}
    for name, value in values.items():
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"Skellam release: {name} must be a positive number; got {value!r}")
    if l1_sensitivity < l2_sensitivity * (1 - 1e-12):
        raise ValueError(f"Skellam release: l1_sensitivity {l1_sensitivity:g} is below l2_sensitivity {l2_sensitivity:g}")
    return SkellamDpEvent(float(variance), float(l2_sensitivity), float(l1_sensitivity))


def skellam_rdp(event: SkellamDpEvent, orders: Sequence[float]) -> np.ndarray:
    """The RDP bound of one release at each order (Agarwal et al. 2021, Thm 3.5; fractional
    orders take the bound of the next integer order)."""
    mu, d2, d1 = event.variance, event.l2_sensitivity, event.l1_sensitivity
    alpha = np.ceil(np.asarray(orders, dtype=np.float64) - 1e-12)
    gaussian = alpha * d2 * d2 / (2.0 * mu)
    correction = np.minimum(((2.0 * alpha - 1.0) * d2 * d2 + 6.0 * d1) / (4.0 * mu * mu), 3.0 * d1 / (2.0 * mu))
    return gaussian + correction
