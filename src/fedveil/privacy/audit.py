"""Empirical privacy auditing of DP-SGD: a statistical *lower* bound on epsilon.

A membership-inference game with a canary (Jagielski, Ullman & Oprea 2020, "Auditing
Differentially Private Machine Learning: How Private is Private SGD?", NeurIPS;
Nasr, Song, Thakurta, Papernot & Carlini 2021, "Adversary Instantiation: Lower Bounds
for Differentially Private Machine Learning", IEEE S&P):

1. train ``trials`` models, half on ``D ∪ {canary}`` ("in"), half on ``D`` ("out"),
   with fresh training randomness each time;
2. score every model with a statistic that should be large when the canary was used
   (the canary's negative loss, or the model change along the canary's gradient);
3. a threshold ``t`` turns the scores into a test "canary was in" (score >= t), with
   false-positive rate ``FPR`` (out-models flagged) and false-negative rate ``FNR``
   (in-models missed);
4. an (epsilon, delta)-DP mechanism forces every such test to satisfy
   ``1 - delta - FNR <= e^eps * FPR`` and ``1 - delta - FPR <= e^eps * FNR``
   (Kairouz, Oh & Viswanath 2015 hypothesis-testing view), so with Clopper-Pearson
   upper confidence limits ``FPR_up`` and ``FNR_up``::

       eps_lb = max( log((1 - delta - FNR_up) / FPR_up),  log((1 - delta - FPR_up) / FNR_up) )

   clipped at 0, is a lower bound on the true epsilon (at the stated confidence).

If the lower bound exceeds the epsilon the accountant claims, the implementation (or the
accounting) is wrong: that is how a missing or mis-scaled noise term is caught.

Confidence intervals: two-sided Clopper-Pearson intervals at level ``confidence``
(``scipy.stats.beta``), as in Jagielski et al.'s code (``proportion_confint(method="beta")``),
so each upper limit alone holds with probability >= ``1 - (1 - confidence) / 2``.

Threshold selection: ``select="max"`` (default, as in Jagielski et al.) reports the best
threshold over all candidate thresholds evaluated on the same scores; this max over
thresholds is a slight multiple-comparison optimism, harmless for the large gaps audits
look for. ``select="split"`` picks the threshold on the first half of each score list and
evaluates it on the second half, which makes the confidence statement exact for the
reported threshold, at the price of half the trials. For an audit from a *single* training
run with many canaries see Steinke, Nasr & Jagielski 2023, "Privacy Auditing with One (1)
Training Run" (not implemented here).

The ready-made :func:`audit_linear_dp_sgd` uses a *gradient canary* (Nasr et al. 2021's
"Dirac canary"): a linear regression model without bias, data living in the first ``dim``
coordinates, and a canary ``x = e_dim`` (a coordinate no data point uses) with an enormous
target, so its per-example gradient always has norm far above ``C`` and is clipped to
exactly ``-C e_dim``. The score is the final weight on coordinate ``dim``: in-models get
``lr * C * (times sampled) / denominator`` plus noise, out-models noise only, so the game
is the (subsampled) Gaussian mechanism the accountant reasons about, i.e. the strongest
possible canary for this threat model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from scipy import stats
from torch import nn

from . import checks
from .composition import epsilon as accounted_epsilon_of
from .dp_sgd import poisson_batches, private_gradient

TrainFn = Callable[[bool, int], float]  # (include_canary, seed) -> score

__all__ = [
    "AuditResult",
    "clopper_pearson",
    "epsilon_lower_bound",
    "audit_dp_sgd",
    "audit_linear_dp_sgd",
]


@dataclass(frozen=True)
class AuditResult:
    """Outcome of a canary membership-inference audit.

    ``epsilon_lower_bound``: empirical lower bound on epsilon (>= 0) at ``confidence``.
    ``accounted_epsilon``: what the accountant claims for the same mechanism (``inf`` if
    there is no finite claim, ``nan`` if none was given). ``fpr``/``fnr``: the point
    estimates at the reported ``threshold`` (score >= threshold means "canary in").
    ``trials``: models trained (in + out). ``delta`` as used in the bound.
    """

    epsilon_lower_bound: float
    accounted_epsilon: float
    fpr: float
    fnr: float
    threshold: float
    trials: int
    confidence: float
    delta: float = 0.0

    @property
    def violated(self) -> bool:
        """True when the empirical lower bound exceeds the accounted epsilon (a DP bug)."""
        return self.epsilon_lower_bound > self.accounted_epsilon


def clopper_pearson(successes: int, n: int, confidence: float) -> tuple[float, float]:
    """Two-sided Clopper-Pearson interval for a binomial proportion at level ``confidence``."""
    checks.integer("n", n, minimum=1)
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, {n}], got {successes}")
    checks.fraction("confidence", confidence)
    alpha = 1.0 - confidence
    lo = 0.0 if successes == 0 else float(stats.beta.ppf(alpha / 2, successes, n - successes + 1))
    hi = 1.0 if successes == n else float(stats.beta.ppf(1 - alpha / 2, successes + 1, n - successes))
    return lo, hi


def _bound(fp: int, n_out: int, fn: int, n_in: int, delta: float, confidence: float) -> float:
    fpr_up = clopper_pearson(fp, n_out, confidence)[1]
    fnr_up = clopper_pearson(fn, n_in, confidence)[1]
    best = 0.0
    for a, b in ((fnr_up, fpr_up), (fpr_up, fnr_up)):
        num = 1.0 - delta - a
        if num > 0 and b > 0:
            best = max(best, math.log(num / b))
    return best


def _counts(scores_in: np.ndarray, scores_out: np.ndarray, t: float) -> tuple[int, int]:
    """(false positives, false negatives) of the test ``score >= t``."""
    return int(np.sum(scores_out >= t)), int(np.sum(scores_in < t))


def _candidates(scores_in: np.ndarray, scores_out: np.ndarray) -> np.ndarray:
    return np.unique(np.concatenate([scores_in, scores_out, [np.inf]]))


def _best_threshold(
    scores_in: np.ndarray, scores_out: np.ndarray, delta: float, confidence: float
) -> tuple[float, float]:
    best_eps, best_t = -1.0, math.inf
    for t in _candidates(scores_in, scores_out):
        fp, fn = _counts(scores_in, scores_out, t)
        eps = _bound(fp, len(scores_out), fn, len(scores_in), delta, confidence)
        if eps > best_eps:
            best_eps, best_t = eps, float(t)
    return best_eps, best_t


def epsilon_lower_bound(
    scores_in: Sequence[float],
    scores_out: Sequence[float],
    delta: float,
    confidence: float = 0.95,
    *,
    select: str = "max",
    accounted_epsilon: float = float("nan"),
) -> AuditResult:
    """Empirical epsilon lower bound from scores of models trained with / without a canary.

    Higher scores must mean "canary more likely in". For every threshold ``t`` (all observed
    scores and ``+inf``) the test ``score >= t`` has ``FPR = #{out >= t} / n_out`` and
    ``FNR = #{in < t} / n_in``; with two-sided Clopper-Pearson upper limits at ``confidence``
    the bound is ``max(log((1-delta-FNR_up)/FPR_up), log((1-delta-FPR_up)/FNR_up), 0)``
    (Jagielski et al. 2020, Nasr et al. 2021). ``select="max"`` maximises over thresholds on
    all scores; ``select="split"`` chooses ``t`` on the first half of each list and
    evaluates on the second half (see module doc).
    """
    s_in = np.asarray(scores_in, dtype=np.float64).ravel()
    s_out = np.asarray(scores_out, dtype=np.float64).ravel()
    if len(s_in) == 0 or len(s_out) == 0:
        raise ValueError("need at least one in-score and one out-score")
    if np.isnan(s_in).any() or np.isnan(s_out).any():
        raise ValueError("scores must not be NaN")
    checks.fraction("delta", delta, zero=True)
    checks.fraction("confidence", confidence)
    checks.one_of("select", select, ("max", "split"))
    if select == "max":
        eval_in, eval_out = s_in, s_out
        eps, t = _best_threshold(s_in, s_out, delta, confidence)
    else:  # "split"
        if len(s_in) < 2 or len(s_out) < 2:
            raise ValueError("select='split' needs at least two scores on each side")
        h_in, h_out = len(s_in) // 2, len(s_out) // 2
        _, t = _best_threshold(s_in[:h_in], s_out[:h_out], delta, confidence)
        eval_in, eval_out = s_in[h_in:], s_out[h_out:]
        fp, fn = _counts(eval_in, eval_out, t)
        eps = _bound(fp, len(eval_out), fn, len(eval_in), delta, confidence)
    fp, fn = _counts(eval_in, eval_out, t)
    return AuditResult(
        epsilon_lower_bound=max(eps, 0.0),
        accounted_epsilon=float(accounted_epsilon),
        fpr=fp / len(eval_out),
        fnr=fn / len(eval_in),
        threshold=t,
        trials=len(s_in) + len(s_out),
        confidence=confidence,
        delta=delta,
    )


def audit_dp_sgd(
    train_fn: TrainFn,
    trials: int,
    delta: float,
    *,
    confidence: float = 0.95,
    accounted_epsilon: float = float("nan"),
    seed: int = 0,
    select: str = "max",
) -> AuditResult:
    """Run the canary game with ``train_fn(include_canary, seed) -> score``.

    ``train_fn`` trains one model from scratch (with the canary in the training set when
    ``include_canary`` is true) using all its randomness from ``seed``, and returns the
    attack score (higher = canary more likely in). Trials alternate in/out with seeds
    ``seed, seed + 1, ...``; ``trials`` must be even and >= 2. The scores are then passed to
    :func:`epsilon_lower_bound`.
    """
    if trials < 2 or trials % 2:
        raise ValueError(f"trials must be an even number >= 2, got {trials}")
    scores_in: list[float] = []
    scores_out: list[float] = []
    for i in range(trials):
        include = i % 2 == 0
        score = float(train_fn(include, seed + i))
        (scores_in if include else scores_out).append(score)
    return epsilon_lower_bound(
        scores_in, scores_out, delta, confidence, select=select, accounted_epsilon=accounted_epsilon
    )


def _mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out.reshape(y.shape), y)


def linear_canary_train_fn(
    noise_multiplier: float,
    steps: int,
    *,
    clip: float = 1.0,
    lr: float = 1.0,
    sample_rate: float = 1.0,
    n: int = 32,
    dim: int = 4,
    canary_target: float = 1e6,
    data_seed: int = 1234,
) -> TrainFn:
    """A ``train_fn`` for :func:`audit_dp_sgd`: DP-SGD on linear regression with a Dirac canary.

    The data set (``n`` points, features in coordinates ``0..dim-1``, coordinate ``dim``
    always zero) is fixed by ``data_seed``; the canary is ``x = e_dim`` with target
    ``canary_target``, whose gradient is clipped to ``-clip * e_dim``. Training: ``steps``
    steps of :func:`fedveil.privacy.dp_sgd.private_gradient` with Poisson batches of rate
    ``sample_rate`` (every row every step when it is 1), denominator ``sample_rate * n``
    (fixed and public, independent of the canary), plain SGD with learning rate ``lr``
    from zero weights. Score: the final weight on coordinate ``dim``.
    """
    g = torch.Generator().manual_seed(data_seed)
    x = torch.zeros(n, dim + 1)
    x[:, :dim] = torch.randn(n, dim, generator=g)
    y = x[:, :dim] @ torch.randn(dim, generator=g) + 0.1 * torch.randn(n, generator=g)
    canary_x = torch.zeros(1, dim + 1)
    canary_x[0, dim] = 1.0
    canary_y = torch.tensor([canary_target])
    x_in, y_in = torch.cat([x, canary_x]), torch.cat([y, canary_y])
    model = nn.Linear(dim + 1, 1, bias=False)
    denominator = sample_rate * n

    def train(include_canary: bool, seed: int) -> float:
        xs, ys = (x_in, y_in) if include_canary else (x, y)
        gen = torch.Generator().manual_seed(seed)
        params = {"weight": torch.zeros(1, dim + 1)}
        if sample_rate >= 1.0:
            batches = (torch.arange(len(xs)) for _ in range(steps))
        else:
            batches = poisson_batches(len(xs), sample_rate, steps, gen)
        for idx in batches:
            pg = private_gradient(
                model, params, xs[idx], ys[idx], _mse,
                clip=clip, noise_multiplier=noise_multiplier, denominator=denominator, generator=gen,
            )
            params = {k: v - lr * pg.grad[k] for k, v in params.items()}
        return float(params["weight"][0, dim])

    return train


def audit_linear_dp_sgd(
    noise_multiplier: float,
    steps: int,
    *,
    delta: float = 1e-5,
    trials: int = 100,
    confidence: float = 0.95,
    sample_rate: float = 1.0,
    claimed_noise_multiplier: float | None = None,
    clip: float = 1.0,
    lr: float = 1.0,
    n: int = 32,
    dim: int = 4,
    seed: int = 0,
    select: str = "max",
) -> AuditResult:
    """Audit fedveil's DP-SGD step on a linear model with a gradient (Dirac) canary.

    Trains ``trials`` models with :func:`linear_canary_train_fn` at the *actual*
    ``noise_multiplier`` and compares the empirical lower bound with the epsilon that
    :func:`fedveil.privacy.epsilon` accounts for ``(claimed_noise_multiplier or
    noise_multiplier, sample_rate, steps, delta)`` (``sampling="full"`` when
    ``sample_rate == 1``, else ``"poisson"``; add/remove-one neighbours, as the game).
    Passing a ``claimed_noise_multiplier`` larger than the actual one simulates a buggy
    mechanism; the audit should then report ``violated``. An accounted epsilon that
    cannot be computed (actual noise 0 and no claim) is ``inf``.
    """
    z_claim = noise_multiplier if claimed_noise_multiplier is None else claimed_noise_multiplier
    sampling = "full" if sample_rate >= 1.0 else "poisson"
    eps_acc = (
        accounted_epsilon_of(z_claim, min(sample_rate, 1.0), steps, delta, sampling=sampling)
        if z_claim > 0
        else math.inf
    )
    train_fn = linear_canary_train_fn(
        noise_multiplier, steps, clip=clip, lr=lr, sample_rate=sample_rate, n=n, dim=dim
    )
    return audit_dp_sgd(
        train_fn, trials, delta, confidence=confidence, accounted_epsilon=eps_acc, seed=seed, select=select
    )
