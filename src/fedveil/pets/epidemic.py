"""Discrete-time SIR with asymptomatic infections on a daily-repeating contact network.

The stand-in for the challenge's simulated Virginia outbreak (spec 002 §4.1: "health states
over 63 days ... discrete-time SIR incl. asymptomatic"). Hidden states per person and day:
``S``, ``I`` (symptomatic, infectious), ``A`` (asymptomatic, infectious), ``R`` (recovered
after ``I``), ``Q`` (recovered after ``A``). The *observed* state is what the challenge's
``disease_outcome`` table shows: ``I`` and ``R`` as such, while ``A`` and ``Q`` look like
``S`` (asymptomatic infections are never reported, so they spread unseen).

Day ``t >= 1``: a person who is S on day ``t-1`` becomes infected on day ``t`` with
probability ``1 - exp(-h)`` plus the import probability, where the hazard is
``h = beta_i * sum_j w_ij * infectiousness_j`` over contacts ``j`` infectious on day ``t-1``
(``w_ij``: contact weight, e.g. duration in days times a setting factor; contacts repeat
every day). Each person's course is drawn once: asymptomatic with probability
``asymptomatic_fraction``, infectious for a uniform number of days in ``infectious_days``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import scipy.sparse as sp

from .tables import NUM_DAYS, PRED_DAYS

S, I, R, A, Q = 0, 1, 2, 3, 4
OBSERVED = np.array([0, 1, 2, 0, 0], dtype=np.int8)  # hidden state -> S/I/R code of the tables


@dataclass(frozen=True)
class EpidemicConfig:
    """Settings of the simulated outbreak: days, transmissibility (or the attack rate
    it is calibrated to), asymptomatic cases, infectious period, seeding and imports."""

    days: int = NUM_DAYS + PRED_DAYS  # 57 observed days + the hidden week
    transmissibility: float = 0.075  # hazard per day of contact with a symptomatic person
    attack_rate: float | None = 0.04  # if set, calibrate transmissibility: this fraction is ever reported I/R
    asymptomatic_fraction: float = 0.2
    asymptomatic_infectiousness: float = 0.6
    infectious_days: tuple[int, int] = (5, 10)  # inclusive range
    initial_prevalence: float = 0.004
    import_rate: float = 2e-5  # daily probability of an infection from outside the population

    def __post_init__(self) -> None:
        lo, hi = self.infectious_days
        if self.days < 2 or not 1 <= lo <= hi:
            raise ValueError(f"need days >= 2 and 1 <= infectious_days[0] <= [1], got {self.days}, {self.infectious_days}")
        if self.attack_rate is not None and not 0 < self.attack_rate < 1:
            raise ValueError(f"attack_rate must lie in (0, 1), got {self.attack_rate}")
        for name in ("asymptomatic_fraction", "initial_prevalence", "import_rate"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must lie in [0, 1], got {getattr(self, name)}")
        if self.transmissibility <= 0 or self.asymptomatic_infectiousness < 0:
            raise ValueError("need transmissibility > 0 and asymptomatic_infectiousness >= 0")


def simulate_sir(
    contacts: sp.spmatrix,
    susceptibility: np.ndarray,
    initial_prevalence: np.ndarray,
    cfg: EpidemicConfig,
    rng: np.random.Generator,
) -> np.ndarray:
    """Hidden states ``(n, cfg.days)`` (codes S, I, R, A, Q of this module).

    ``contacts``: symmetric ``(n, n)`` contact-weight matrix; ``susceptibility``: per-person
    multiplier of ``cfg.transmissibility`` (e.g. age and region effects); ``initial_prevalence``:
    per-person probability of being infectious on day 0 (with a uniformly elapsed infection).
    """
    n = contacts.shape[0]
    if contacts.shape != (n, n) or susceptibility.shape != (n,) or initial_prevalence.shape != (n,):
        raise ValueError("contacts must be (n, n) and susceptibility, initial_prevalence (n,)")
    contacts = sp.csr_matrix(contacts)
    lo, hi = cfg.infectious_days
    # per-person course of an infection, and per-day uniforms, drawn in fixed-size blocks so
    # that runs with different transmissibilities share their random numbers
    asymptomatic = rng.random(n) < cfg.asymptomatic_fraction
    course = rng.integers(lo, hi + 1, size=n)
    seeded = rng.random(n) < initial_prevalence
    elapsed = rng.integers(0, course)
    uniforms = rng.random((cfg.days, n))

    states = np.zeros((n, cfg.days), dtype=np.int8)
    state = np.full(n, S, dtype=np.int8)
    remaining = np.zeros(n, dtype=np.int64)
    state[seeded] = np.where(asymptomatic[seeded], A, I)
    remaining[seeded] = (course - elapsed)[seeded]
    states[:, 0] = state
    for t in range(1, cfg.days):
        infectiousness = (state == I) + cfg.asymptomatic_infectiousness * (state == A)
        hazard = cfg.transmissibility * susceptibility * (contacts @ infectiousness)
        p = 1.0 - np.exp(-hazard) * (1.0 - cfg.import_rate)
        new = (state == S) & (uniforms[t] < p)
        # recoveries of day t (infections of earlier days end), then the new infections
        active = (state == I) | (state == A)
        remaining[active] -= 1
        done = active & (remaining <= 0)
        state[done & (state == I)] = R
        state[done & (state == A)] = Q
        state[new] = np.where(asymptomatic[new], A, I)
        remaining[new] = course[new]
        states[:, t] = state
    return states


def calibrated_sir(
    contacts: sp.spmatrix,
    susceptibility: np.ndarray,
    initial_prevalence: np.ndarray,
    cfg: EpidemicConfig,
    seed: int,
    iterations: int = 16,
) -> tuple[np.ndarray, float]:
    """:func:`simulate_sir` with ``cfg.transmissibility`` tuned so that a fraction close to
    ``cfg.attack_rate`` of the people is reported I or R on some day; returns the states and
    the transmissibility used.

    Near the epidemic threshold an outbreak's size swings a lot with the transmissibility and
    the random draws, so a fixed transmissibility gives anything from a dying outbreak to a
    saturated one. The attack rate grows (almost) monotonically with the transmissibility
    when every trial uses the same random numbers (``seed``), so a bisection on
    log-transmissibility finds it and makes the data set's class balance predictable.
    Without ``cfg.attack_rate`` this is one run with ``cfg.transmissibility``.
    """
    def run(beta: float) -> tuple[np.ndarray, float]:
        trial = replace(cfg, transmissibility=beta)
        states = simulate_sir(contacts, susceptibility, initial_prevalence, trial, np.random.default_rng(seed))
        return states, float((observed(states) != S).any(axis=1).mean())

    if cfg.attack_rate is None:
        return run(cfg.transmissibility)[0], cfg.transmissibility
    lo, hi = np.log(cfg.transmissibility) - 3.0, np.log(cfg.transmissibility) + 3.0
    best = None
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        states, rate = run(float(np.exp(mid)))
        gap = abs(rate - cfg.attack_rate)
        if best is None or gap < best[0]:
            best = (gap, states, float(np.exp(mid)))
        if rate < cfg.attack_rate:
            lo = mid
        else:
            hi = mid
    return best[1], best[2]


def observed(states: np.ndarray) -> np.ndarray:
    """Hidden states -> the S/I/R codes a ``disease_outcome`` table shows."""
    return OBSERVED[states]


def hidden_week_target(observed_states: np.ndarray, last_observed_day: int = NUM_DAYS - 1) -> np.ndarray:
    """``infected`` of the target table: S on ``last_observed_day`` and I or R on one of the
    days after it (the hidden week)."""
    last = observed_states[:, last_observed_day]
    later = observed_states[:, last_observed_day + 1 :]
    if later.shape[1] == 0:
        raise ValueError("the states end on the last observed day; simulate the hidden week too")
    return ((last == S) & (later != S).any(axis=1)).astype(np.int8)
