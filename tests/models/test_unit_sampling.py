"""ADDS's differentiable unit sampler (spec 001 §1.4): the bisection meets Eq. 12 to 1e-4,
beta's implicit derivative matches finite differences (Eq. 16 with the sign of Eq. 17
fixed), and the straight-through alpha gradient is Eq. 18's closed form."""
from __future__ import annotations

import pytest
import torch

from fedveil.models import unit_sampling as us


def importances(c: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(c, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("alpha", [0.05, 0.37, 0.9, 0.999])
@pytest.mark.parametrize("eps", [1.0, 0.1, 0.0176])  # 0.0176 = 0.98^200, the last round's eps
def test_bisection_keeps_alpha_c_units_in_expectation(alpha, eps):
    for c in (7, 256, 1024):
        b = importances(c)
        beta = us.solve_beta(b, alpha, eps)
        expected_kept = torch.sigmoid((b - beta) / eps).sum()  # Eq. 12, computed here independently
        assert abs(float(expected_kept) - alpha * c) < 1e-4


def test_alpha_outside_0_1_is_refused():
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        us.solve_beta(importances(4), 1.0, 0.5)


@pytest.mark.parametrize("eps", [1.0, 0.2, 0.05])
def test_beta_derivative_matches_finite_differences(eps):
    b, alpha, h = importances(64, 1), 0.4, 1e-6
    a = torch.tensor(alpha, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(us.threshold(a, b, eps), a)
    numeric = (us.solve_beta(b, alpha + h, eps) - us.solve_beta(b, alpha - h, eps)) / (2 * h)
    assert float(grad) == pytest.approx(float(numeric), rel=1e-5)
    assert float(grad) < 0  # keeping more units lowers the threshold (Eq. 17 printed without the minus)


def test_expected_kept_units_grow_by_c_per_unit_of_alpha():
    """Sum over c of dp_c/dalpha = C (Eq. 15)."""
    b, eps = importances(50, 2), 0.3
    a = torch.tensor(0.6, dtype=torch.float64, requires_grad=True)
    p = us.keep_probabilities(b, us.threshold(a, b, eps), eps)
    (grad,) = torch.autograd.grad(p.sum(), a)
    assert float(grad) == pytest.approx(50.0, rel=1e-9)


def test_straight_through_alpha_gradient_is_eq_18():
    b, eps, c = importances(30, 3), 0.25, 30
    g = torch.randn(c, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    u = torch.rand(c, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    a = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    mask = us.sample_mask(a, b, eps, u, straight_through=True)
    (grad,) = torch.autograd.grad((g * mask).sum(), a)  # L = sum_c g_c omega_c: dL/domega = g
    p = torch.sigmoid((b - us.solve_beta(b, 0.3, eps)) / eps)
    var = p * (1 - p)
    assert float(grad) == pytest.approx(float(c * (g * var).sum() / var.sum()), rel=1e-9)
    # forward values are the hard draws
    assert torch.equal(mask.detach(), (u < p).double())


def test_hard_masks_carry_no_gradient_without_straight_through():
    b, a = importances(10), torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    mask = us.sample_mask(a, b, 0.5, torch.rand(10, dtype=torch.float64), straight_through=False)
    assert not mask.requires_grad


def test_draws_keep_alpha_c_units_on_average():
    b, eps, alpha, c = importances(40, 6), 0.5, 0.25, 40
    u = torch.rand(20000, c, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    kept = us.sample_mask(torch.tensor(alpha, dtype=torch.float64), b, eps, u, straight_through=False).sum(1)
    # mean of 20000 draws; the count's std is at most sqrt(C/4) = 3.2, so the mean's is < 0.023
    assert float(kept.mean()) == pytest.approx(alpha * c, abs=0.1)


def test_small_eps_keeps_the_top_units():
    b = importances(20, 8)
    beta = us.solve_beta(b, 0.3, 1e-4)
    p = torch.sigmoid((b - beta) / 1e-4)
    assert torch.equal(p > 0.5, us.top_units(0.3, b))
    assert int(us.top_units(0.3, b).sum()) == 6 and int(us.top_units(0.001, b).sum()) == 1


def test_importances_are_normalised_to_a_maximum_of_one():
    b = us.normalised(torch.tensor([-4.0, 2.0, 1.0]))
    assert torch.equal(b, torch.tensor([1.0, 0.5, 0.25]))
