"""Noise schedules of Hong's dissertation Ch. 2 against the derived targets of spec §1.9."""
import math

import numpy as np
import pytest

from fedveil.privacy.schedules import (
    BudgetExhaustedError,
    BudgetTracker,
    PredefinedSchedule,
    ValidationPlateauSchedule,
    budgeted_sigmas,
    exp_decay,
    gd_dynamic_sigmas,
    make_schedule,
    momentum_dynamic_sigmas,
    momentum_influence,
    normalise_to_budget,
    optimal_sigmas,
    poly_decay,
    run_until_exhausted,
    step_decay,
    time_decay,
    uniform_sigmas,
)

R = 0.392704  # (eps, delta) = (4, 1e-8): rho = 0.196352, R = 2 rho


def budget_of(sigmas):
    return float(np.sum(1.0 / np.asarray(sigmas) ** 2))


# ----------------------------------------------------------------- closed forms (§1.4)


@pytest.mark.parametrize("T, sigma", [(50, 11.284), (100, 15.958), (150, 19.544)])
def test_uniform_targets(T, sigma):
    s = uniform_sigmas(R, T)
    assert s.shape == (T,)
    np.testing.assert_allclose(s, sigma, atol=5e-4)
    assert budget_of(s) == pytest.approx(R, rel=1e-12)


@pytest.mark.parametrize(
    "gamma, T, first, last", [(0.99, 100, 18.166, 14.166), (0.95, 100, 34.291, 9.635), (0.9, 50, 24.671, 6.787)]
)
def test_gd_dynamic_targets(gamma, T, first, last):
    s = gd_dynamic_sigmas(R, T, gamma)
    assert s[0] == pytest.approx(first, abs=5e-4)
    assert s[-1] == pytest.approx(last, abs=5e-4)
    assert budget_of(s) == pytest.approx(R, rel=1e-12)
    # equals Lemma 1 with influence gamma^{T-t}, and decays as sigma_1 gamma^{(t-1)/4}
    t = np.arange(1, T + 1)
    np.testing.assert_allclose(s, optimal_sigmas(gamma ** (T - t), R), rtol=1e-12)
    np.testing.assert_allclose(s, s[0] * gamma ** ((t - 1) / 4), rtol=1e-12)


def test_optimal_sigmas_attains_lemma_1_minimum():
    q = np.random.default_rng(0).uniform(0.01, 3.0, size=40)
    s = optimal_sigmas(q, R)
    assert budget_of(s) == pytest.approx(R, rel=1e-12)
    best = R * np.sum(q * s**2)
    assert best == pytest.approx(np.sum(np.sqrt(q)) ** 2, rel=1e-12)
    # budget share proportional to sqrt(q_t)
    np.testing.assert_allclose(1 / s**2, R * np.sqrt(q) / np.sqrt(q).sum(), rtol=1e-12)
    assert R * np.sum(q * uniform_sigmas(R, 40) ** 2) > best  # uniform is worse for unequal q


# ------------------------------------------------------------------- momentum (§1.5)


def u3(sigmas, beta, gamma):
    """U_3 of Thm 5 summed the way it is printed (outer t, inner i)."""
    T = len(sigmas)
    total = 0.0
    for t in range(1, T + 1):
        inner = sum(beta ** (2 * (t - i)) * sigmas[i - 1] ** 2 for i in range(1, t + 1))
        total += gamma ** (T - t) * ((1 - beta) / (1 - beta**t)) ** 2 * inner
    return total


def test_momentum_influence_is_the_coefficient_of_sigma_squared_in_u3():
    beta, gamma, T = 0.7, 0.97, 12
    q = momentum_influence(T, beta, gamma)
    sig = np.random.default_rng(1).uniform(0.5, 2.0, size=T)
    assert np.dot(q, sig**2) == pytest.approx(u3(sig, beta, gamma), rel=1e-12)


