"""Noise schedules sigma_t for private gradient descent (Hong, dissertation Ch. 2).

Unit (the dissertation's book-keeping, spec §1.2): ``sigma_t`` is the noise multiplier
(noise std / sensitivity of the averaged gradient), a step costs ``rho_t = 1/sigma_t^2``
and a run must satisfy ``sum_t 1/sigma_t^2 <= R`` with ``R = 2 * rho_zCDP`` (Thm 1: the
run is (R/2)-zCDP). Nothing here knows about models, so the same schedules drive DP-GD
steps and DP-FedAvg rounds alike.

Mini-batches (PSGD): the dissertation's ``c p^2 / sigma_t^2`` per step (§2.4.4) is no zCDP
bound and is not used; :mod:`fedveil.privacy.dp_gd` samples Poisson batches and accounts
them with the RDP accountant (docs/privacy.md).

Steps are 0-based here (``sigma(step)``, step = t - 1 of the dissertation's t = 1..T).
Two budget modes (spec §1.8): a schedule normalised to spend R in exactly T steps
(uniform, dynamic, :func:`normalise_to_budget`), or run-until-exhausted (Alg. 2.1):
charge each step and stop when the next step's cost exceeds the residual.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from typing import Annotated, Callable, Iterator, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..errors import format_validation_error
from ..registry import Registry
from . import checks

# Budget comparisons allow this relative slack: a schedule normalised to spend exactly R
# sums to R only up to float rounding, and its last step must still fit.
_BUDGET_RTOL = 1e-9


# --------------------------------------------------------------------------------------
# Closed forms and optimal allocations (§1.4, §1.5)


def optimal_sigmas(influence: np.ndarray, R: float) -> np.ndarray:
    """Lemma 1 / Eq. 2.10: ``sigma_t^2 = (1/R) sum_i sqrt(q_i/q_t)`` minimises
    ``sum_t q_t sigma_t^2`` subject to ``sum_t 1/sigma_t^2 = R`` (budget share ~ sqrt(q_t))."""
    checks.positive("R", R)
    s = np.sqrt(checks.positive_vector("influence", influence))
    return np.sqrt(s.sum() / (R * s))


def uniform_sigmas(R: float, T: int) -> np.ndarray:
    """Thm 3: ``sigma_t^2 = T/R`` for t = 1..T."""
    checks.positive("R", R)
    checks.integer("T (number of steps)", T, minimum=1)
    return np.full(int(T), math.sqrt(T / R))


def gd_dynamic_sigmas(R: float, T: int, gamma: float) -> np.ndarray:
    """Thm 4 / Eq. 2.11, corrected (spec §1.4): the GD-optimal schedule
    ``sigma_t^2 = ((1/gamma)^{T/2} - 1) gamma^{t/2} / ((1 - sqrt(gamma)) R)``,
    i.e. Lemma 1 with influence ``q_t = gamma^{T-t}``; sigma_t = sigma_1 gamma^{(t-1)/4}."""
    checks.positive("R", R)
    checks.integer("T (number of steps)", T, minimum=1)
    checks.fraction("gamma", gamma)
    t = np.arange(1, int(T) + 1, dtype=np.float64)
    # ((1/g)^{T/2} - 1) g^{t/2} written as g^{(t-T)/2} (1 - g^{T/2}) to avoid overflow
    var = gamma ** ((t - T) / 2) * (1 - gamma ** (T / 2)) / ((1 - math.sqrt(gamma)) * R)
    return np.sqrt(var)


def momentum_influence(T: int, beta: float, gamma: float) -> np.ndarray:
    """Influence of sigma_i^2 in U_3 of Thm 5 / Eq. 2.14 (spec §1.5):
    ``q_i = sum_{t=i..T} gamma^{T-t} ((1-beta)/(1-beta^t))^2 beta^{2(t-i)}``, i = 1..T."""
    checks.integer("T (number of steps)", T, minimum=1)
    checks.fraction("gamma", gamma)
    checks.fraction("beta (momentum)", beta, zero=True)
    t = np.arange(1, int(T) + 1, dtype=np.float64)
    w = gamma ** (T - t) * ((1 - beta) / (1 - beta**t)) ** 2
    q = np.empty_like(w)
    acc = 0.0
    for i in range(int(T) - 1, -1, -1):  # q_i = w_i + beta^2 q_{i+1}
        acc = w[i] + beta**2 * acc
        q[i] = acc
    return q


def momentum_dynamic_sigmas(R: float, T: int, beta: float, gamma: float) -> np.ndarray:
    """Thm 7: Lemma 1 applied to the momentum influence q_i^mom (beta = 0 gives Thm 4)."""
    return optimal_sigmas(momentum_influence(T, beta, gamma), R)


# --------------------------------------------------------------------------------------
# Decay families (spec §1.8, as in jyhong836/pytorch-dp): shape functions of the epoch e


def time_decay(epoch: int | np.ndarray, sigma0: float, k: float) -> np.ndarray | float:
    """``sigma_e = sigma0 / (1 + k e)``."""
    return sigma0 / (1 + k * np.asarray(epoch, dtype=np.float64))


def exp_decay(epoch: int | np.ndarray, sigma0: float, k: float) -> np.ndarray | float:
    """``sigma_e = sigma0 exp(-k e)``."""
    return sigma0 * np.exp(-k * np.asarray(epoch, dtype=np.float64))


def step_decay(epoch: int | np.ndarray, sigma0: float, k: float, period: int) -> np.ndarray | float:
    """``sigma_e = sigma0 k^floor(e/period)``."""
    return sigma0 * k ** (np.asarray(epoch) // period)


def poly_decay(
    epoch: int | np.ndarray, sigma0: float, sigma_final: float, k: float, period: int
) -> np.ndarray | float:
    """``sigma_e = (sigma0 - sigma_final)(1 - e/period)^k + sigma_final``, e clamped to ``period``."""
    e = np.minimum(np.asarray(epoch, dtype=np.float64), period)
    return (sigma0 - sigma_final) * (1 - e / period) ** k + sigma_final


def normalise_to_budget(shape: np.ndarray, R: float) -> np.ndarray:
    """Scale a positive shape s_t to ``sigma_t = c s_t`` with ``sum_t 1/sigma_t^2 = R`` exactly
    (``c^2 = (sum_t 1/s_t^2)/R``, spec §1.8 mode (i))."""
    checks.positive("R", R)
    s = checks.positive_vector("shape", shape)
    return s * math.sqrt((1 / s**2).sum() / R)


# --------------------------------------------------------------------------------------
# Schedule objects used by trainers


class NoiseSchedule(Protocol):
    """What a trainer needs: sigma of step ``step`` (0-based) and the schedule's length."""

    @property
    def num_steps(self) -> int | None:
        """Steps the schedule defines; None if it goes on until the budget runs out."""

    def sigma(self, step: int) -> float:
        """Noise multiplier of step ``step`` (0-based)."""


