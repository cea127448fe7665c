"""zCDP conversions (spec 000 part 1, section 1.2 Lemma 4; targets from section 1.9)."""

import math

import pytest

from fedveil.privacy import zcdp
from fedveil.privacy import (
    budget_from_epsilon_delta,
    epsilon_from_rho,
    rho_from_epsilon_delta,
)


def test_reference_rho_and_budget():
    # Spec section 1.9 / dissertation section 2.5: "0.1963-zCDP, R = 0.3927" for (4, 1e-8).
    assert rho_from_epsilon_delta(4.0, 1e-8) == pytest.approx(0.196352, abs=5e-7)
    assert budget_from_epsilon_delta(4.0, 1e-8) == pytest.approx(0.392704, abs=1e-6)
    assert zcdp.budget_from_rho(0.196352) == pytest.approx(0.392704)
    assert zcdp.rho_from_budget(0.392704) == pytest.approx(0.196352)


def test_corrected_inverse_matches_expanded_form_not_the_typo():
    eps, delta = 4.0, 1e-8
    log_inv = math.log(1 / delta)
    expanded = eps + 2 * log_inv - 2 * math.sqrt(log_inv * (eps + log_inv))
    typo = eps + 2 * log_inv + 2 * math.sqrt(log_inv * (eps + log_inv))
    rho = rho_from_epsilon_delta(eps, delta)
    assert rho == pytest.approx(expanded, rel=1e-9)
    assert typo > eps  # the printed (sign-typo) formula would spend more than epsilon
    assert epsilon_from_rho(typo, delta) > eps


@pytest.mark.parametrize("eps", [1e-3, 0.1, 1.0, 4.0, 10.0, 50.0])
@pytest.mark.parametrize("delta", [1e-10, 1e-5, 1e-2, 0.5])
def test_lemma4_round_trip(eps, delta):
    rho = rho_from_epsilon_delta(eps, delta)
    assert epsilon_from_rho(rho, delta) == pytest.approx(eps, rel=1e-10)
    assert zcdp.epsilon_from_budget(zcdp.budget_from_rho(rho), delta) == pytest.approx(eps, rel=1e-10)


@pytest.mark.parametrize("steps,sigma", [(50, 11.284), (100, 15.958), (150, 19.544)])
def test_uniform_sigma_from_budget(steps, sigma):
    # Spec section 1.9: uniform schedule sigma = sqrt(T / R) with R = 0.392704.
    R = budget_from_epsilon_delta(4.0, 1e-8)
    assert math.sqrt(steps / R) == pytest.approx(sigma, abs=5e-4)
    # T steps at that sigma spend exactly R (step cost 1/sigma^2) i.e. R/2-zCDP by Lemma 3.
    assert steps * 2 * zcdp.gaussian_rho(math.sqrt(steps / R)) == pytest.approx(R)


def test_invalid_inputs():
    for bad_delta in (0.0, 1.0, -1e-5, 2.0, float("nan")):
        with pytest.raises(ValueError, match="delta"):
            rho_from_epsilon_delta(1.0, bad_delta)
        with pytest.raises(ValueError, match="delta"):
            epsilon_from_rho(0.1, bad_delta)
    with pytest.raises(ValueError, match="epsilon"):
        rho_from_epsilon_delta(-1.0, 1e-5)
    with pytest.raises(ValueError, match="rho"):
        epsilon_from_rho(-0.1, 1e-5)
    with pytest.raises(ValueError, match="noise_multiplier"):
        zcdp.gaussian_rho(0.0)