def test_momentum_influence_beta_09_gamma_099():
    q = momentum_influence(100, 0.9, 0.99)
    assert q[0] == pytest.approx(0.535, abs=5e-4)
    assert q[-1] == pytest.approx(0.010, abs=5e-4)
    assert np.argmax(q) == 0 and np.argmin(q) == 99
    assert np.all(np.diff(q[:26]) < 0)  # decreasing over the first quarter (a bump follows near t ~ 86)
    assert np.all(np.diff(momentum_influence(30, 0.9, 0.99)) < 0)  # strictly decreasing for T = 30
    s = momentum_dynamic_sigmas(R, 100, 0.9, 0.99)
    assert budget_of(s) == pytest.approx(R, rel=1e-12)
    assert np.argmin(s) == 0 and np.argmax(s) == 99  # "counterintuitively ... increasing"


def test_momentum_influence_is_u_shaped_for_beta_05_gamma_095():
    q = momentum_influence(100, 0.5, 0.95)
    assert np.argmin(q) == 4  # i = 5
    assert np.all(np.diff(q[:5]) < 0) and np.all(np.diff(q[4:98]) > 0)


def test_momentum_with_beta_zero_is_gd():
    np.testing.assert_allclose(momentum_influence(30, 0.0, 0.9), 0.9 ** (30 - np.arange(1, 31)), rtol=1e-12)
    np.testing.assert_allclose(momentum_dynamic_sigmas(R, 30, 0.0, 0.9), gd_dynamic_sigmas(R, 30, 0.9), rtol=1e-12)


# ------------------------------------------------------------------ decay families (§1.8)


def test_decay_shapes_by_hand():
    assert time_decay(10, 10.0, 0.05) == pytest.approx(20 / 3)
    assert exp_decay(100, 10.0, 0.01) == pytest.approx(10 / math.e)
    np.testing.assert_allclose(step_decay(np.array([0, 9, 10, 25]), 10.0, 0.6, 10), [10, 10, 6, 3.6])
    np.testing.assert_allclose(poly_decay(np.array([0, 50, 100, 150]), 10.0, 2.0, 3.0, 100), [10, 3, 2, 2])


def test_registry_defaults_and_epochs():
    s = make_schedule("time_decay")
    assert s.num_steps is None and s.sigma(0) == 10 and s.sigma(10) == pytest.approx(20 / 3)
    s = make_schedule("step_decay", sigma0=8.0, k=0.5, period=1, steps_per_epoch=5)
    assert [s.sigma(i) for i in (0, 4, 5, 10)] == [8, 8, 4, 2]
    assert make_schedule("poly_decay").sigma(50) == pytest.approx(3.0)
    assert make_schedule("exp_decay").sigma(100) == pytest.approx(10 / math.e)


def test_registry_matches_the_functions():
    np.testing.assert_allclose(_all(make_schedule("uniform", R=R, T=50)), uniform_sigmas(R, 50))
    np.testing.assert_allclose(_all(make_schedule("dynamic", R=R, T=50, gamma=0.9)), gd_dynamic_sigmas(R, 50, 0.9))
    momentum = make_schedule("momentum_dynamic", R=R, T=20, beta=0.9, gamma=0.99)
    np.testing.assert_allclose(_all(momentum), momentum_dynamic_sigmas(R, 20, 0.9, 0.99))


def _all(schedule):
    return np.array([schedule.sigma(i) for i in range(schedule.num_steps)])


def test_normalise_to_budget():
    shape = step_decay(np.arange(30), 10.0, 0.6, 10)
    s = normalise_to_budget(shape, R)
    assert budget_of(s) == pytest.approx(R, rel=1e-12)
    np.testing.assert_allclose(s / shape, s[0] / shape[0])
    normalised = make_schedule("step_decay", R=R, T=30)
    assert normalised.num_steps == 30
    np.testing.assert_allclose(_all(normalised), s)


def test_predefined_schedule_by_epoch():
    s = make_schedule("predefined", sigmas=[3.0, 2.0], steps_per_epoch=2)
    assert s.num_steps == 4 and [s.sigma(i) for i in range(4)] == [3, 3, 2, 2]
    with pytest.raises(IndexError):
        s.sigma(4)


def test_validation_plateau_schedule():
    s = ValidationPlateauSchedule(sigma0=4.0, k=0.5, period=3, m=2, delta_v=0.01)
    accs = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6]
    seen = []
    for a in accs:
        s.record(a)
        seen.append(s.sigma(123))
    # checks at 6 (gain 0.55 - 0.25) and 9 (0.6 - 0.55) pass; at 12 the gain is 0 < 0.01
    assert seen == [4.0] * 11 + [2.0]
    flat = make_schedule("validation", sigma0=4.0, k=0.5, period=3, m=2)
    for _ in range(6):
        flat.record(0.5)
    assert flat.sigma(0) == 2.0  # no check at the end of the first period, one at 6