@dataclass(frozen=True)
class PredefinedSchedule:
    """A fixed list of sigmas indexed by epoch ``e = step // steps_per_epoch``.

    Also the container of the precomputed schedules (uniform, dynamic, normalised decays).
    sigma = 0 is allowed (a non-private step, infinite cost)."""

    sigmas: tuple[float, ...]
    steps_per_epoch: int = 1

    def __post_init__(self) -> None:
        s = checks.positive_vector("sigmas", self.sigmas, allow_zero=True)
        checks.integer("steps_per_epoch", self.steps_per_epoch, minimum=1)
        object.__setattr__(self, "sigmas", tuple(float(v) for v in s))

    @property
    def num_steps(self) -> int:
        """``len(sigmas) * steps_per_epoch``."""
        return len(self.sigmas) * self.steps_per_epoch

    def sigma(self, step: int) -> float:
        """The sigma of epoch ``step // steps_per_epoch``; ``IndexError`` outside the schedule."""
        if not 0 <= step < self.num_steps:
            raise IndexError(f"step {step} is outside this schedule's {self.num_steps} steps")
        return self.sigmas[step // self.steps_per_epoch]


@dataclass(frozen=True)
class EpochDecaySchedule:
    """``sigma = shape(e)`` with epoch ``e = step // steps_per_epoch``; unbounded length."""

    shape: Callable[[int], float]
    steps_per_epoch: int = 1

    @property
    def num_steps(self) -> None:
        """None: the schedule has no end of its own."""
        return None

    def sigma(self, step: int) -> float:
        """``shape(step // steps_per_epoch)``; ``IndexError`` for a negative step."""
        if step < 0:
            raise IndexError(f"step must be >= 0, got {step}")
        return float(self.shape(step // self.steps_per_epoch))


@dataclass
class ValidationPlateauSchedule:
    """Shrink sigma when validation accuracy plateaus (Lee & Kifer 2018, as in the reference code).

    Call :meth:`record` after each validation. Every ``period`` validations (after the
    first period), if ``mean(last m accs) - mean(the m accs one period earlier) < delta_v``
    then ``sigma <- k * sigma``."""

    sigma0: float
    k: float
    period: int = 10
    m: int = 5
    delta_v: float = 0.01
    current: float = field(init=False)
    accuracies: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        checks.positive("sigma0", self.sigma0)
        checks.fraction("k (sigma multiplier on a plateau)", self.k, one=True)
        if not 1 <= self.m <= self.period:
            raise ValueError(f"need 1 <= m <= period, got m={self.m}, period={self.period}")
        self.current = self.sigma0

    @property
    def num_steps(self) -> None:
        """None: the schedule has no end of its own."""
        return None

    def sigma(self, step: int) -> float:
        """The current sigma, whatever the step."""
        return self.current

    def record(self, val_acc: float) -> None:
        """Append ``val_acc``; at the end of each period after the first, multiply sigma by ``k`` on a plateau."""
        self.accuracies.append(float(val_acc))
        n, p, m = len(self.accuracies), self.period, self.m
        if n > p and n % p == 0:
            recent = np.mean(self.accuracies[-m:])
            earlier = np.mean(self.accuracies[n - p - m : n - p])
            if recent - earlier < self.delta_v:
                self.current *= self.k


class BudgetExhaustedError(RuntimeError):
    """A step was charged that the residual budget cannot pay for."""


@dataclass
class BudgetTracker:
    """Residual budget of Alg. 2.1: a step with noise sigma costs ``cost_scale / sigma^2``
    (cost_scale = c p^2 for PSGD, 1 for full batch); ``spent`` is in units of R.
    ``budget=None`` only counts (every step is affordable)."""

    budget: float | None
    cost_scale: float = 1.0
    spent: float = 0.0

    def __post_init__(self) -> None:
        if self.budget is not None:
            checks.positive("budget", self.budget)
        checks.positive("cost_scale", self.cost_scale)

    @property
    def residual(self) -> float:
        """Budget left, ``budget - spent`` (inf without a budget)."""
        return math.inf if self.budget is None else self.budget - self.spent

    def cost(self, sigma: float) -> float:
        """Cost of one step, ``cost_scale / sigma^2`` (inf for ``sigma = 0``)."""
        checks.positive("sigma", sigma, allow_zero=True, allow_inf=True)
        return math.inf if sigma == 0 else self.cost_scale / sigma**2

    def can_afford(self, sigma: float) -> bool:
        """Alg. 2.1 line 2 (``rho_t <= R_t``, with float slack so exact schedules finish)."""
        if self.budget is None:
            return True
        return self.cost(sigma) <= self.residual + _BUDGET_RTOL * self.budget

    def spend(self, sigma: float) -> None:
        """Alg. 2.1 line 3: ``R_{t+1} = R_t - rho_t``."""
        if not self.can_afford(sigma):
            raise BudgetExhaustedError(
                f"a step with sigma={sigma} costs {self.cost(sigma):.6g} "
                f"but only {self.residual:.6g} of the budget remains"
            )
        self.spent += self.cost(sigma)


def budgeted_sigmas(
    schedule: NoiseSchedule, tracker: BudgetTracker, max_steps: int | None = None
) -> Iterator[float]:
    """Alg. 2.1's loop: yield sigma_t after charging its cost; stop before the first step the
    residual cannot pay for, at the schedule's end, or after ``max_steps``. Lazy, so a
    stateful schedule sees the feedback given between steps."""
    limits = [n for n in (schedule.num_steps, max_steps) if n is not None]
    if not limits and tracker.budget is None:
        raise ValueError("an unbounded schedule needs a budget or max_steps to stop")
    limit = min(limits) if limits else None
    step = 0
    while limit is None or step < limit:
        sigma = schedule.sigma(step)
        if not tracker.can_afford(sigma):
            return
        tracker.spend(sigma)
        yield sigma
        step += 1


def run_until_exhausted(
    schedule: NoiseSchedule, R: float, cost_scale: float = 1.0, max_steps: int | None = None
) -> np.ndarray:
    """The sigmas of the steps a budget ``R`` pays for (spec §1.8 mode (ii))."""
    return np.fromiter(budgeted_sigmas(schedule, BudgetTracker(R, cost_scale), max_steps), dtype=np.float64)


# --------------------------------------------------------------------------------------
# Registry: make_schedule(name, **params)


class ScheduleParams(BaseModel):
    """Validated parameters of a named schedule; :meth:`build` makes the schedule."""

    model_config = ConfigDict(extra="forbid")

    def build(self) -> NoiseSchedule:
        """The schedule these parameters describe."""
        raise NotImplementedError


SCHEDULES: Registry[type[ScheduleParams]] = Registry("noise schedule")

Budget = Annotated[float, Field(gt=0, allow_inf_nan=False, description="R = 2 rho_zCDP, sigma unit (R' for PSGD)")]
Steps = Annotated[int, Field(ge=1, description="number of steps T")]
Rate = Annotated[float, Field(gt=0, lt=1, description="convergence rate gamma = 1 - 1/kappa (Eq. 2.6)")]
Sigma = Annotated[float, Field(ge=0, allow_inf_nan=False)]


@SCHEDULES.register("uniform", "sigma_t^2 = T/R (Thm 3)")
class UniformParams(ScheduleParams):
    """Parameters of the uniform schedule (Thm 3)."""

    R: Budget
    T: Steps

    def build(self) -> PredefinedSchedule:
        """The :func:`uniform_sigmas` as a :class:`PredefinedSchedule`."""
        return PredefinedSchedule(tuple(uniform_sigmas(self.R, self.T)))


@SCHEDULES.register("dynamic", "GD-optimal exponentially decaying sigma_t (Thm 4, corrected)")
class DynamicParams(ScheduleParams):
    """Parameters of the GD-optimal dynamic schedule (Thm 4, corrected)."""

    R: Budget
    T: Steps
    gamma: Rate

    def build(self) -> PredefinedSchedule:
        """The :func:`gd_dynamic_sigmas` as a :class:`PredefinedSchedule`."""
        return PredefinedSchedule(tuple(gd_dynamic_sigmas(self.R, self.T, self.gamma)))


@SCHEDULES.register("momentum_dynamic", "momentum-optimal sigma_t (Thm 7: Lemma 1 on q_i^mom)")
class MomentumDynamicParams(ScheduleParams):
    """Parameters of the momentum-optimal dynamic schedule (Thm 7)."""

    R: Budget
    T: Steps
    beta: float = Field(ge=0, lt=1, description="momentum beta of Eq. 2.3")
    gamma: Rate

    def build(self) -> PredefinedSchedule:
        """The :func:`momentum_dynamic_sigmas` as a :class:`PredefinedSchedule`."""
        return PredefinedSchedule(tuple(momentum_dynamic_sigmas(self.R, self.T, self.beta, self.gamma)))


class _DecayParams(ScheduleParams):
    """Decay families: absolute sigmas (run until the budget is exhausted), or, with both
    R and T, the shape over T steps normalised to spend exactly R."""

    sigma0: float = Field(10.0, gt=0, allow_inf_nan=False, description="initial sigma")
    steps_per_epoch: int = Field(1, ge=1, description="steps sharing one epoch index")
    R: Budget | None = None  # with T: normalise the shape over T steps to spend exactly R
    T: Steps | None = None

    @model_validator(mode="after")
    def _both_or_neither(self) -> "_DecayParams":
        if (self.R is None) != (self.T is None):
            raise ValueError("give both R and T to normalise the schedule to the budget, or neither")
        return self

    def shape(self) -> Callable[[int | np.ndarray], np.ndarray | float]:
        raise NotImplementedError

    def build(self) -> NoiseSchedule:
        shape = self.shape()
        if self.R is None or self.T is None:
            return EpochDecaySchedule(shape, self.steps_per_epoch)
        epochs = np.arange(self.T) // self.steps_per_epoch
        return PredefinedSchedule(tuple(normalise_to_budget(shape(epochs), self.R)))


@SCHEDULES.register("time_decay", "sigma_e = sigma0 / (1 + k e)")
class TimeDecayParams(_DecayParams):
    """Parameters of the ``time_decay`` schedule, ``sigma_e = sigma0 / (1 + k e)``."""

    k: float = Field(0.05, ge=0, allow_inf_nan=False)

    def shape(self) -> Callable[[int | np.ndarray], np.ndarray | float]:
        """:func:`time_decay` with these parameters, as a function of the epoch."""
        return partial(time_decay, sigma0=self.sigma0, k=self.k)


@SCHEDULES.register("exp_decay", "sigma_e = sigma0 exp(-k e)")
class ExpDecayParams(_DecayParams):
    """Parameters of the ``exp_decay`` schedule, ``sigma_e = sigma0 exp(-k e)``."""

    k: float = Field(0.01, ge=0, allow_inf_nan=False)

    def shape(self) -> Callable[[int | np.ndarray], np.ndarray | float]:
        """:func:`exp_decay` with these parameters, as a function of the epoch."""
        return partial(exp_decay, sigma0=self.sigma0, k=self.k)


@SCHEDULES.register("step_decay", "sigma_e = sigma0 k^floor(e/period)")
class StepDecayParams(_DecayParams):
    """Parameters of the ``step_decay`` schedule, ``sigma_e = sigma0 k^floor(e/period)``."""

    k: float = Field(0.6, gt=0, le=1)
    period: int = Field(10, ge=1)

    def shape(self) -> Callable[[int | np.ndarray], np.ndarray | float]:
        """:func:`step_decay` with these parameters, as a function of the epoch."""
        return partial(step_decay, sigma0=self.sigma0, k=self.k, period=self.period)


@SCHEDULES.register("poly_decay", "sigma_e = (sigma0 - sigma_final)(1 - e/period)^k + sigma_final")
class PolyDecayParams(_DecayParams):
    """Parameters of the ``poly_decay`` schedule (:func:`poly_decay`)."""

    sigma_final: float = Field(2.0, gt=0, allow_inf_nan=False)
    k: float = Field(3.0, gt=0, allow_inf_nan=False)
    period: int = Field(100, ge=1)

    def shape(self) -> Callable[[int | np.ndarray], np.ndarray | float]:
        """:func:`poly_decay` with these parameters, as a function of the epoch."""
        return partial(poly_decay, sigma0=self.sigma0, sigma_final=self.sigma_final, k=self.k, period=self.period)


@SCHEDULES.register("validation", "sigma <- k sigma when validation accuracy plateaus")
class ValidationParams(ScheduleParams):
    """Parameters of the validation-plateau schedule (:class:`ValidationPlateauSchedule`)."""

    sigma0: float = Field(10.0, gt=0, allow_inf_nan=False)
    k: float = Field(gt=0, le=1, description="sigma multiplier on a plateau (pass it explicitly)")
    period: int = Field(10, ge=1)
    m: int = Field(5, ge=1)
    delta_v: float = Field(0.01, allow_inf_nan=False)

    @model_validator(mode="after")
    def _window_fits(self) -> "ValidationParams":
        if self.m > self.period:
            raise ValueError(f"m ({self.m}) must not exceed period ({self.period})")
        return self

    def build(self) -> ValidationPlateauSchedule:
        """A fresh :class:`ValidationPlateauSchedule` starting at ``sigma0``."""
        return ValidationPlateauSchedule(self.sigma0, self.k, self.period, self.m, self.delta_v)


@SCHEDULES.register("predefined", "a given list of sigmas, one per epoch")
class PredefinedParams(ScheduleParams):
    """Parameters of the predefined schedule: a given list of sigmas, one per epoch."""

    sigmas: list[Sigma] = Field(min_length=1)
    steps_per_epoch: int = Field(1, ge=1)

    def build(self) -> PredefinedSchedule:
        """A :class:`PredefinedSchedule` of ``sigmas`` with ``steps_per_epoch``."""
        return PredefinedSchedule(tuple(self.sigmas), self.steps_per_epoch)


def make_schedule(name: str, **params: float | int | list[float] | None) -> NoiseSchedule:
    """Build a registered schedule; bad parameters raise a ValueError naming the field."""
    try:
        spec = SCHEDULES.get(name).model_validate(params)
    except ValidationError as err:
        raise ValueError(f"noise schedule '{name}': {format_validation_error(err)}") from None
    return spec.build()


# --------------------------------------------------------------------------------------
# Schedules over the rounds of a federated run


#: Schedules whose sigma depends on feedback during training: their noise cannot be
#: planned (and calibrated) before a run starts.
ADAPTIVE_SCHEDULES = frozenset({"validation"})
#: Schedules whose length and budget the run sets (``R`` is irrelevant: only the shape is used).
_RUN_SETS = ("R", "T")


def round_shape(name: str, rounds: int, **options: float | int | list[float]) -> np.ndarray:
    """The shape of sigma over ``rounds`` rounds for schedule ``name`` (one entry per round).

    Only the shape matters: a run scales it so that its accountant spends the budget
    exactly by the last round (:func:`fedveil.privacy.calibrate_noise_schedule`).
    ``R`` and ``T`` are set by the run; the decay families use their normalised form.
    ``"constant"`` is the uniform schedule.
    """
    checks.integer("rounds", rounds, minimum=1)
    given = sorted(set(options) & set(_RUN_SETS))
    if given:
        raise ValueError(f"noise schedule '{name}': the run sets R and T (budget and rounds); drop {', '.join(given)}")
    if name in ADAPTIVE_SCHEDULES:
        raise ValueError(
            f"noise schedule '{name}' reacts to validation accuracy during training, so its noise cannot be "
            "planned and accounted before the run; use it with fedveil.privacy.train_dp_gd"
        )
    if name == "constant":
        if options:
            raise ValueError(f"noise schedule 'constant' takes no options, got {sorted(options)}")
        return np.ones(rounds)
    takes_budget = "R" in SCHEDULES.get(name).model_fields
    schedule = make_schedule(name, **options, **({"R": 1.0, "T": rounds} if takes_budget else {}))
    if schedule.num_steps is not None and schedule.num_steps < rounds:
        raise ValueError(f"noise schedule '{name}' defines {schedule.num_steps} rounds, fewer than the run's {rounds}")
    shape = np.array([schedule.sigma(r) for r in range(rounds)])
    if np.any(shape <= 0):
        raise ValueError(f"noise schedule '{name}' has a zero sigma (a non-private round); every round must be noised")
    return shape


def quantise_shape(shape: np.ndarray, levels: int = 8) -> np.ndarray:
    """Round a positive shape to at most ``levels`` values, geometrically spaced between its
    min and max (nearest in log scale); a shape with at most ``levels`` distinct values is
    returned as it is. An accountant pays per distinct noise multiplier, so this bounds
    the cost of calibrating and recording a long schedule."""
    s = checks.positive_vector("shape", shape)
    checks.integer("levels", levels, minimum=1)
    if len(np.unique(s)) <= levels:
        return s.copy()
    lo, hi = math.log(s.min()), math.log(s.max())
    if levels == 1:
        return np.full(s.size, math.exp(0.5 * (lo + hi)))
    step = (hi - lo) / (levels - 1)
    return np.exp(lo + np.round((np.log(s) - lo) / step) * step)
