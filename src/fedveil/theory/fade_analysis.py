"""FADE's optimality analysis on discrete distributions (Hong, dissertation §3.4 and App. B.1;
spec 000 §2.5-2.6, spec 004 §1.6-1.7).

Two groups, one user each; user g participates in a round with probability ``alpha_g``
(xi_g ~ Bernoulli(alpha_g)). ``p1`` and ``p2`` are the distributions of the representation
``z = G(x)`` of the two groups over a finite set of z values. The expected discrepancy that the
encoder G minimises is Eq. 3.4,

    D~(p1, p2) = max_D  alpha1 E_p1[log D(z)] + alpha2 E_p2[log(1 - D(z))],

attained at the discriminator of Eq. 3.5, ``D*(z) = alpha1 p1(z) / (alpha1 p1(z) + alpha2 p2(z))``.
Thm 13: ``p1 = p2`` minimises it, with the value :func:`balanced_minimum`; in general
``D~ = alpha1 KL(p1 || m) + alpha2 KL(p2 || m) + balanced_minimum`` with
``m = (alpha1 p1 + alpha2 p2) / (alpha1 + alpha2)``. The dissertation prints the constant with
``+ (alpha1 + alpha2) log(alpha1 + alpha2)``; the sign is an erratum (spec 000 §2.5): with
``alpha1 = alpha2 = 1`` the correct minimum is the GAN value ``-2 log 2``. The two constants agree
only when ``alpha1 + alpha2 = 1``.

Expectations use the convention ``0 log 0 = 0``: a z value that a group never produces adds
nothing to that group's term, whatever D is there.
"""
from __future__ import annotations

import math

import numpy as np
from scipy.special import xlogy

from ..privacy import checks

__all__ = [
    "optimal_discriminator",
    "discrepancy",
    "balanced_minimum",
    "squared_discrepancy",
]

_SUM_TOLERANCE = 1e-8


# --------------------------------------------------------------------------- validation


def _distribution(name: str, p) -> np.ndarray:
    """A non-empty float64 array of finite numbers >= 0 summing to 1 (within 1e-8)."""
    try:
        arr = np.asarray(p, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an array of probabilities; got {checks.shown(p)}.") from None
    if arr.size == 0 or not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{name} must be a non-empty array of finite numbers >= 0; got {checks.shown(p)}.")
    total = float(arr.sum())
    if abs(total - 1.0) > _SUM_TOLERANCE:
        raise ValueError(f"{name} must sum to 1 (a probability distribution); its entries sum to {total!r}.")
    return arr


def _pair(p1, p2) -> tuple[np.ndarray, np.ndarray]:
    a, b = _distribution("p1", p1), _distribution("p2", p2)
    if a.shape != b.shape:
        raise ValueError(f"p1 and p2 must be over the same z values (same shape); got shapes {a.shape} and {b.shape}.")
    return a, b


def _rates(alpha1, alpha2) -> tuple[float, float]:
    return checks.positive("alpha1", alpha1), checks.positive("alpha2", alpha2)


def _discriminator(d, shape: tuple[int, ...]) -> np.ndarray:
    """A discriminator given by its value D(z) in [0, 1] at every z value."""
    try:
        arr = np.asarray(d, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"d must be an array of values in [0, 1]; got {checks.shown(d)}.") from None
    if arr.shape != shape:
        raise ValueError(f"d must give D(z) at every z value of p1 (shape {shape}); got shape {arr.shape}.")
    if not (np.all(np.isfinite(arr)) and np.all((arr >= 0) & (arr <= 1))):
        raise ValueError(
            f"d must take values in [0, 1] (D(z): the probability that z came from p1); got {checks.shown(d)}."
        )
    return arr


def _group_terms(p1: np.ndarray, p2: np.ndarray, d: np.ndarray) -> tuple[float, float]:
    """``(E_p1[log D], E_p2[log(1 - D)])`` with ``0 log 0 = 0``; ``-inf`` where a group's mass meets D = 0 or 1."""
    return float(xlogy(p1, d).sum()), float(xlogy(p2, 1.0 - d).sum())


# --------------------------------------------------------------------------- Eqs. 3.4-3.6, Thm 13


def optimal_discriminator(p1, p2, alpha1: float, alpha2: float) -> np.ndarray:
    """Eq. 3.5: ``D*(z) = alpha1 p1(z) / (alpha1 p1(z) + alpha2 p2(z))``, the D attaining Eq. 3.4.

    Where neither group puts mass (``p1(z) = p2(z) = 0``) D* does not affect the discrepancy;
    it is set to the prior ``alpha1 / (alpha1 + alpha2)``, the value D* takes wherever
    ``p1(z) = p2(z)``, so that ``p1 = p2`` gives a constant D*.
    """
    p1, p2 = _pair(p1, p2)
    a1, a2 = _rates(alpha1, alpha2)
    num, den = a1 * p1, a1 * p1 + a2 * p2
    prior = a1 / (a1 + a2)
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), prior)


def discrepancy(p1, p2, alpha1: float, alpha2: float, d=None) -> float:
    """Eq. 3.4 objective ``alpha1 E_p1[log D] + alpha2 E_p2[log(1 - D)]`` at ``D = d``.

    ``d`` (the discriminator's value at every z, in [0, 1]) defaults to D* (Eq. 3.5), which
    gives the maximum over D, i.e. the expected discrepancy ``D~(p1, p2)``. Any other ``d``
    gives a value no larger; ``-inf`` if ``d`` is 0 where p1 has mass or 1 where p2 has.
    """
    p1, p2 = _pair(p1, p2)
    a1, a2 = _rates(alpha1, alpha2)
    d = optimal_discriminator(p1, p2, a1, a2) if d is None else _discriminator(d, p1.shape)
    e1, e2 = _group_terms(p1, p2, d)
    return a1 * e1 + a2 * e2


def balanced_minimum(alpha1: float, alpha2: float) -> float:
    """Thm 13 minimum of ``D~`` over G (reached at ``p1 = p2``), with the corrected sign:
    ``alpha1 log alpha1 + alpha2 log alpha2 - (alpha1 + alpha2) log(alpha1 + alpha2)``.

    The dissertation prints ``+ (alpha1 + alpha2) log(alpha1 + alpha2)`` (erratum, spec 000 §2.5);
    ``alpha1 = alpha2 = 1`` gives ``-2 log 2``.
    """
    a1, a2 = _rates(alpha1, alpha2)
    return a1 * math.log(a1) + a2 * math.log(a2) - (a1 + a2) * math.log(a1 + a2)


def squared_discrepancy(p1, p2, alpha1: float, alpha2: float, d) -> float:
    """Eq. 3.6 discrepancy at ``D = d``: ``alpha1 E_p1[log D]^2 + alpha2 E_p2[log(1 - D)]^2``.

    Each group's expected log-likelihood (minus its BCE) is squared before weighting, so the
    D that *minimises* this value (the squared loss's discriminator) weighs a rarely
    participating group's large loss more than Eq. 3.4 does. The minimum over D has no closed
    form like Eq. 3.5, so ``d`` is required; ``inf`` where Eq. 3.4 is ``-inf``.
    """
    p1, p2 = _pair(p1, p2)
    a1, a2 = _rates(alpha1, alpha2)
    e1, e2 = _group_terms(p1, p2, _discriminator(d, p1.shape))
    return a1 * e1**2 + a2 * e2**2
