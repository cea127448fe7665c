"""MR-MTL for private federated mean estimation (Liu, thesis §1.6, App. D and E; spec 002 §3).

Model: silo ``k`` of ``K`` holds ``n`` scalars ``x_{k,i} = w_k + N(0, sigma^2)`` around its centre
``w_k = theta + N(0, tau^2)`` (``tau``: heterogeneity). Each silo releases its clipped sum plus
``N(0, sigma_dp^2)`` (silo-specific example-level DP), so its local estimate ``w_hat_k`` has
variance ``sigma_loc^2 = sigma^2/n + sigma_dp^2/n^2`` (1.9). MR-MTL with regularisation ``lam``
returns ``w_hat_k/(1+lam) + lam * w_bar/(1+lam)`` (1.8): ``lam = 0`` is local training,
``lam = inf`` is FedAvg. The functions below are the closed forms of its expected squared error
``E(lam) = E[(w_hat_k(lam) - w_k)^2]``, the optimal ``lam``, the privacy cost, the per-silo
optimum for heterogeneous silos (App. D.5), the cost of tuning ``lam`` privately with a
truncated-negative-binomial number of runs (App. E), and a Monte-Carlo simulation to check them.

Every ``lam`` argument may be a scalar or an array and may be ``inf``; every ``sigma_loc2`` is a
variance (squared), every ``sigma``/``tau``/``sigma_dp`` a standard deviation.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import optimize

from ..privacy import checks
from ..privacy.calibration import calibrate_noise
from ..privacy.composition import DEFAULT_ORDERS, Accountant

__all__ = [
    "local_variance",
    "optimal_lambda",
    "local_weight",
    "mrmtl_error",
    "optimal_error",
    "local_error",
    "fedavg_error",
    "local_gap",
    "fedavg_gap",
    "privacy_cost",
    "per_silo_optimal_lambdas",
    "per_silo_mrmtl_errors",
    "gaussian_sigma_dp",
    "mrmtl_estimates",
    "MonteCarloErrors",
    "simulate_mean_estimation",
    "tnb_expected_runs",
    "tnb_gamma",
    "tnb_tuning_rdp",
    "tuned_gaussian_sigma_dp",
]


# --------------------------------------------------------------------------- validation


def _lambdas(lam) -> np.ndarray:
    arr = np.asarray(lam, dtype=float)
    if np.isnan(arr).any() or (arr < 0).any():
        raise ValueError(f"lam must be >= 0 (inf allowed: FedAvg); got {lam!r}.")
    return arr


def _same_shape(result: np.ndarray):
    """A float for scalar input, else the array."""
    return float(result) if np.ndim(result) == 0 else result


# --------------------------------------------------------------------------- closed forms (§1.6)


def local_variance(sigma: float, n: int, sigma_dp: float = 0.0) -> float:
    """Variance of a silo's private local mean, (1.9): ``sigma_loc^2 = sigma^2/n + sigma_dp^2/n^2``."""
    sigma = checks.positive("sigma", sigma)
    n = checks.integer("n", n, minimum=1)
    sigma_dp = checks.positive("sigma_dp", sigma_dp, allow_zero=True)
    return sigma**2 / n + sigma_dp**2 / n**2


def optimal_lambda(sigma_loc2: float, tau: float) -> float:
    """Theorem 1.6.3 (1.11): ``lam* = sigma_loc^2 / tau^2`` (the Bayes-optimal MR-MTL)."""
    return checks.positive("sigma_loc2", sigma_loc2) / checks.positive("tau", tau) ** 2


def local_weight(lam):
    """Weight ``1/(1+lam)`` of the silo's own estimate in ``w_hat_k(lam)`` (1.8); 0 at ``lam = inf``."""
    return _same_shape(1.0 / (1.0 + _lambdas(lam)))


def mrmtl_error(lam, sigma_loc2: float, tau: float, K: int):
    """Lemma 1.6.7 (1.15): ``E(lam) = (1 - 1/K)(sigma_loc^2 + lam^2 tau^2)/(lam+1)^2 + sigma_loc^2/K``.

    Written with ``a = 1/(1+lam)`` as ``(1 - 1/K)(a^2 sigma_loc^2 + (1-a)^2 tau^2) + sigma_loc^2/K``
    so that ``lam = inf`` gives FedAvg's error (1.14).
    """
    s2, t2 = checks.positive("sigma_loc2", sigma_loc2), checks.positive("tau", tau) ** 2
    K = checks.integer("K", K, minimum=2)
    a = np.asarray(local_weight(lam))
    return _same_shape((1 - 1 / K) * (a**2 * s2 + (1 - a) ** 2 * t2) + s2 / K)


