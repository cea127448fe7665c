"""ADDS's differentiable unit sampling (Gong et al. 2021, §3.3, Eq. 12-18; spec 001 §1.4).

A layer of C units with keep ratio alpha and unit importances b keeps unit c with
probability ``p_c = sigmoid((b_c - beta) / eps)`` (Eq. 13), where ``beta(alpha)`` is the
root of ``sum_c p_c = alpha C`` (Eq. 12, 14), found by bisection. The mask is a hard
Bernoulli draw ``omega_c ~ B(p_c)`` whose gradient passes straight through to p_c; beta's
derivative comes from the implicit function theorem:

    d beta / d alpha = -C eps / sum_c p_c (1 - p_c)                (Eq. 16, with Eq. 17's sign fixed)

so autograd yields Eq. 18, ``dL/dalpha = C sum_c g_c p_c (1-p_c) / sum_c' p_c' (1-p_c')``.
"""
from __future__ import annotations

import torch

BRACKET = 40.0  # the root lies in [min b - 40 eps, max b + 40 eps]: sigmoid(+-40) is 1 or 0 in float64
BISECTION_STEPS = 80  # halvings of the bracket: far below float64 resolution of the root


def keep_probabilities(b: torch.Tensor, beta: torch.Tensor, eps: float | torch.Tensor) -> torch.Tensor:
    """Eq. 13: ``p_c = 1 / (1 + exp(-(b_c - beta) / eps))``."""
    return torch.sigmoid((b - beta) / eps)


def solve_beta(b: torch.Tensor, alpha: float | torch.Tensor, eps: float | torch.Tensor) -> torch.Tensor:
    """Eq. 14: the beta with ``sum_c sigmoid((b_c - beta)/eps) = alpha C``, by bisection in
    float64 (the sum falls strictly in beta). ``alpha`` must lie in (0, 1): at 1 no finite
    root exists (every p_c would have to be 1)."""
    alpha = float(alpha)
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"keep ratio alpha must lie in (0, 1), got {alpha}")
    b64, eps64 = b.detach().double(), float(eps)
    target = alpha * b.numel()
    lo = b64.min() - BRACKET * eps64
    hi = b64.max() + BRACKET * eps64
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        if torch.sigmoid((b64 - mid) / eps64).sum() > target:
            lo = mid  # too many kept: raise the threshold
        else:
            hi = mid
    return (0.5 * (lo + hi)).to(b.dtype)


class _Beta(torch.autograd.Function):
    """beta(alpha) with the implicit derivative of Eq. 16 (b and eps are constants)."""

    @staticmethod
    def forward(ctx, alpha: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
        beta = solve_beta(b, float(alpha), eps)
        p = keep_probabilities(b.detach(), beta, eps)
        ctx.save_for_backward(p)
        ctx.eps = eps
        return beta

    @staticmethod
    def backward(ctx, grad_beta: torch.Tensor):
        (p,) = ctx.saved_tensors
        spread = (p * (1 - p)).sum().clamp(min=torch.finfo(p.dtype).tiny)
        return grad_beta * (-p.numel() * ctx.eps / spread), None, None


def threshold(alpha: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    """beta(alpha) (Eq. 14), differentiable in alpha (Eq. 16)."""
    return _Beta.apply(alpha, b.detach(), float(eps))


def sample_mask(
    alpha: torch.Tensor, b: torch.Tensor, eps: float, uniforms: torch.Tensor, straight_through: bool = True
) -> torch.Tensor:
    """Hard 0/1 masks ``omega_c = [u_c < p_c]`` (Bernoulli(p_c) draws given uniforms u of
    shape ``(..., C)``, e.g. one row of draws per example). With ``straight_through`` their
    gradient is that of p (``omega + p - sg(p)``), carrying Eq. 18 to alpha; otherwise the
    masks are constants."""
    p = keep_probabilities(b.detach(), threshold(alpha, b, eps), eps)
    hard = (uniforms < p).to(p.dtype)
    return hard + (p - p.detach()) if straight_through else hard.detach()  # values exactly the draws


def normalised(b: torch.Tensor) -> torch.Tensor:
    """Importances scaled to a maximum of 1 per layer (spec 001 §1.3: the paper never
    normalises b, so eps would depend on the weights' scale), detached."""
    b = b.detach().abs()
    return b / b.max().clamp(min=torch.finfo(b.dtype).tiny)


def top_units(alpha: float, b: torch.Tensor) -> torch.Tensor:
    """The final subnet's units of a layer (Alg. 1 line 16): the ``round(alpha C)`` (at
    least 1) most important, the eps -> 0 limit of the sampler; a bool mask."""
    n = max(1, min(b.numel(), round(float(alpha) * b.numel())))
    keep = torch.zeros(b.numel(), dtype=torch.bool, device=b.device)
    keep[torch.topk(b.detach(), n).indices] = True
    return keep
