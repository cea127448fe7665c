"""ERUB of private GD and its best T (Hong, dissertation Ch. 2, §2.4) against the derived targets of spec §1.9."""
import math

import numpy as np
import pytest

from fedveil.theory.gd_risk_bounds import (
    best_T_dynamic,
    best_T_uniform,
    closed_form_T_dynamic,
    closed_form_T_uniform,
    erub_dynamic,
    erub_uniform,
)


@pytest.mark.parametrize(
    "alpha, uni, dyn",
    [
        (1e-6, (88, 9.740e-4), (150, 3.796e-4)),
        (1e-5, (66, 7.549e-3), (106, 3.783e-3)),
        (1e-8, (132, 1.411e-5), (237, 3.797e-6)),
    ],
)
def test_numeric_best_T(alpha, uni, dyn):
    T_u, e_u = best_T_uniform(alpha, 10)
    T_d, e_d = best_T_dynamic(alpha, 10)
    assert T_u == uni[0] and e_u == pytest.approx(uni[1], rel=1e-3)
    assert T_d == dyn[0] and e_d == pytest.approx(dyn[1], rel=1e-3)
    assert e_u == pytest.approx(erub_uniform(T_u, alpha, 10))


@pytest.mark.parametrize("alpha, kappa", [(1e-6, 10), (1e-4, 1000), (1e-3, 3)])
def test_best_T_dynamic_brackets_the_stationary_point(alpha, kappa):
    g = 1 - 1 / kappa
    x = alpha / ((1 - math.sqrt(g)) ** 2 + alpha)  # d ERUB_dyn / dT = 0 at gamma^{T/2} = x
    t_star = 2 * math.log(x) / math.log(g)
    assert best_T_dynamic(alpha, kappa)[0] in (math.floor(t_star), math.ceil(t_star))


def test_erub_dynamic_limit_and_ordering():
    alpha, g = 1e-6, 0.9
    assert erub_dynamic(10**5, alpha, 10) == pytest.approx(alpha / (1 - math.sqrt(g)) ** 2, rel=1e-9)
    assert alpha / (1 - math.sqrt(g)) ** 2 == pytest.approx(379.7 * alpha, rel=1e-4)
    T = np.arange(1, 300)
    assert np.all(erub_dynamic(T, alpha, 10) <= erub_uniform(T, alpha, 10) + 1e-15)  # Lemma 1 vs uniform


def test_closed_form_T():
    # ln(1 + ln(1/0.9)/1e-6) / ln(1/0.9) = 109.77; 2 * 10 * ln(1 + 1e5) = 230.26
    assert closed_form_T_uniform(1e-6, 10) == 110
    assert closed_form_T_dynamic(1e-6, 10) == 231


@pytest.mark.parametrize(
    "call",
    [
        lambda: erub_uniform(10, 1e-6, 0.5),
        lambda: erub_dynamic(10, 0.0, 10),
        lambda: closed_form_T_uniform(1e-6, 1.0),
        lambda: closed_form_T_dynamic(-1.0, 10),
        lambda: best_T_uniform(1e-6, float("nan")),
    ],
)
def test_bad_input_raises_value_error(call):
    with pytest.raises(ValueError):
        call()
