"""Zero-concentrated DP (zCDP) <-> (epsilon, delta)-DP conversions.

Spec 000 part 1, section 1.2 (Hong, dissertation, Lemmas 3-4):

* Lemma 3: the Gaussian mechanism with noise multiplier sigma (std / L2
  sensitivity) is ``1 / (2 sigma^2)``-zCDP; zCDP composes additively (Lemma 2).
* Lemma 4: rho-zCDP implies ``(rho + 2 sqrt(rho ln(1/delta)), delta)``-DP.
* The dissertation's inverse of Lemma 4 (App. A.3, section 2.4.2) is printed as
  ``rho = eps + 2 ln(1/delta) + 2 sqrt(ln(1/delta) (eps + ln(1/delta)))``; the
  ``+`` before the square root is a **sign typo** (that rho is larger than eps).
  The correct inverse is ``rho = (sqrt(eps + ln(1/delta)) - sqrt(ln(1/delta)))^2``.
* The dissertation's step budget is ``R = 2 rho`` (step cost ``1/sigma_t^2`` with
  the factor 1/2 absorbed, Theorem 1: ``sum_t 1/sigma_t^2 <= R`` gives R/2-zCDP).

Check (spec section 1.9): (eps, delta) = (4, 1e-8) gives rho = 0.196352 and
R = 0.392704.
"""

from __future__ import annotations

import math

from . import checks

__all__ = [
    "rho_from_epsilon_delta",
    "epsilon_from_rho",
    "budget_from_rho",
    "rho_from_budget",
    "budget_from_epsilon_delta",
    "epsilon_from_budget",
    "gaussian_rho",
]


def rho_from_epsilon_delta(epsilon: float, delta: float) -> float:
    """Largest rho such that rho-zCDP implies (epsilon, delta)-DP via Lemma 4.

    Corrected inverse of Lemma 4 (the dissertation prints it with a sign typo):
    ``rho = (sqrt(eps + ln(1/delta)) - sqrt(ln(1/delta)))^2``.  Computed in the
    cancellation-free form ``eps^2 / (sqrt(eps + L) + sqrt(L))^2`` with
    ``L = ln(1/delta)``.
    """
    epsilon = checks.positive("epsilon", epsilon, allow_zero=True)
    log_inv_delta = -math.log(checks.fraction("delta", delta))
    return epsilon**2 / (math.sqrt(epsilon + log_inv_delta) + math.sqrt(log_inv_delta)) ** 2


def epsilon_from_rho(rho: float, delta: float) -> float:
    """Lemma 4: rho-zCDP implies ``(rho + 2 sqrt(rho ln(1/delta)), delta)``-DP."""
    rho = checks.positive("rho", rho, allow_zero=True, allow_inf=True)
    log_inv_delta = -math.log(checks.fraction("delta", delta))
    return rho + 2.0 * math.sqrt(rho * log_inv_delta)


def budget_from_rho(rho: float) -> float:
    """Dissertation budget ``R = 2 rho`` (constraint ``sum_t 1/sigma_t^2 <= R``, Thm 1)."""
    return 2.0 * checks.positive("rho", rho, allow_zero=True, allow_inf=True)


def rho_from_budget(budget: float) -> float:
    """Inverse of :func:`budget_from_rho`: ``rho = R / 2``."""
    return 0.5 * checks.positive("budget R", budget, allow_zero=True, allow_inf=True)


def budget_from_epsilon_delta(epsilon: float, delta: float) -> float:
    """``R = 2 rho(eps, delta)`` with the corrected Lemma-4 inverse."""
    return budget_from_rho(rho_from_epsilon_delta(epsilon, delta))


def epsilon_from_budget(budget: float, delta: float) -> float:
    """epsilon (Lemma 4) of a run that spent budget ``R = sum_t 1/sigma_t^2``."""
    return epsilon_from_rho(rho_from_budget(budget), delta)


def gaussian_rho(noise_multiplier: float) -> float:
    """Lemma 3: Gaussian mechanism with noise multiplier sigma is 1/(2 sigma^2)-zCDP."""
    sigma = checks.positive("noise_multiplier", noise_multiplier)
    return 1.0 / (2.0 * sigma**2)