def optimal_error(sigma_loc2: float, tau: float, K: int) -> float:
    """Corollary 1.6.4 (1.12): ``E* = sigma_loc^2 (sigma_loc^2 + K tau^2) / (K (sigma_loc^2 + tau^2))``."""
    s2, t2 = checks.positive("sigma_loc2", sigma_loc2), checks.positive("tau", tau) ** 2
    K = checks.integer("K", K, minimum=2)
    return s2 * (s2 + K * t2) / (K * (s2 + t2))


def local_error(sigma_loc2: float) -> float:
    """Proposition 1.6.5 (1.13): local training's error ``E_loc = sigma_loc^2``."""
    return checks.positive("sigma_loc2", sigma_loc2)


def fedavg_error(sigma_loc2: float, tau: float, K: int) -> float:
    """Proposition 1.6.6 (1.14): FedAvg's error ``E_fed = (sigma_loc^2 + (K-1) tau^2) / K``."""
    s2, t2 = checks.positive("sigma_loc2", sigma_loc2), checks.positive("tau", tau) ** 2
    K = checks.integer("K", K, minimum=2)
    return (s2 + (K - 1) * t2) / K


def local_gap(sigma_loc2: float, tau: float, K: int) -> float:
    """Proposition 1.6.5 (1.13): ``Delta_loc = E_loc - E* = (1 - 1/K) sigma_loc^4 / (sigma_loc^2 + tau^2)``."""
    s2, t2 = checks.positive("sigma_loc2", sigma_loc2), checks.positive("tau", tau) ** 2
    K = checks.integer("K", K, minimum=2)
    return (1 - 1 / K) * s2**2 / (s2 + t2)


def fedavg_gap(sigma_loc2: float, tau: float, K: int) -> float:
    """Proposition 1.6.6 (1.14): ``Delta_fed = E_fed - E* = (1 - 1/K) tau^4 / (sigma_loc^2 + tau^2)``."""
    s2, t2 = checks.positive("sigma_loc2", sigma_loc2), checks.positive("tau", tau) ** 2
    K = checks.integer("K", K, minimum=2)
    return (1 - 1 / K) * t2**2 / (s2 + t2)


def privacy_cost(lam, sigma_dp: float, n: int, K: int):
    """Theorem 1.6.8 (1.16): ``E^DP(lam) - E(lam) = (1 - 1/K) sigma_dp^2/((lam+1)^2 n^2) + sigma_dp^2/(K n^2)``.

    It falls from ``sigma_dp^2/n^2`` (local, ``lam = 0``) to ``sigma_dp^2/(K n^2)`` (FedAvg, ``lam = inf``).
    """
    extra = checks.positive("sigma_dp", sigma_dp, allow_zero=True) ** 2 / checks.integer("n", n, minimum=1) ** 2
    K = checks.integer("K", K, minimum=2)
    a = np.asarray(local_weight(lam))
    return _same_shape((1 - 1 / K) * a**2 * extra + extra / K)


# --------------------------------------------------------------------------- heterogeneous silos (App. D.5)


def _silo_variances(sigma_tilde2) -> np.ndarray:
    s = checks.positive_vector("sigma_tilde2", sigma_tilde2)
    if len(s) < 2:
        raise ValueError(f"sigma_tilde2 must hold the variances of K >= 2 silos; got {sigma_tilde2!r}.")
    return s


def _external_variance(s: np.ndarray, t2: float) -> np.ndarray:
    """(D.26): variance of ``w_hat_{\\k} - w_k`` = ``K tau^2/(K-1) + sum_{j!=k} sigma~_j^2/(K-1)^2``."""
    K = len(s)
    return K * t2 / (K - 1) + (s.sum() - s) / (K - 1) ** 2


