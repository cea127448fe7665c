"""Focal loss (γ = 2, α = 0.75; spec 002 §4.6) and its closed-form derivative."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from fedveil.pets.focal import focal_loss, focal_loss_grad


def test_hand_computed_values():
    z = torch.tensor([0.0, math.log(3.0), -math.log(3.0)], dtype=torch.float64)
    y = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)
    expected = [
        0.75 * 0.5**2 * math.log(2.0),  # p_t = 1/2, alpha_t = 0.75
        0.25 * 0.75**2 * math.log(4.0),  # p = 3/4, y = 0: p_t = 1/4, alpha_t = 0.25
        0.75 * 0.75**2 * math.log(4.0),  # p = 1/4, y = 1: p_t = 1/4
    ]
    torch.testing.assert_close(focal_loss(z, y), torch.tensor(expected, dtype=torch.float64))
    assert expected[0] == pytest.approx(0.1299651, rel=1e-6)


def test_gamma_zero_is_alpha_weighted_bce_and_plain_bce_without_alpha():
    torch.manual_seed(0)
    z = torch.randn(50, dtype=torch.float64) * 4
    y = (torch.rand(50) < 0.3).double()
    bce = F.binary_cross_entropy_with_logits(z, y, reduction="none")
    torch.testing.assert_close(focal_loss(z, y, gamma=0.0, alpha=0.75), (0.75 * y + 0.25 * (1 - y)) * bce)
    torch.testing.assert_close(focal_loss(z, y, gamma=0.0, alpha=None), bce)


@pytest.mark.parametrize("gamma,alpha", [(2.0, 0.75), (0.0, 0.25), (1.5, None), (2.0, 0.5)])
def test_closed_form_derivative_equals_autograd(gamma, alpha):
    torch.manual_seed(1)
    z = (torch.randn(40, dtype=torch.float64) * 5).requires_grad_(True)
    y = (torch.rand(40) < 0.5).double()
    (auto,) = torch.autograd.grad(focal_loss(z, y, gamma, alpha).sum(), z)
    torch.testing.assert_close(focal_loss_grad(z.detach(), y, gamma, alpha), auto)


def test_stable_for_large_logits():
    z = torch.tensor([80.0, -80.0, 80.0, -80.0])
    y = torch.tensor([1.0, 0.0, 0.0, 1.0])
    loss, grad = focal_loss(z, y), focal_loss_grad(z, y)
    assert torch.isfinite(loss).all() and torch.isfinite(grad).all()
    assert loss[2] == pytest.approx(0.25 * 80.0, rel=1e-6)  # confidently wrong negative: -0.25 * 1 * log(e^-80)
    assert grad[3] == pytest.approx(-0.75, rel=1e-6)  # confidently wrong positive: loss ~ -0.75 z, slope -alpha


def test_bad_parameters():
    z, y = torch.zeros(2), torch.ones(2)
    with pytest.raises(ValueError, match="gamma"):
        focal_loss(z, y, gamma=-1.0)
    with pytest.raises(ValueError, match="alpha"):
        focal_loss_grad(z, y, alpha=1.5)
