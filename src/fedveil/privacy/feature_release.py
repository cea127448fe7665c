"""Privacy of a one-shot release of noisy per-record features: FedFed's shared
performance-sensitive features (Yang et al. NeurIPS 2023 §3.3, App. D; spec 003 §1.6).

Each record x (pixels in [0, 1], so ``||x|| <= M = sqrt(d)``) is released once as
``x_p = x_s + n``, ``n ~ N(0, sigma^2 I)``, with the per-record bound ``||x_s|| <= rho ||x||``
(FedFed's clip, :func:`~fedveil.models.fedfed.clip_to_fraction`). Two accountings are offered side by side:

* **Rigorous** (:func:`feature_releases`): the release of a record is a Gaussian mechanism
  of L2 sensitivity ``rho M`` under zero-out neighbours (the record replaced by a null
  record, whose sensitive part is 0; the data set's size is unchanged), so it is
  ``GaussianDpEvent(sigma / (rho M))``; several noisy copies of the same features (the
  official code shares two) compose as Gaussians. Re-using the released set over many
  rounds is post-processing and costs nothing more. The generator that splits x is
  trained on raw data without DP: this accounts the release given the generator, not the
  generator's own training (spec 003 §1.6, last remark).
* **The paper's formula** (:func:`paper_epsilon`, Lemma D.2 "loose analysis"):
  ``eps = rho sqrt(R log(1/delta)) / sigma`` with every constant and the data's scale
  dropped, composed over k clients by Thm 3.4 (:func:`kov_composition`). Printed for
  comparison only: it is not a guarantee.
"""
from __future__ import annotations

import math

from dp_accounting import dp_event

from scipy.optimize import brentq
from scipy.stats import norm

from . import checks
from .events import Release
from .relations import NeighboringRelation


def feature_releases(sigmas: list[float] | float, rho: float, max_norm: float) -> list[Release]:
    """The releases of one record's features: one Gaussian per noisy copy with std
    ``sigma``, sensitivity ``rho * max_norm`` (zero-out neighbours)."""
    sigmas = [sigmas] if isinstance(sigmas, (int, float)) else list(sigmas)
    sensitivity = checks.positive("rho", rho) * checks.positive("max_norm", max_norm)
    return [
        Release(dp_event.GaussianDpEvent(checks.positive("sigma", s) / sensitivity),
                relations=frozenset({NeighboringRelation.REPLACE_SPECIAL}), label="shared features")
        for s in sigmas
    ]


def release_epsilon(sigmas: list[float] | float, rho: float, max_norm: float, delta: float) -> float:
    """Rigorous epsilon at ``delta`` of a record's feature release: Gaussians compose into one
    of ``mu = sqrt(sum_i (rho M / sigma_i)^2)``, whose exact epsilon is the analytic Gaussian
    mechanism's (Balle & Wang 2018, Thm 8): the smallest eps with
    ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) <= delta``. The same value as the PLD
    accountant on :func:`feature_releases` (tested), without its cost at large epsilon."""
    sigmas = [sigmas] if isinstance(sigmas, (int, float)) else list(sigmas)
    sensitivity = checks.positive("rho", rho) * checks.positive("max_norm", max_norm)
    mu = math.sqrt(sum((sensitivity / checks.positive("sigma", s)) ** 2 for s in sigmas))
    delta = checks.fraction("delta", delta)

    def excess(eps: float) -> float:
        return math.exp(norm.logcdf(-eps / mu + mu / 2)) - math.exp(eps + norm.logcdf(-eps / mu - mu / 2)) - delta

    if excess(0.0) <= 0:
        return 0.0
    return float(brentq(excess, 0.0, mu * mu / 2 + 40 * mu + 40, xtol=1e-10))


def paper_epsilon(rho: float, sigma: float, rounds: int, delta: float) -> float:
    """Lemma D.2's per-client epsilon as printed ("loose analysis"): ``rho sqrt(R log(1/delta)) / sigma``."""
    return checks.positive("rho", rho) * math.sqrt(checks.integer("rounds", rounds, minimum=1) * math.log(
        1 / checks.fraction("delta", delta))) / checks.positive("sigma", sigma)


def kov_composition(eps0: float, k: int, delta_hat: float) -> float:
    """Thm 3.4 / D.7 in its canonical form (Kairouz, Oh, Viswanath 2015, Thm 3.5): the
    epsilon of k eps0-DP mechanisms composed, at the extra failure probability ``delta_hat``:
    ``min{k eps0, (e^eps0 - 1)/(e^eps0 + 1) k eps0 + eps0 sqrt(2k log(e + sqrt(k eps0^2)/delta_hat)),
    (e^eps0 - 1)/(e^eps0 + 1) k eps0 + eps0 sqrt(2k log(1/delta_hat))}`` (the paper prints the
    middle term with typos)."""
    eps0, k = checks.positive("eps0", eps0), checks.integer("k", k, minimum=1)
    delta_hat = checks.fraction("delta_hat", delta_hat)
    drift = math.tanh(eps0 / 2) * k * eps0  # (e^eps0 - 1) / (e^eps0 + 1) = tanh(eps0 / 2)
    return min(
        k * eps0,
        drift + eps0 * math.sqrt(2 * k * math.log(math.e + math.sqrt(k * eps0**2) / delta_hat)),
        drift + eps0 * math.sqrt(2 * k * math.log(1 / delta_hat)),
    )


def communication_ratio(distill_rounds: int, train_rounds: int, sampling_rate: float, clients: int,
                        gamma: float) -> float:
    """Eq. 17: FedFed's extra communication over the training rounds' model traffic,
    ``T_d / (T_r beta) + gamma / (2 T_r beta) + gamma / (2 K T_r beta)``, with gamma = a K / m
    the shared data's size over the model's."""
    t_d, t_r = checks.integer("distill_rounds", distill_rounds), checks.integer("train_rounds", train_rounds, minimum=1)
    beta = checks.fraction("sampling_rate", sampling_rate, one=True)
    k, gamma = checks.integer("clients", clients, minimum=1), checks.positive("gamma", gamma)
    return t_d / (t_r * beta) + gamma / (2 * t_r * beta) + gamma / (2 * k * t_r * beta)