# ------------------------------------------------------------- budget tracking (Alg. 2.1)


def test_run_until_exhausted_stops_at_the_right_step():
    s = make_schedule("time_decay", sigma0=2.0, k=1.0)  # costs (1+e)^2/4: 0.25, 1, 2.25, 4 -> cumsum 0.25, 1.25, 3.5
    assert len(run_until_exhausted(s, 3.5)) == 3
    assert len(run_until_exhausted(s, 3.4)) == 2
    assert len(run_until_exhausted(s, 0.2)) == 0
    assert len(run_until_exhausted(make_schedule("exp_decay", sigma0=2.0, k=0.0), 1.0)) == 4


@pytest.mark.parametrize(
    "name, extra", [("uniform", {}), ("dynamic", {"gamma": 0.95}), ("momentum_dynamic", {"beta": 0.9, "gamma": 0.99})]
)
def test_normalised_schedules_spend_the_budget_in_exactly_T_steps(name, extra):
    s = make_schedule(name, R=R, T=100, **extra)
    assert len(run_until_exhausted(s, R)) == 100
    assert len(run_until_exhausted(s, R * (1 - 1e-6))) == 99


def test_budget_tracker():
    tr = BudgetTracker(1.0)
    tr.spend(2.0)
    assert tr.residual == pytest.approx(0.75)
    assert not tr.can_afford(1.0) and tr.can_afford(math.sqrt(1 / 0.75))
    with pytest.raises(BudgetExhaustedError):
        tr.spend(1.0)
    assert not tr.can_afford(0.0)  # sigma = 0 costs infinity
    free = BudgetTracker(None)
    free.spend(0.0)
    assert free.spent == math.inf and free.residual == math.inf


def test_budgeted_sigmas_is_lazy_for_stateful_schedules():
    s = ValidationPlateauSchedule(sigma0=1.0, k=0.5, period=1, m=1)
    out = []
    for sigma in budgeted_sigmas(s, BudgetTracker(None), max_steps=4):
        out.append(sigma)
        s.record(0.3)  # flat: halve at every record after the first
    assert out == [1.0, 1.0, 0.5, 0.25]
    with pytest.raises(ValueError, match="budget or max_steps"):
        next(budgeted_sigmas(s, BudgetTracker(None)))


# ----------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "call",
    [
        lambda: uniform_sigmas(0.0, 10),
        lambda: uniform_sigmas(R, 0),
        lambda: gd_dynamic_sigmas(R, 10, 1.0),
        lambda: gd_dynamic_sigmas(-1.0, 10, 0.9),
        lambda: momentum_influence(10, 1.0, 0.9),
        lambda: optimal_sigmas([1.0, 0.0], R),
        lambda: normalise_to_budget([1.0, -1.0], R),
        lambda: make_schedule("uniform", R=0, T=5),
        lambda: make_schedule("dynamic", R=R, T=5, gamma=1.2),
        lambda: make_schedule("exp_decay", R=R),  # R without T
        lambda: make_schedule("validation", sigma0=1.0),  # k must be given
        lambda: make_schedule("validation", k=0.5, m=20),
        lambda: make_schedule("predefined", sigmas=[1.0, -2.0]),
        lambda: make_schedule("uniform", R=R, T=5, gama=0.9),
        lambda: ValidationPlateauSchedule(sigma0=1.0, k=0.0),
        lambda: PredefinedSchedule(()),
        lambda: PredefinedSchedule((1.0,), steps_per_epoch=0),
    ],
)
def test_bad_input_raises_value_error(call):
    with pytest.raises(ValueError):
        call()


def test_error_messages_name_the_field_and_unknown_names():
    with pytest.raises(ValueError, match="noise schedule 'dynamic': gamma"):
        make_schedule("dynamic", R=R, T=5, gamma=0.0)
    with pytest.raises(KeyError, match="did you mean 'uniform'"):
        make_schedule("unifrom", R=R, T=5)
