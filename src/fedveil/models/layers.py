"""Small layers that models of several method families share."""
from __future__ import annotations

import torch
from torch import nn


def reverse_gradient(x: torch.Tensor, lam: torch.Tensor | float) -> torch.Tensor:
    """``x`` in the forward pass (exactly), gradient times ``-lam`` in the backward pass.

    Written with plain tensor operations (``x - x.detach()`` is exactly zero but carries
    the gradient), so it works under ``torch.func.vmap`` (per-example DP-SGD) and stacked
    execution alike; ``lam`` may be a scalar or broadcast per row.
    """
    frozen = x.detach()
    return frozen - lam * (x - frozen)


class GradientReversal(nn.Module):
    """The gradient reversal layer of DANN (Ganin & Lempitsky 2015), as FADE uses it
    between the encoder and the group discriminator (spec 004 §1.3): forward identity,
    backward ``-lambda``. ``lam`` is a buffer, so it is part of the model state: an
    algorithm schedules it per round (FADE's lambda_t) and every client of a stacked
    cohort reads its own."""

    def __init__(self, lam: float = 1.0) -> None:
        super().__init__()
        self.register_buffer("lam", torch.tensor(float(lam)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` unchanged; its gradient multiplied by ``-lam`` (:func:`reverse_gradient`)."""
        return reverse_gradient(x, self.lam)
