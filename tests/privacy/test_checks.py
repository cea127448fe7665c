"""The shared argument checks: canonical values back, and messages that name the argument and what it got."""
import math

import numpy as np
import pytest

from fedveil.privacy import checks


def test_values_come_back_canonical():
    assert checks.positive("z", 2) == 2.0 and isinstance(checks.positive("z", 2), float)
    assert checks.positive("z", 0, allow_zero=True) == 0.0
    assert checks.positive("rho", math.inf, allow_inf=True) == math.inf
    assert checks.positive("x", np.float32(0.5)) == 0.5
    assert checks.positive("x", np.array(0.5)) == 0.5
    assert checks.integer("steps", 3.0) == 3 and isinstance(checks.integer("steps", np.int64(3)), int)
    assert checks.fraction("delta", 1e-5) == 1e-5
    assert checks.fraction("q", 1.0, one=True) == 1.0
    assert checks.fraction("beta", 0.0, zero=True) == 0.0
    assert checks.one_of("sampling", "fixed", ("poisson", "fixed")) == "fixed"
    np.testing.assert_array_equal(checks.positive_vector("shape", [1, 2]), [1.0, 2.0])
    np.testing.assert_array_equal(checks.positive_vector("sigmas", (0.0, 1.0), allow_zero=True), [0.0, 1.0])


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: checks.positive("noise_multiplier", 0.0), "noise_multiplier must be a finite number > 0; got 0.0."),
        (lambda: checks.positive("clip", -1, allow_zero=True), "clip must be a finite number >= 0; got -1."),
        (lambda: checks.positive("rho", math.nan, allow_inf=True), "rho must be a number > 0; got nan."),
        (lambda: checks.positive("z", math.inf), "z must be a finite number > 0; got inf."),
        (lambda: checks.positive("z", True), "z must be a real number; got True."),
        (lambda: checks.positive("z", "1"), "z must be a real number; got '1'."),
        (lambda: checks.integer("steps", 2.5), "steps must be an integer >= 0; got 2.5."),
        (lambda: checks.integer("K", 1, minimum=2), "K must be an integer >= 2; got 1."),
        (lambda: checks.fraction("delta", 1.0), "delta must lie in (0, 1); got 1.0."),
        (lambda: checks.fraction("q", 0.0, one=True, hint=" (batch / n)"), "q must lie in (0, 1] (batch / n); got 0.0."),
        (lambda: checks.fraction("beta", 1.0, zero=True), "beta must lie in [0, 1); got 1.0."),
        (lambda: checks.one_of("accountant", "moments", ("rdp", "pld")),
         "accountant must be one of ('rdp', 'pld'); got 'moments'."),
        (lambda: checks.positive_vector("shape", [1.0, -1.0]),
         "shape must be a non-empty 1-d sequence of positive finite numbers; got [1.0, -1.0]."),
        (lambda: checks.positive_vector("shape", [[1.0]]), "shape must be a non-empty 1-d sequence"),
        (lambda: checks.positive_vector("shape", []), "shape must be a non-empty 1-d sequence"),
    ],
)
def test_messages_name_the_argument_and_what_it_got(call, message):
    with pytest.raises(ValueError) as err:
        call()
    assert str(err.value).startswith(message)


def test_long_values_are_cut_in_messages():
    with pytest.raises(ValueError) as err:
        checks.positive_vector("noise_multipliers", [1.0] * 10_000 + [0.0])
    assert len(str(err.value)) < 200
