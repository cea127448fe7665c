"""The organisers' SIR baseline (spec 002 §4.5) on a hand-made series."""
from __future__ import annotations

import numpy as np
import pytest

from fedveil.pets.baseline import SIRBaseline

S, I, R = 0, 1, 2


def series():
    """4 people, 6 days (0..5):
    p0: S S I I R R   (S->I event on day 2)
    p1: I I R R R R
    p2: S S S I I I   (event on day 3)
    p3: S S S S S S
    daily S = 3 3 2 1 1 1, I = 1 1 1 2 1 1; events by day: 0 0 1 1 0 0.
    """
    return np.array([
        [S, S, I, I, R, R],
        [I, I, R, R, R, R],
        [S, S, S, I, I, I],
        [S, S, S, S, S, S],
    ])


def test_beta_by_hand():
    """lookahead 2 -> days t = 0..3: x_t = I S / N = 3/4, 3/4, 2/4, 2/4; y_t = events on t+1..t+2 = 1, 2, 1, 0.
    numerator = 3/4 + 6/4 + 2/4 + 0 = 11/4; denominator = 9/16 + 9/16 + 4/16 + 4/16 = 26/16."""
    model = SIRBaseline.fit(series(), lookahead=2)
    assert model.numerator == pytest.approx(11 / 4)
    assert model.denominator == pytest.approx(26 / 16)
    assert model.beta == pytest.approx((11 / 4) / (26 / 16))
    # everyone gets beta * I_last / N = beta * 1/4
    np.testing.assert_allclose(model.predict(series()), np.full(4, model.beta / 4))


def test_federated_fit_sums_numerators_and_denominators():
    a = SIRBaseline.fit(series(), lookahead=2)
    b = SIRBaseline.fit(series()[[0, 3]], lookahead=2)  # p0, p3: S = 2 2 1 1, I = 0 0 1 1 -> x = 0 0 1/2 1/2, y = 1 1 0 0
    assert (b.numerator, b.denominator) == (0.0, 0.5)
    both = SIRBaseline.combine([a, b])
    assert both.beta == pytest.approx((11 / 4) / (26 / 16 + 0.5))


def test_errors():
    with pytest.raises(ValueError, match="lookahead"):
        SIRBaseline.fit(series(), lookahead=6)
    with pytest.raises(ValueError, match="denominator 0"):
        SIRBaseline.fit(np.zeros((3, 10), dtype=int)).beta
    with pytest.raises(ValueError, match="same lookahead"):
        SIRBaseline.combine([SIRBaseline(1, 1, 7), SIRBaseline(1, 1, 3)])
