"""FedFed's feature release (spec 003 §1.6, §1.8): the per-record clip, the rigorous
Gaussian-mechanism epsilon against the analytic Gaussian closed form, the paper's formula
and Eq. 17 against the spec's worked numbers, and KOV composition."""
from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import norm

from fedveil.models.fedfed import clip_to_fraction
from fedveil.privacy import feature_release as fr
from fedveil.privacy.composition import Accountant, releases_epsilon


def test_the_clip_bounds_every_record_and_leaves_small_ones_alone():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(50, 3, 4, 4, generator=g)
    x_s = torch.randn(50, 3, 4, 4, generator=g)
    clipped = clip_to_fraction(x_s, x, 0.2)
    ratio = clipped.flatten(1).norm(dim=1) / x.flatten(1).norm(dim=1)
    assert torch.all(ratio <= 0.2 + 1e-6)
    small = 0.01 * x
    assert torch.equal(clip_to_fraction(small, x, 0.2), small)
    # clipped rows keep their direction
    cos = torch.nn.functional.cosine_similarity(clipped.flatten(1), x_s.flatten(1))
    assert torch.allclose(cos, torch.ones(50), atol=1e-6)


@pytest.mark.parametrize("rho, sigma, m", [(0.01, 0.5, 28.0), (0.02, 0.4, 28.0), (0.005, 1.0, 55.4)])
def test_rigorous_epsilon_is_the_pld_accountants(rho, sigma, m):
    """The closed form against dp-accounting's PLD accountant on the same releases."""
    pld = releases_epsilon(fr.feature_releases(sigma, rho, m), 1e-5, Accountant("pld"))
    assert fr.release_epsilon(sigma, rho, m, 1e-5) == pytest.approx(pld, rel=2e-3, abs=2e-3)


def test_the_spec_worked_example_is_huge():
    """Spec 003 §1.6: rho = 0.1, sigma = 0.15, 32x32x3 -> mu ~ 37 -> eps ~ 839 at 1e-5."""
    assert fr.release_epsilon(0.15, 0.1, math.sqrt(3072), 1e-5) == pytest.approx(839, rel=0.01)
    # delta at that epsilon, from the Gaussian's privacy profile written out here
    mu, eps = 0.1 * math.sqrt(3072) / 0.15, fr.release_epsilon(0.15, 0.1, math.sqrt(3072), 1e-5)
    profile = norm.cdf(-eps / mu + mu / 2) - math.exp(eps + norm.logcdf(-eps / mu - mu / 2))  # e^eps Phi(.) in logs
    assert profile == pytest.approx(1e-5, rel=1e-3)


def test_two_noisy_copies_cost_one_gaussian_of_the_combined_std():
    m, rho = 28.0, 0.02
    two = releases_epsilon(fr.feature_releases([0.2, 0.25], rho, m), 1e-5, Accountant("pld"))
    combined = (1 / 0.2**2 + 1 / 0.25**2) ** -0.5  # 0.156 (spec 003 §1.6)
    assert two == pytest.approx(fr.release_epsilon(combined, rho, m, 1e-5), rel=2e-3)
    assert fr.release_epsilon([0.2, 0.25], rho, m, 1e-5) == pytest.approx(fr.release_epsilon(combined, rho, m, 1e-5))


def test_paper_formula_matches_the_spec_numbers():
    assert fr.paper_epsilon(0.1, 0.15, 1000, 1e-5) == pytest.approx(71.5, abs=0.05)
    assert fr.paper_epsilon(0.1, math.sqrt(0.15), 1000, 1e-5) == pytest.approx(27.7, abs=0.05)


def test_kov_composition_by_hand():
    eps0, k, dh = 0.1, 10, 1e-5
    drift = (math.exp(eps0) - 1) / (math.exp(eps0) + 1) * k * eps0
    middle = drift + eps0 * math.sqrt(2 * k * math.log(math.e + math.sqrt(k * eps0**2) / dh))
    last = drift + eps0 * math.sqrt(2 * k * math.log(1 / dh))
    assert fr.kov_composition(eps0, k, dh) == pytest.approx(min(k * eps0, middle, last))
    assert fr.kov_composition(2.0, 1, dh) == pytest.approx(2.0)  # one mechanism: k eps0 is the smallest


def test_eq_17_matches_the_spec_examples():
    assert fr.communication_ratio(15, 1000, 0.5, 10, 14) == pytest.approx(0.0454, abs=5e-5)
    assert fr.communication_ratio(15, 1000, 0.1, 100, 14) == pytest.approx(0.2207, abs=5e-5)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="rho"):
        fr.feature_releases(0.1, 0.0, 10.0)
    with pytest.raises(ValueError, match="sigma"):
        fr.paper_epsilon(0.1, -1.0, 10, 1e-5)