def per_silo_optimal_lambdas(sigma_tilde2, tau: float) -> np.ndarray:
    """Theorem D.5.2 (D.30): ``lam_k* = sigma~_k^2 / (tau^2 + (sum_{j!=k} sigma~_j^2/(K-1) - sigma~_k^2)/K)``.

    ``sigma_tilde2[k] = sigma_k^2/n_k + sigma_{k,DP}^2/n_k^2`` (D.22). Where the denominator is
    ``<= 0`` (``sigma~_k^2 >= K tau^2 + sum_{j!=k} sigma~_j^2/(K-1)``) the Bayes-optimal weight on the
    silo's own estimate is below ``1/K``, which no ``lam >= 0`` reaches; the error is then smallest at
    the boundary ``lam = inf`` (FedAvg), which is returned. With equal variances this is (1.11).
    """
    s, t2 = _silo_variances(sigma_tilde2), checks.positive("tau", tau) ** 2
    K = len(s)
    denominator = t2 + ((s.sum() - s) / (K - 1) - s) / K
    with np.errstate(divide="ignore"):
        return np.where(denominator > 0, s / np.where(denominator > 0, denominator, 1.0), np.inf)


def per_silo_mrmtl_errors(lam, sigma_tilde2, tau: float) -> np.ndarray:
    """Expected error of each silo's MR-MTL estimate, from (D.23)-(D.26) and Lemma 1.6.1 (1.8).

    ``E_k(lam) = alpha^2 sigma~_k^2 + (1 - alpha)^2 V_k`` with ``alpha = (K + lam)/((1 + lam) K)`` and
    ``V_k`` the variance (D.26) of ``w_hat_{\\k}`` around ``w_k``. ``lam`` is a scalar (shared by all
    silos) or one value per silo; returns one error per silo. Minimised at (D.30).
    """
    s, t2 = _silo_variances(sigma_tilde2), checks.positive("tau", tau) ** 2
    K = len(s)
    lam = _lambdas(lam)
    if lam.ndim > 1 or (lam.ndim == 1 and len(lam) != K):
        raise ValueError(f"lam must be a scalar or one value per silo (K={K}); got shape {lam.shape}.")
    a = np.asarray(local_weight(lam))
    alpha = a + (1 - a) / K  # = (K + lam)/((1 + lam) K)
    return alpha**2 * s + (1 - alpha) ** 2 * _external_variance(s, t2)


# --------------------------------------------------------------------------- privacy noise


def gaussian_sigma_dp(epsilon: float, delta: float, clip: float, orders: Sequence[float] | None = None) -> float:
    """Noise std ``sigma_dp = clip * z`` of ONE (epsilon, delta)-DP Gaussian release of a clipped sum.

    ``z`` is calibrated with the RDP accountant (:func:`fedveil.privacy.calibration.calibrate_noise`,
    full batch ``q = 1``, one step), as [C1] ``plot_hparam_cost.py`` does for Fig. 1.7 (spec 002 §3),
    not with the classic ``sqrt(2 ln(1.25/delta))/epsilon``. ``orders`` default to the accountant's.
    (epsilon, delta) = (0.25, 1e-5) gives ``z = 14.567``.
    """
    clip = checks.positive("clip", clip)
    return clip * calibrate_noise(epsilon, delta, 1.0, 1, "full", Accountant("rdp", orders))


# --------------------------------------------------------------------------- Monte-Carlo ([C1] plot_hparam_cost.py)


def mrmtl_estimates(w_hat: np.ndarray, lam) -> np.ndarray:
    """(1.8): ``w_hat_k(lam) = w_hat_k/(1+lam) + lam w_bar/(1+lam)`` with ``w_bar`` the mean over silos.

    ``w_hat`` has silos on its last axis; ``lam`` broadcasts against it (e.g. shape ``(L, 1, 1)`` for
    ``L`` shared values or ``(L, 1, K)`` for per-silo values).
    """
    w_hat = np.asarray(w_hat, dtype=float)
    a = np.asarray(local_weight(lam))
    return a * w_hat + (1 - a) * w_hat.mean(axis=-1, keepdims=True)


