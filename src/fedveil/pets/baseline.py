"""The organisers' SIR baseline (spec 002 §4.5, examples_src ``sir_model.py``).

From a silo's daily counts: ``x_t = I_t S_t / N`` and ``y_t`` = the number of S -> I events on
days ``t+1 .. t+lookahead``, for every day ``t`` whose lookahead lies inside the data;
``beta = sum_t x_t y_t / sum_t x_t^2`` (least squares through the origin). An S -> I event on
day ``d`` is a person S on day ``d-1`` and I on day ``d``. Every person gets the same risk
``beta * I_last / N``. The federated version adds the silos' numerators and denominators
(:meth:`SIRBaseline.combine`) and each silo predicts with its own ``I_last / N``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .tables import STATE_CODE

S_CODE, I_CODE = STATE_CODE["S"], STATE_CODE["I"]


@dataclass(frozen=True)
class SIRBaseline:
    """The fitted SIR baseline: numerator and denominator of beta's least-squares fit, and the lookahead in days."""

    numerator: float
    denominator: float
    lookahead: int = 7

    @property
    def beta(self) -> float:
        """beta = numerator / denominator; a ValueError when no day had infected and susceptible people."""
        if self.denominator <= 0:
            raise ValueError("the SIR baseline saw no day with infected and susceptible people (denominator 0)")
        return self.numerator / self.denominator

    @classmethod
    def fit(cls, states: np.ndarray, lookahead: int = 7) -> "SIRBaseline":
        """Fit on a ``(people, days)`` matrix of S/I/R codes."""
        if lookahead < 1:
            raise ValueError(f"lookahead must be >= 1, got {lookahead}")
        people, days = states.shape
        if days <= lookahead:
            raise ValueError(f"need more than lookahead={lookahead} days, got {days}")
        s = (states == S_CODE).sum(axis=0).astype(float)
        i = (states == I_CODE).sum(axis=0).astype(float)
        events = np.zeros(days)
        events[1:] = ((states[:, :-1] == S_CODE) & (states[:, 1:] == I_CODE)).sum(axis=0)
        cum = np.concatenate([[0.0], np.cumsum(events)])
        t = np.arange(days - lookahead)
        y = cum[t + lookahead + 1] - cum[t + 1]  # events on days t+1 .. t+lookahead
        x = i[t] * s[t] / people
        return cls(float(x @ y), float(x @ x), lookahead)

    @staticmethod
    def combine(models: list["SIRBaseline"]) -> "SIRBaseline":
        """Federated fit: sum the silos' numerators and denominators."""
        if not models or len({m.lookahead for m in models}) != 1:
            raise ValueError("combine needs at least one model, all with the same lookahead")
        return SIRBaseline(sum(m.numerator for m in models), sum(m.denominator for m in models), models[0].lookahead)

    def predict(self, states: np.ndarray) -> np.ndarray:
        """The same risk ``beta * I_last / N`` for every person of ``states``."""
        people = len(states)
        infected = float((states[:, -1] == I_CODE).sum())
        return np.full(people, self.beta * infected / people)
