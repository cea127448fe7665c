"""Dual batch normalisation for robustness customisable at test time (Split-Mix §4.4.3,
spec 000 part 2 §A.7; the reference code's ``DualNormLayer`` with its own affine per BN).

Every BN becomes a clean BN and a noise BN; the other parameters are shared. In training a
clean batch goes through the clean BN and its adversarial twin through the noise BN
(:func:`routed`); at test time each layer mixes them, Eq. (4.2):
``DBN(x) = (1 - lambda) BN_c(x) + lambda BN_n(x)``, with ``lambda`` the ``mix`` buffer of the
model state (0: most accurate, 1: most robust), set for a whole model by :func:`with_mix`.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

from ..params import Params

ROUTES = ("mix", "clean", "noise")


class DualBatchNorm(nn.Module):
    """A clean and a noise BatchNorm (1-d or 2-d), mixed by the ``mix`` buffer (Eq. 4.2)."""

    def __init__(self, channels: int, dims: int, track_running_stats: bool) -> None:
        super().__init__()
        cls = nn.BatchNorm1d if dims == 1 else nn.BatchNorm2d
        self.clean = cls(channels, track_running_stats=track_running_stats)
        self.noise = cls(channels, track_running_stats=track_running_stats)
        self.register_buffer("mix", torch.tensor(0.0))
        self.route = "mix"  # set around a forward by `routed`; not part of the state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.route == "clean":
            return self.clean(x)
        if self.route == "noise":
            return self.noise(x)
        return (1 - self.mix) * self.clean(x) + self.mix * self.noise(x)


def dual_layers(model: nn.Module) -> list[DualBatchNorm]:
    return [m for m in model.modules() if isinstance(m, DualBatchNorm)]


@contextmanager
def routed(model: nn.Module, route: str) -> Iterator[None]:
    """Every dual BN of ``model`` uses only its ``route`` ("clean" or "noise") BN inside the block."""
    if route not in ROUTES:
        raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
    layers = dual_layers(model)
    before = [m.route for m in layers]
    for m in layers:
        m.route = route
    try:
        yield
    finally:
        for m, r in zip(layers, before):
            m.route = r


def with_mix(state: Params, lam: float) -> Params:
    """``state`` with every dual BN's ``mix`` buffer set to ``lam`` (Eq. 4.2's lambda)."""
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"the dual-BN mix lambda must be in [0, 1], got {lam}")
    return {k: torch.full_like(v, lam) if k == "mix" or k.endswith(".mix") else v for k, v in state.items()}


def has_dual_bn(model: nn.Module) -> bool:
    return bool(dual_layers(model))