@dataclass(frozen=True)
class MonteCarloErrors:
    """Squared errors ``(w_hat_k(lam) - w_k)^2`` of :func:`simulate_mean_estimation`, one entry per ``lam``.

    ``mean``: over trials and silos; ``silo_std``: std over silos of the per-silo trial mean ([C1]'s
    error band); ``standard_error``: std over trials of the silo mean / sqrt(trials) (the Monte-Carlo
    uncertainty of ``mean``); ``per_silo``: mean over trials, shape ``(L, K)``; ``per_trial``: mean
    over silos, shape ``(L, trials)`` (for paired comparisons of runs sharing their random numbers).
    """

    lambdas: np.ndarray
    mean: np.ndarray
    silo_std: np.ndarray
    standard_error: np.ndarray
    per_silo: np.ndarray
    per_trial: np.ndarray


def simulate_mean_estimation(
    K: int,
    n: int,
    sigma: float,
    tau: float,
    sigma_dp,
    clip: float,
    lambdas,
    trials: int,
    rng: np.random.Generator,
    theta: float = 0.0,
) -> MonteCarloErrors:
    """Monte-Carlo of the §1.6 model as in [C1] ``plot_hparam_cost.py`` (all trials at once).

    Draws ``w_k ~ N(theta, tau^2)``, ``x_{k,i} ~ N(w_k, sigma^2)``, clips each point to
    ``x min(1, clip/|x|)`` (``clip = inf``: no clipping), releases ``w_hat_k = (sum_i clip(x_{k,i}) +
    N(0, sigma_dp^2))/n`` and scores ``w_hat_k(lam)`` (1.8) against ``w_k``. ``sigma_dp`` is a scalar
    or one value per silo (silo-specific budgets); ``lambdas`` is 1-D (shared by all silos) or
    ``(L, K)`` (per-silo values). The same draws serve every ``lam`` (common random numbers), and
    two calls with equally seeded generators draw the same centres, points and unit DP noise.
    """
    K, n = checks.integer("K", K, minimum=2), checks.integer("n", n, minimum=1)
    trials = checks.integer("trials", trials, minimum=2)
    sigma, tau = checks.positive("sigma", sigma), checks.positive("tau", tau)
    clip = checks.positive("clip", clip, allow_inf=True)
    noise = np.asarray(sigma_dp, dtype=float)
    if noise.shape not in ((), (K,)) or not np.isfinite(noise).all() or (noise < 0).any():
        raise ValueError(f"sigma_dp must be a finite std >= 0 or K={K} of them; got {sigma_dp!r}.")
    lam = _lambdas(lambdas)
    if lam.ndim not in (1, 2) or (lam.ndim == 2 and lam.shape[1] != K):
        raise ValueError(f"lambdas must have shape (L,) or (L, K={K}); got {lam.shape}.")
    lam_b = lam.reshape(len(lam), 1, -1)  # (L, 1, 1) or (L, 1, K)

    centres = rng.normal(theta, tau, size=(trials, K))
    points = rng.normal(centres[..., None], sigma, size=(trials, K, n))
    if math.isfinite(clip):
        points = points * np.minimum(1.0, clip / np.abs(points))
    w_hat = (points.sum(axis=-1) + rng.normal(0.0, 1.0, size=(trials, K)) * noise) / n
    errors = (mrmtl_estimates(w_hat, lam_b) - centres) ** 2  # (L, trials, K)
    per_silo, per_trial = errors.mean(axis=1), errors.mean(axis=2)
    return MonteCarloErrors(
        lambdas=lam,
        mean=per_trial.mean(axis=1),
        silo_std=per_silo.std(axis=1),
        standard_error=per_trial.std(axis=1, ddof=1) / math.sqrt(trials),
        per_silo=per_silo,
        per_trial=per_trial,
    )


# --------------------------------------------------------------------------- cost of tuning lam (App. E)


def _tnb_eta(eta: float) -> float:
    eta = checks.real("eta", eta)
    if not math.isfinite(eta) or eta <= -1:
        raise ValueError(f"eta must be a finite number > -1 (Papernot & Steinke); got {eta!r}.")
    return eta


def tnb_expected_runs(eta: float, gamma: float) -> float:
    """Mean number of runs ``E[h]`` of the truncated negative binomial TNB(eta, gamma) (App. E.1).

    ``eta (1 - gamma) / (gamma (1 - gamma^eta))`` for ``eta != 0``; ``(1/gamma - 1)/log(1/gamma)`` for ``eta = 0``.
    """
    eta, gamma = _tnb_eta(eta), checks.fraction("gamma", gamma)
    if eta == 0:
        return (1 / gamma - 1) / math.log(1 / gamma)
    return eta * (1 - gamma) / (gamma * -math.expm1(eta * math.log(gamma)))


