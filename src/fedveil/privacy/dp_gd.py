"""Centralised private (stochastic) gradient descent under a noise schedule (Hong, Alg. 2.1).

Step t: clip every per-example gradient to global L2 norm C, average, add
``C sigma_t nu_t / n`` (``nu_t ~ N(0, I)``; n = N for full batch, the batch size for PSGD),
update ``m`` by Eq. 2.2 (``beta = 0``) or the bias-corrected momentum Eq. 2.3, and take
``theta_{t+1} = theta_t - lr m_{t+1}`` with a fixed lr. A step costs ``c p^2 / sigma_t^2`` of
the budget R (p = n/N, c = 1 by default, spec §1.6); training stops before the first step the
residual cannot pay for, so a run that spends R is (R/2)-zCDP (Thm 1) and
``(rho + 2 sqrt(rho ln(1/delta)), delta)``-DP (Lemma 4).

For PSGD build the schedule with the sigma-unit budget ``R' = R/(c p^2)``
(:func:`fedveil.privacy.schedules.psgd_budget`); batches are drawn with replacement.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from ..params import Params
from .dp_sgd import LossFn, check_model_for_dp, private_gradient
from .schedules import BudgetTracker, NoiseSchedule, budgeted_sigmas
from .zcdp import epsilon_from_budget


class DPGDParams(BaseModel):
    """Hyper-parameters of :func:`train_dp_gd` (defaults: the dissertation's §2.5 setup)."""

    model_config = ConfigDict(extra="forbid")

    lr: float = Field(0.1, gt=0, allow_inf_nan=False, description="fixed learning rate")
    clip_norm: float = Field(4.0, gt=0, allow_inf_nan=False, description="per-example clip norm C (= G)")
    momentum: float = Field(0.0, ge=0, lt=1, description="beta of Eq. 2.3; 0 is plain GD (Eq. 2.2)")
    batch_size: int | None = Field(None, ge=1, description="None: full batch; n: PSGD, drawn with replacement")
    budget: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="R = 2 rho_zCDP; None: no budget (schedule length / max_steps)"
    )
    cost_constant: float = Field(1.0, gt=0, allow_inf_nan=False, description="c of the PSGD step cost c p^2/sigma^2")
    delta: float = Field(1e-8, gt=0, lt=1, description="delta of the reported (epsilon, delta)")
    max_steps: int | None = Field(None, ge=1, description="stop after this many steps at the latest")


@dataclass
class DPGDResult:
    """Final parameters and per-step history (losses are non-private, for logging only)."""

    params: Params
    losses: list[float]  # batch-mean loss at theta_t (the training loss f(theta_t) in full batch)
    sigmas: list[float]
    residuals: list[float]  # residual budget R_{t+1} after each step (inf without a budget)
    budget_used: float  # sum_t c p^2 / sigma_t^2, in units of R
    stop_reason: str  # "budget", "schedule" or "max_steps"
    delta: float

    @property
    def steps(self) -> int:
        return len(self.sigmas)

    @property
    def rho(self) -> float:
        """zCDP spent: R_used / 2 (Thm 1)."""
        return self.budget_used / 2

    @property
    def epsilon(self) -> float:
        """epsilon at ``delta`` by Lemma 4."""
        return epsilon_from_budget(self.budget_used, self.delta)


def bias_corrected_momentum(m: Params, g: Params, beta: float, t: int) -> Params:
    """Eq. 2.3: ``m_{t+1} = [beta (1 - beta^{t-1}) m_t + (1 - beta) g_t] / (1 - beta^t)``, t >= 1
    (so m_2 = g_1 and m_{t+1} = (1-beta) sum_i beta^{t-i} g_i / (1 - beta^t), Eq. 2.13)."""
    a, b, z = beta * (1 - beta ** (t - 1)), 1 - beta, 1 - beta**t
    return {k: (a * m[k] + b * g[k]) / z for k in g}


def train_dp_gd(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: LossFn,
    schedule: NoiseSchedule,
    hp: DPGDParams,
    generator: torch.Generator,
    params: Params | None = None,
    on_step: Callable[[int, Params], None] | None = None,
) -> DPGDResult:
    """Run Alg. 2.1 from ``params`` (default: the model's own) on the rows ``(x, y)``.

    ``loss_fn(out, y)`` is a batch-mean loss, applied per example. ``on_step(t, theta_{t+1})``
    runs after every step, e.g. to validate and feed a ``ValidationPlateauSchedule``."""
    check_model_for_dp(model)
    rows = len(x)
    if rows == 0 or len(y) != rows:
        raise ValueError(f"need a non-empty data set with one label per row, got {rows} rows and {len(y)} labels")
    n = rows if hp.batch_size is None else hp.batch_size
    if n > rows:
        raise ValueError(f"batch_size {n} exceeds the {rows} rows (sampling rate n/N must be <= 1)")
    tracker = BudgetTracker(hp.budget, hp.cost_constant * (n / rows) ** 2)
    w = {k: v.detach().clone() for k, v in (params or dict(model.named_parameters())).items()}
    m = {k: torch.zeros_like(v) for k, v in w.items()}
    losses, sigmas, residuals = [], [], []
    for t, sigma in enumerate(budgeted_sigmas(schedule, tracker, hp.max_steps), start=1):
        idx = None if hp.batch_size is None else torch.randint(rows, (n,), generator=generator)
        xb, yb = (x, y) if idx is None else (x[idx], y[idx])
        pg = private_gradient(
            model, w, xb, yb, loss_fn, clip=hp.clip_norm, noise_multiplier=sigma, denominator=n, generator=generator
        )
        m = bias_corrected_momentum(m, pg.grad, hp.momentum, t)
        w = {k: w[k] - hp.lr * m[k] for k in w}
        losses.append(pg.loss)
        sigmas.append(sigma)
        residuals.append(tracker.residual)
        if on_step is not None:
            on_step(t, w)
    steps = len(sigmas)
    if hp.max_steps is not None and steps == hp.max_steps:
        reason = "max_steps"
    elif schedule.num_steps is not None and steps == schedule.num_steps:
        reason = "schedule"
    else:
        reason = "budget"
    return DPGDResult(w, losses, sigmas, residuals, tracker.spent, reason, hp.delta)
