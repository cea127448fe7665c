"""Expected risk upper bounds of private GD under uniform and dynamic noise (Hong, dissertation Ch. 2).

For a ``kappa``-conditioned problem (``kappa = M/mu``, Eq. 2.5; contraction rate
``gamma = 1 - 1/kappa``, Eq. 2.6) and a budget of relative size ``alpha``, the ERUB of T
steps of GD is Eq. 2.9 under the uniform schedule (Thm 3) and its corrected dynamic-schedule
counterpart (Thm 4, spec 000 §1.4); the best T trades the optimisation term ``gamma^T``
against the noise term. The schedules themselves (the sigmas a run uses) are
:mod:`fedveil.privacy.schedules`.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from ..privacy import checks

__all__ = [
    "erub_uniform",
    "erub_dynamic",
    "best_T_uniform",
    "best_T_dynamic",
    "closed_form_T_uniform",
    "closed_form_T_dynamic",
]


def _rate(kappa: float) -> float:
    """gamma = 1 - 1/kappa (Eq. 2.6), kappa = M/mu >= 1 (Eq. 2.5)."""
    kappa = checks.real("kappa (condition number M/mu)", kappa)
    if not (math.isfinite(kappa) and kappa >= 1):
        raise ValueError(f"kappa (condition number M/mu) must be a finite number >= 1; got {kappa!r}.")
    return 1.0 - 1.0 / kappa


def erub_uniform(T: int | np.ndarray, alpha: float, kappa: float) -> np.ndarray | float:
    """Eq. 2.9: ``ERUB(T) = gamma^T + alpha kappa (1 - gamma^T) T`` under sigma_t^2 = T/R."""
    checks.positive("alpha", alpha)
    g, T = _rate(kappa), np.asarray(T, dtype=np.float64)
    return g**T + alpha * kappa * (1 - g**T) * T


def erub_dynamic(T: int | np.ndarray, alpha: float, kappa: float) -> np.ndarray | float:
    """ERUB under the dynamic schedule (spec §1.4): ``gamma^T + alpha ((1 - gamma^{T/2})/(1 - sqrt(gamma)))^2``."""
    checks.positive("alpha", alpha)
    g, T = _rate(kappa), np.asarray(T, dtype=np.float64)
    return g**T + alpha * ((1 - g ** (T / 2)) / (1 - math.sqrt(g))) ** 2


def _argmin_T(erub: Callable[[np.ndarray, float, float], np.ndarray], alpha: float, kappa: float) -> tuple[int, float]:
    """Integer argmin of a unimodal ERUB(T): widen the search range until the minimum is interior."""
    hi = 1024
    while True:
        values = erub(np.arange(1, hi + 1), alpha, kappa)
        best = int(np.argmin(values))
        if best + 1 < hi // 2:
            return best + 1, float(values[best])
        if hi >= 1 << 26:
            raise ValueError(f"no minimum of ERUB(T) below T = {hi} for alpha={alpha}, kappa={kappa}")
        hi *= 4


def best_T_uniform(alpha: float, kappa: float) -> tuple[int, float]:
    """(T, ERUB) minimising Eq. 2.9 over integer T (the closed-form T is order-level only)."""
    return _argmin_T(erub_uniform, alpha, kappa)


def best_T_dynamic(alpha: float, kappa: float) -> tuple[int, float]:
    """(T, ERUB) minimising the dynamic-schedule ERUB over integer T."""
    return _argmin_T(erub_dynamic, alpha, kappa)


def closed_form_T_uniform(alpha: float, kappa: float) -> int:
    """Thm 3: ``T = ceil(ln(1 + ln(1/gamma)/alpha) / ln(1/gamma))`` (order-level)."""
    alpha = checks.positive("alpha", alpha)
    g = _rate(kappa)
    if g == 0:
        raise ValueError("closed_form_T_uniform needs kappa > 1 (gamma = 0 makes ln(1/gamma) infinite)")
    lg = math.log(1 / g)
    return math.ceil(math.log1p(lg / alpha) / lg)


def closed_form_T_dynamic(alpha: float, kappa: float) -> int:
    """Thm 4: ``T = ceil(2 kappa ln(1 + 1/(kappa alpha)))`` (order-level)."""
    alpha = checks.positive("alpha", alpha)
    _rate(kappa)
    return math.ceil(2 * kappa * math.log1p(1 / (kappa * alpha)))