def tnb_gamma(expected_runs: float, eta: float) -> float:
    """The ``gamma`` with ``tnb_expected_runs(eta, gamma) == expected_runs`` (> 1; E[h] falls as gamma rises).

    [C1] minimises the squared gap on (1e-10, 1 - 1e-10); a root bracket is equivalent and exact.
    """
    target = checks.positive("expected_runs", expected_runs)
    if target <= 1:
        raise ValueError(f"expected_runs must be > 1 (h >= 1 always); got {expected_runs!r}.")
    eta = _tnb_eta(eta)
    return optimize.brentq(lambda g: tnb_expected_runs(eta, g) - target, 1e-12, 1 - 1e-9, xtol=1e-14, rtol=1e-12)


def tnb_tuning_rdp(orders: Sequence[float], rdp: Sequence[float], eta: float, gamma: float) -> np.ndarray:
    """Theorem E.1.2 (E.2): RDP curve of the best of ``h ~ TNB(eta, gamma)`` runs of an RDP mechanism.

    ``eps~(a1) = eps(a1) + (1+eta)(1 - 1/a2) eps(a2) + (1+eta) log(1/gamma)/a2 + log E[h]/(a1 - 1)``,
    minimised over ``a2`` on the same order grid (as [C1] does) for each ``a1``.
    """
    a = np.asarray(orders, dtype=float)
    r = np.asarray(rdp, dtype=float)
    if a.ndim != 1 or a.shape != r.shape or len(a) == 0 or (a <= 1).any() or (r < 0).any():
        raise ValueError("orders and rdp must be equal-length 1-D arrays with orders > 1 and rdp >= 0.")
    eta, gamma = _tnb_eta(eta), checks.fraction("gamma", gamma)
    second = np.min((1 + eta) * (1 - 1 / a) * r + (1 + eta) * math.log(1 / gamma) / a)
    return r + second + math.log(tnb_expected_runs(eta, gamma)) / (a - 1)


_Z_RANGE = (1e-3, 1e6)  # noise multipliers searched by tuned_gaussian_sigma_dp


def _tuned_epsilon(z: float, delta: float, eta: float, gamma: float, orders: np.ndarray) -> float:
    rdp = orders / (2 * z**2)  # one Gaussian release, q = 1 (spec 002 §1.3)
    eps, _ = rdp_privacy_accountant.compute_epsilon(orders, tnb_tuning_rdp(orders, rdp, eta, gamma), delta)
    return eps


def tuned_gaussian_sigma_dp(
    epsilon: float,
    delta: float,
    clip: float,
    expected_runs: float,
    eta: float,
    orders: Sequence[float] | None = None,
) -> float:
    """Noise std ``clip * z`` that keeps tuning ``lam`` over ``h ~ TNB(eta, gamma)`` runs (mean
    ``expected_runs``) of one Gaussian release (epsilon, delta)-DP in total: Theorem E.1.2 (E.2)
    then the RDP-to-DP conversion, solved for ``z`` (Fig. 1.7's "Private, TNB" curves)."""
    target, clip = checks.positive("epsilon", epsilon), checks.positive("clip", clip)
    delta = checks.fraction("delta", delta)
    gamma = tnb_gamma(expected_runs, eta)
    grid = np.asarray(DEFAULT_ORDERS if orders is None else orders, dtype=float)
    if (grid <= 1).any():
        raise ValueError("orders must all be > 1.")

    def excess(log_z: float) -> float:
        return _tuned_epsilon(math.exp(log_z), delta, eta, gamma, grid) - target

    lo, hi = math.log(_Z_RANGE[0]), math.log(_Z_RANGE[1])
    if excess(hi) > 0:
        raise ValueError(
            f"tuning with E[h]={expected_runs}, eta={eta} costs more than epsilon={target} even without noise "
            f"(the log E[h] and log(1/gamma) terms of (E.2) alone exceed it)."
        )
    return clip * math.exp(optimize.brentq(excess, lo, hi, xtol=1e-10))
