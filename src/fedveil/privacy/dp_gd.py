"""Centralised private (stochastic) gradient descent under a noise schedule (Hong, Alg. 2.1).

Step t: clip every per-example gradient to global L2 norm C, sum, add ``C sigma_t nu_t``
(``nu_t ~ N(0, I)``), divide by n (N for full batch, the expected batch size for PSGD),
update ``m`` by Eq. 2.2 (``beta = 0``) or the bias-corrected momentum Eq. 2.3, and take
``theta_{t+1} = theta_t - lr m_{t+1}`` with a fixed lr.

Full batch (the dissertation's DP-GD): a step costs ``1/sigma_t^2`` of the budget R and
training stops before the first step the residual cannot pay for, so a run that spends R
is (R/2)-zCDP (Lemma 3, Thm 1) and ``(rho + 2 sqrt(rho ln(1/delta)), delta)``-DP (Lemma 4).

Mini-batches (PSGD): every row joins a step's batch independently with probability
``q = batch_size / N`` (Poisson sampling), and the steps are accounted as
``PoissonSampledDpEvent(q, GaussianDpEvent(sigma_t))`` by the RDP accountant (Mironov et
al. 2019) of :class:`~fedveil.privacy.ledger.PrivacyLedger`; the run stops before the
accounted epsilon would exceed the epsilon that R stands for (Lemma 4). The dissertation's
PSGD cost ``c p^2 / sigma_t^2`` (§2.4.4, batches drawn with replacement) is not used: it is
no zCDP bound (zCDP has no such amplification by subsampling) and under-reports epsilon
(docs/privacy.md). Calibrate PSGD schedules with :func:`calibrated_psgd_schedule`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from ..params import Params
from .calibration import calibrate_noise_schedule
from .dp_sgd import LossFn, check_model_for_dp, poisson_batches, private_gradient
from .events import Release, gaussian_steps_release
from .ledger import PrivacyLedger
from .randomness import RandomSource
from .schedules import BudgetExhaustedError, BudgetTracker, NoiseSchedule, PredefinedSchedule, budgeted_sigmas
from .zcdp import epsilon_from_budget

PSGD_ACCOUNTANT = "rdp"  # reports PSGD's epsilon, stops its runs and calibrates its schedules
# A schedule calibrated to spend a budget exactly sums to it only up to float rounding;
# its last step must still fit.
_BUDGET_RTOL = 1e-9


class DPGDParams(BaseModel):
    """Hyper-parameters of :func:`train_dp_gd` (defaults: the dissertation's §2.5 setup)."""

    model_config = ConfigDict(extra="forbid")

    lr: float = Field(0.1, gt=0, allow_inf_nan=False, description="fixed learning rate")
    clip_norm: float = Field(4.0, gt=0, allow_inf_nan=False, description="per-example clip norm C (= G)")
    momentum: float = Field(0.0, ge=0, lt=1, description="beta of Eq. 2.3; 0 is plain GD (Eq. 2.2)")
    batch_size: int | None = Field(
        None, ge=1, description="None: full batch (zCDP); n: PSGD on Poisson batches of expected size n (RDP)"
    )
    budget: float | None = Field(
        None, gt=0, allow_inf_nan=False,
        description="R = 2 rho_zCDP (PSGD: the epsilon R stands for at delta, Lemma 4); None: no budget",
    )
    delta: float = Field(1e-8, gt=0, lt=1, description="delta of the reported (epsilon, delta)")
    max_steps: int | None = Field(None, ge=1, description="stop after this many steps at the latest")


@dataclass
class DPGDResult:
    """Final parameters, per-step history (losses are non-private, for logging only) and privacy spent."""

    params: Params
    losses: list[float]  # batch-mean loss at theta_t (f(theta_t) in full batch; NaN for an empty Poisson batch)
    sigmas: list[float]
    residuals: list[float]  # budget left after each step: R_{t+1} (full batch) or epsilon (PSGD); inf without one
    epsilon: float  # at delta: Lemma 4 of rho (full batch), the RDP accountant (PSGD)
    rho: float | None  # zCDP spent, sum_t 1/(2 sigma_t^2) (Thm 1); None for PSGD
    stop_reason: str  # "budget", "schedule" or "max_steps"
    delta: float

    @property
    def steps(self) -> int:
        """Number of steps taken (one ``sigma`` per step)."""
        return len(self.sigmas)


class PoissonBudget:
    """Alg. 2.1's residual budget for Poisson batches at rate ``sample_rate``: a step costs one
    ``PoissonSampledDpEvent(q, GaussianDpEvent(sigma))`` composed by RDP, and is affordable while
    the composed epsilon at ``delta`` stays within ``budget`` (an epsilon; None: no limit)."""

    def __init__(self, budget: float | None, sample_rate: float, delta: float) -> None:
        self.budget, self.sample_rate, self.delta = budget, sample_rate, delta
        self._ledger = PrivacyLedger(PSGD_ACCOUNTANT)
        self._noiseless = False  # a step with sigma = 0 was taken: epsilon is infinite

    @property
    def spent(self) -> float:
        """epsilon at ``delta`` of the steps taken."""
        return math.inf if self._noiseless else self._ledger.epsilon(PrivacyLedger.POPULATION, self.delta)

    @property
    def residual(self) -> float:
        """Epsilon left: ``budget`` minus :attr:`spent` (inf without a budget)."""
        return math.inf if self.budget is None else self.budget - self.spent

    def can_afford(self, sigma: float) -> bool:
        """Whether one more step at ``sigma`` keeps the composed epsilon within ``budget`` (``sigma = 0``: never,
        unless there is no budget)."""
        if self.budget is None:
            return True
        if sigma == 0:
            return False
        after = self._ledger.epsilon_with(PrivacyLedger.POPULATION, self._step(sigma), self.delta)
        return after <= self.budget * (1 + _BUDGET_RTOL)

    def spend(self, sigma: float) -> None:
        """Record one step at ``sigma``; raise :class:`BudgetExhaustedError` if it is not affordable."""
        if not self.can_afford(sigma):
            raise BudgetExhaustedError(f"a step with sigma={sigma} would take epsilon past {self.budget:.6g}")
        if sigma == 0:
            self._noiseless = True
        else:
            self._ledger.record(PrivacyLedger.POPULATION, self._step(sigma))

    def _step(self, sigma: float) -> Release:
        return gaussian_steps_release(sigma, self.sample_rate, 1, "poisson")


def psgd_sample_rate(hp: DPGDParams, rows: int) -> float:
    """Poisson rate ``q = batch_size / N`` of PSGD."""
    if hp.batch_size is None:
        raise ValueError("full-batch DP-GD has no sample rate; set batch_size for PSGD")
    if hp.batch_size > rows:
        raise ValueError(f"batch_size {hp.batch_size} exceeds the {rows} rows (sampling rate n/N must be <= 1)")
    return hp.batch_size / rows


def budget_epsilon(hp: DPGDParams) -> float | None:
    """The epsilon at ``hp.delta`` that the budget R stands for (Lemma 4 of rho = R/2)."""
    return None if hp.budget is None else epsilon_from_budget(hp.budget, hp.delta)


def calibrated_psgd_schedule(shape: Sequence[float], hp: DPGDParams, rows: int) -> PredefinedSchedule:
    """``sigma_t = s * shape_t / min(shape)`` with the smallest ``s`` whose PSGD run on ``rows`` rows
    spends at most ``budget_epsilon(hp)``, by the same RDP accountant as :class:`PoissonBudget`
    (spec §1.8 mode (i) with a subsampled-Gaussian accountant in place of ``sum_t 1/sigma_t^2 = R``)."""
    q = psgd_sample_rate(hp, rows)
    epsilon = budget_epsilon(hp)
    if epsilon is None:
        raise ValueError("calibrating a PSGD schedule needs a budget")
    sigmas = calibrate_noise_schedule(shape, epsilon, hp.delta, q, accountant=PSGD_ACCOUNTANT)
    return PredefinedSchedule(tuple(sigmas))


def bias_corrected_momentum(m: Params, g: Params, beta: float, t: int) -> Params:
    """Eq. 2.3: ``m_{t+1} = [beta (1 - beta^{t-1}) m_t + (1 - beta) g_t] / (1 - beta^t)``, t >= 1
    (so m_2 = g_1 and m_{t+1} = (1-beta) sum_i beta^{t-i} g_i / (1 - beta^t), Eq. 2.13)."""
    a, b, z = beta * (1 - beta ** (t - 1)), 1 - beta, 1 - beta**t
    return {k: (a * m[k] + b * g[k]) / z for k in g}


def _privacy_budget(hp: DPGDParams, rows: int) -> BudgetTracker | PoissonBudget:
    if hp.batch_size is None:
        return BudgetTracker(hp.budget)
    return PoissonBudget(budget_epsilon(hp), psgd_sample_rate(hp, rows), hp.delta)


def _batch(
    x: torch.Tensor, y: torch.Tensor, q: float | None, source: RandomSource
) -> tuple[torch.Tensor, torch.Tensor]:
    """All rows (q None), or a Poisson batch: every row independently with probability q."""
    if q is None:
        return x, y
    idx = next(poisson_batches(len(x), q, 1, source, x.device))
    return x[idx], y[idx]


def _spent(budget: BudgetTracker | PoissonBudget, delta: float) -> tuple[float, float | None]:
    """(epsilon, rho) of the steps taken: Lemma 4 of rho = R_used / 2 (Thm 1), or PSGD's RDP epsilon."""
    if isinstance(budget, PoissonBudget):
        return budget.spent, None
    return epsilon_from_budget(budget.spent, delta), budget.spent / 2


def _stop_reason(steps: int, schedule: NoiseSchedule, max_steps: int | None) -> str:
    if max_steps is not None and steps == max_steps:
        return "max_steps"
    if schedule.num_steps is not None and steps == schedule.num_steps:
        return "schedule"
    return "budget"


def train_dp_gd(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: LossFn,
    schedule: NoiseSchedule,
    hp: DPGDParams,
    generator: RandomSource,
    params: Params | None = None,
    on_step: Callable[[int, Params], None] | None = None,
) -> DPGDResult:
    """Run Alg. 2.1 from ``params`` (default: the model's own) on the rows ``(x, y)``.

    ``loss_fn(out, y)`` is a batch-mean loss, applied per example. ``generator`` (a seeded
    generator or :data:`~fedveil.privacy.randomness.SECURE`) draws the noise and the Poisson
    batches. ``on_step(t, theta_{t+1})`` runs after every step, e.g. to validate and feed a
    ``ValidationPlateauSchedule``."""
    check_model_for_dp(model)
    rows = len(x)
    if rows == 0 or len(y) != rows:
        raise ValueError(f"need a non-empty data set with one label per row, got {rows} rows and {len(y)} labels")
    budget = _privacy_budget(hp, rows)
    q = None if hp.batch_size is None else psgd_sample_rate(hp, rows)
    denominator = rows if q is None else hp.batch_size
    w = {k: v.detach().clone() for k, v in (params or dict(model.named_parameters())).items()}
    m = {k: torch.zeros_like(v) for k, v in w.items()}
    losses, sigmas, residuals = [], [], []
    for t, sigma in enumerate(budgeted_sigmas(schedule, budget, hp.max_steps), start=1):
        xb, yb = _batch(x, y, q, generator)
        pg = private_gradient(
            model, w, xb, yb, loss_fn, clip=hp.clip_norm, noise_multiplier=sigma, denominator=denominator,
            generator=generator,
        )
        m = bias_corrected_momentum(m, pg.grad, hp.momentum, t)
        w = {k: w[k] - hp.lr * m[k] for k in w}
        losses.append(pg.loss)
        sigmas.append(sigma)
        residuals.append(budget.residual)
        if on_step is not None:
            on_step(t, w)
    epsilon, rho = _spent(budget, hp.delta)
    reason = _stop_reason(len(sigmas), schedule, hp.max_steps)
    return DPGDResult(w, losses, sigmas, residuals, epsilon, rho, reason, hp.delta)
