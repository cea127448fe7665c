"""FADE's optimality analysis (dissertation §3.4, Eqs. 3.4-3.6, Thm 13; spec 000 §2.5-2.6) on toy
discrete distributions, checked against numbers worked out by hand, brute-force maximisation over D,
and KL / Jensen-Shannon values from scipy."""
import math

import numpy as np
import pytest
from scipy.spatial.distance import jensenshannon
from scipy.special import rel_entr

from fedveil.theory import balanced_minimum, discrepancy, optimal_discriminator, squared_discrepancy

# (alpha1, alpha2, a1 log a1 + a2 log a2 - (a1+a2) log(a1+a2)) worked out by hand:
BALANCED = [
    (1.0, 1.0, -1.3862943611198906),  # 0 + 0 - 2 log 2
    (1.0, 3.0, -2.249340578475233),  # 0 + 3 log 3 - 4 log 4 = 3.2958368660 - 5.5451774445
    (0.2, 0.8, -0.5004024235381879),  # 0.2 log 0.2 + 0.8 log 0.8 - 0 = -0.3218875825 - 0.1785148410
    (2.0, 2.0, -2.772588722239781),  # 2 log 2 + 2 log 2 - 4 log 4 = -4 log 2
    (3.0, 0.5, -1.4354071140094318),  # 3 log 3 + 0.5 log 0.5 - 3.5 log 3.5 = 3.2958368660 - 0.3465735903 - 4.3846703897
]

RATES = [(1.0, 1.0), (1.0, 3.0), (0.05, 0.95), (0.3, 2.0), (4.0, 0.1)]


def toy_pair(seed: int, size: int = 6) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    p1, p2 = rng.dirichlet(np.ones(size)), rng.dirichlet(np.ones(size))
    return p1, p2


def kl(p, q):
    return float(rel_entr(p, q).sum())


# --- Thm 13: the minimum at p1 = p2 ---


@pytest.mark.parametrize("a1, a2, value", BALANCED)
def test_balanced_minimum_hand_values(a1, a2, value):
    assert balanced_minimum(a1, a2) == pytest.approx(value, rel=1e-12)


@pytest.mark.parametrize("a1, a2, value", BALANCED)
@pytest.mark.parametrize("p", [[1.0], [0.5, 0.5], [0.1, 0.0, 0.6, 0.3]])
def test_equal_distributions_reach_the_balanced_minimum(p, a1, a2, value):
    assert discrepancy(p, p, a1, a2) == pytest.approx(value, rel=1e-12)
    # D* is the constant prior a1/(a1+a2) wherever p1 = p2 (also where both are 0, by convention).
    assert np.allclose(optimal_discriminator(p, p, a1, a2), a1 / (a1 + a2))


