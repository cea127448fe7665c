"""Focal loss for the logistic model and its closed-form derivative (spec 002 §4.6, [94]).

``p = sigmoid(z)``, ``p_t = p y + (1 - p)(1 - y)``, ``alpha_t = alpha y + (1 - alpha)(1 - y)``::

    FL(z, y) = -alpha_t (1 - p_t)^gamma log p_t

The final submission uses ``gamma = 2, alpha = 0.75`` (alpha weights the positive class;
Table 2.2). ``gamma = 0`` gives alpha-weighted binary cross-entropy and ``alpha=None`` drops
the class weight (``alpha_t = 1``), so ``gamma = 0, alpha = None`` is plain BCE.
Per example, with ``q = 1 - p_t`` and ``dp_t/dz = (2y - 1) p_t q``::

    dFL/dz = (2y - 1) alpha_t (gamma p_t q^gamma log p_t - q^(gamma + 1))

``log p_t = logsigmoid((2y - 1) z)`` and ``q = sigmoid(-(2y - 1) z)`` keep both stable for large |z|.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _check(gamma: float, alpha: float | None) -> None:
    if gamma < 0:
        raise ValueError(f"focal gamma must be >= 0, got {gamma}")
    if alpha is not None and not 0 <= alpha <= 1:
        raise ValueError(f"focal alpha must lie in [0, 1] (or be None), got {alpha}")


def _parts(logits: torch.Tensor, targets: torch.Tensor, alpha: float | None):
    sign = 2.0 * targets - 1.0
    log_pt = F.logsigmoid(sign * logits)
    q = torch.sigmoid(-sign * logits)  # 1 - p_t
    alpha_t = torch.ones_like(logits) if alpha is None else alpha * targets + (1.0 - alpha) * (1.0 - targets)
    return sign, log_pt, q, alpha_t


def focal_loss(logits: torch.Tensor, targets: torch.Tensor, gamma: float = 2.0, alpha: float | None = 0.75) -> torch.Tensor:
    """Per-example focal loss (no reduction; the batch loss is its mean)."""
    _check(gamma, alpha)
    _, log_pt, q, alpha_t = _parts(logits, targets, alpha)
    return -alpha_t * q.pow(gamma) * log_pt


def focal_loss_grad(logits: torch.Tensor, targets: torch.Tensor, gamma: float = 2.0, alpha: float | None = 0.75) -> torch.Tensor:
    """Per-example ``d FL / d logit`` in closed form."""
    _check(gamma, alpha)
    sign, log_pt, q, alpha_t = _parts(logits, targets, alpha)
    p_t = torch.sigmoid(sign * logits)
    return sign * alpha_t * (gamma * p_t * q.pow(gamma) * log_pt - q.pow(gamma + 1.0))