@pytest.mark.parametrize("a1, a2", RATES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_different_distributions_lie_strictly_above_the_minimum(seed, a1, a2):
    p1, p2 = toy_pair(seed)
    assert discrepancy(p1, p2, a1, a2) > balanced_minimum(a1, a2) + 1e-6
    # Only a shift of mass between two z values: still strictly larger.
    q = np.array([0.25, 0.25, 0.5])
    assert discrepancy(q, [0.3, 0.2, 0.5], a1, a2) > balanced_minimum(a1, a2)


def test_disjoint_supports_give_zero_discrepancy():
    # A perfect discriminator (D = 1 on p1's support, 0 on p2's): both log terms vanish.
    assert discrepancy([0.4, 0.6, 0.0], [0.0, 0.0, 1.0], 2.0, 0.5) == 0.0
    assert optimal_discriminator([0.4, 0.6, 0.0], [0.0, 0.0, 1.0], 2.0, 0.5).tolist() == [1.0, 1.0, 0.0]


# --- Eq. 3.5: D* maximises Eq. 3.4 ---


@pytest.mark.parametrize("a1, a2", [(1.0, 1.0), (0.1, 0.9), (2.0, 0.5)])
def test_optimal_discriminator_beats_a_grid_of_discriminators(a1, a2):
    p1, p2 = np.array([0.5, 0.3, 0.2]), np.array([0.1, 0.3, 0.6])
    grid = np.linspace(0.01, 0.99, 99)
    d = np.stack(np.meshgrid(grid, grid, grid, indexing="ij"), axis=-1).reshape(-1, 3)
    # Eq. 3.4 objective for every grid discriminator, written out here.
    values = a1 * (p1 * np.log(d)).sum(1) + a2 * (p2 * np.log(1 - d)).sum(1)
    best = int(np.argmax(values))
    d_star = optimal_discriminator(p1, p2, a1, a2)
    # By hand: D*(z) = a1 p1 / (a1 p1 + a2 p2) at each z.
    assert d_star == pytest.approx(a1 * p1 / (a1 * p1 + a2 * p2))
    assert discrepancy(p1, p2, a1, a2) >= values.max()
    assert discrepancy(p1, p2, a1, a2) == pytest.approx(values.max(), abs=1e-3)  # grid step 0.01
    assert np.abs(d[best] - d_star).max() <= 0.01
    # The function evaluates a given D the same way.
    for row in (0, best, len(d) // 3):
        assert discrepancy(p1, p2, a1, a2, d=d[row]) == pytest.approx(values[row], rel=1e-12)


def test_a_discriminator_that_is_certain_and_wrong_gives_minus_infinity():
    p1, p2 = [0.5, 0.5], [0.5, 0.5]
    assert discrepancy(p1, p2, 1.0, 1.0, d=[0.0, 0.5]) == -math.inf
    assert discrepancy(p1, p2, 1.0, 1.0, d=[0.5, 1.0]) == -math.inf
    # 0 log 0 = 0: D = 1 where p2 has no mass costs nothing.
    value = discrepancy([0.5, 0.5], [1.0, 0.0], 1.0, 1.0, d=[0.5, 1.0])
    assert value == pytest.approx(0.5 * math.log(0.5) + math.log(0.5))


# --- the KL decomposition of Thm 13's proof, and the erratum ---


@pytest.mark.parametrize("a1, a2", RATES)
@pytest.mark.parametrize("seed", [3, 4])
def test_kl_decomposition(seed, a1, a2):
    p1, p2 = toy_pair(seed, size=8)
    m = (a1 * p1 + a2 * p2) / (a1 + a2)
    corrected = a1 * math.log(a1) + a2 * math.log(a2) - (a1 + a2) * math.log(a1 + a2)
    assert discrepancy(p1, p2, a1, a2) == pytest.approx(a1 * kl(p1, m) + a2 * kl(p2, m) + corrected, rel=1e-10)


@pytest.mark.parametrize("a1, a2", [(1.0, 1.0), (1.0, 3.0), (0.3, 2.0), (4.0, 0.1)])
def test_the_printed_constant_is_wrong_whenever_the_rates_do_not_sum_to_one(a1, a2):
    p1, p2 = toy_pair(5)
    printed = a1 * math.log(a1) + a2 * math.log(a2) + (a1 + a2) * math.log(a1 + a2)
    m = (a1 * p1 + a2 * p2) / (a1 + a2)
    assert abs(discrepancy(p1, p1, a1, a2) - printed) > 0.1
    assert abs(discrepancy(p1, p2, a1, a2) - (a1 * kl(p1, m) + a2 * kl(p2, m) + printed)) > 0.1
    assert balanced_minimum(a1, a2) != pytest.approx(printed)


def test_equal_rates_give_the_jensen_shannon_divergence():
    # a1 = a2 = 1: D~ = 2 JSD(p1, p2) - 2 log 2 (Goodfellow et al. 2014, Thm 1).
    p1, p2 = toy_pair(6)
    jsd = jensenshannon(p1, p2) ** 2  # scipy returns the JS distance (natural log)
    assert discrepancy(p1, p2, 1.0, 1.0) == pytest.approx(2 * jsd - 2 * math.log(2), rel=1e-10)


# --- Eq. 3.6, squared variant ---


def test_squared_discrepancy_hand_values():
    p1, p2, d = [0.5, 0.5], [0.25, 0.75], [0.8, 0.4]
    # E_p1[log D] = 0.5 log 0.8 + 0.5 log 0.4 = -0.1115718 - 0.4581454 = -0.5697171
    # E_p2[log(1 - D)] = 0.25 log 0.2 + 0.75 log 0.6 = -0.4023595 - 0.3831192 = -0.7854787
    e1, e2 = -0.5697171, -0.7854787
    assert squared_discrepancy(p1, p2, 0.1, 0.9, d) == pytest.approx(0.1 * e1**2 + 0.9 * e2**2, rel=1e-6)
    assert discrepancy(p1, p2, 0.1, 0.9, d) == pytest.approx(0.1 * e1 + 0.9 * e2, rel=1e-6)


def test_squared_discrepancy_of_a_constant_discriminator():
    # D = c everywhere: a1 log^2 c + a2 log^2(1 - c), whatever p1 and p2.
    p1, p2 = toy_pair(7)
    c = 0.3
    expected = 2.0 * math.log(c) ** 2 + 0.5 * math.log(1 - c) ** 2
    assert squared_discrepancy(p1, p2, 2.0, 0.5, np.full(6, c)) == pytest.approx(expected, rel=1e-12)
    assert squared_discrepancy([1.0, 0.0], [0.0, 1.0], 1.0, 1.0, [1.0, 0.0]) == 0.0
    assert squared_discrepancy([0.5, 0.5], [0.5, 0.5], 1.0, 1.0, [0.0, 0.5]) == math.inf


# --- input validation ---


@pytest.mark.parametrize(
    "p1, p2, a1, a2, match",
    [
        ([0.5, 0.4], [0.5, 0.5], 1, 1, r"p1 must sum to 1"),
        ([0.5, 0.5], [1.2, -0.2], 1, 1, r"p2 must be a non-empty array of finite numbers >= 0"),
        ([0.5, np.nan], [0.5, 0.5], 1, 1, r"p1 must be a non-empty array"),
        ([], [], 1, 1, r"p1 must be a non-empty array"),
        ([0.5, 0.5], [0.2, 0.3, 0.5], 1, 1, r"same shape.*\(2,\) and \(3,\)"),
        (["a", "b"], [0.5, 0.5], 1, 1, r"p1 must be an array of probabilities"),
        ([0.5, 0.5], [0.5, 0.5], 0.0, 1, r"alpha1 must be a finite number > 0"),
        ([0.5, 0.5], [0.5, 0.5], 1, -1.0, r"alpha2 must be a finite number > 0"),
        ([0.5, 0.5], [0.5, 0.5], 1, math.inf, r"alpha2 must be a finite number > 0"),
    ],
)
def test_bad_inputs_are_clear_one_line_errors(p1, p2, a1, a2, match):
    for call in (optimal_discriminator, discrepancy):
        with pytest.raises(ValueError, match=match) as err:
            call(p1, p2, a1, a2)
        assert "\n" not in str(err.value)


def test_bad_discriminators_and_rates_are_refused():
    p = [0.5, 0.5]
    with pytest.raises(ValueError, match=r"d must take values in \[0, 1\]"):
        discrepancy(p, p, 1, 1, d=[0.5, 1.5])
    with pytest.raises(ValueError, match=r"d must give D\(z\) at every z value of p1 \(shape \(2,\)\)"):
        squared_discrepancy(p, p, 1, 1, [0.5])
    with pytest.raises(ValueError, match=r"alpha1 must be a finite number > 0"):
        balanced_minimum(0, 1)
