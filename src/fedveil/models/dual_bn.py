"""Dual batch normalisation for robustness customisable at test time (Split-Mix §4.4.3,
spec 000 part 2 §A.7; the reference code's ``DualNormLayer`` with its own affine per BN), and
OAT's FiLM-conditioned variant (:class:`FiLMDualBatchNorm`).

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
        """The clean or noise BN alone when routed, else ``(1 - mix) BN_c(x) + mix BN_n(x)`` (Eq. 4.2)."""
        if self.route == "clean":
            return self.clean(x)
        if self.route == "noise":
            return self.noise(x)
        return (1 - self.mix) * self.clean(x) + self.mix * self.noise(x)


class FiLMDualBatchNorm(DualBatchNorm):
    """OAT's conditional dual BN (Once-for-All Adversarial Training, Wang et al. NeurIPS 2020;
    Split-Mix's FedAvg+OAT baseline, spec 000 part 2 §A.8): the clean BN for lambda = 0 and the
    noise BN for lambda > 0, then a FiLM transform ``(1 + gamma(lambda)) y + beta(lambda)`` from a
    small MLP of lambda (its last layer zero-initialised: the identity at start). At test time
    lambda is the ``mix`` buffer (:func:`with_mix`); in training the step's lambda and route are
    set around the forward (:func:`conditioned`)."""

    HIDDEN = 64

    def __init__(self, channels: int, dims: int, track_running_stats: bool) -> None:
        super().__init__(channels, dims, track_running_stats)
        self.film = nn.Sequential(nn.Linear(1, self.HIDDEN), nn.ReLU(), nn.Linear(self.HIDDEN, 2 * channels))
        nn.init.zeros_(self.film[2].weight)
        nn.init.zeros_(self.film[2].bias)
        self.lam: float | None = None  # the training step's lambda, set by `conditioned`; not state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The BN lambda selects (or the routed one), then
        ``(1 + gamma(lambda)) y + beta(lambda)``; lambda is the step's or the ``mix`` buffer."""
        lam = self.mix if self.lam is None else torch.tensor(self.lam, dtype=x.dtype, device=x.device)
        if self.route == "mix":  # test time: the BN that lambda selects
            y = self.clean(x) if float(lam) == 0.0 else self.noise(x)
        else:
            y = super().forward(x)
        gamma, beta = self.film(lam.reshape(1, 1).to(x.dtype)).chunk(2, dim=1)
        view = (1, -1) + (1,) * (x.dim() - 2)
        return (1 + gamma.view(view)) * y + beta.view(view)


def dual_layers(model: nn.Module) -> list[DualBatchNorm]:
    """Every :class:`DualBatchNorm` (FiLM ones included) in ``model``."""
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


@contextmanager
def conditioned(model: nn.Module, lam: float) -> Iterator[None]:
    """Inside the block every OAT layer of ``model`` is conditioned on ``lam`` and uses the BN
    it selects (clean for 0, noise otherwise), whatever its ``mix`` buffer says."""
    layers = [m for m in dual_layers(model) if isinstance(m, FiLMDualBatchNorm)]
    with routed(model, "clean" if lam == 0 else "noise"):
        for m in layers:
            m.lam = float(lam)
        try:
            yield
        finally:
            for m in layers:
                m.lam = None


def has_film(model: nn.Module) -> bool:
    """Whether ``model`` has an OAT layer (:class:`FiLMDualBatchNorm`), i.e. is lambda-conditioned."""
    return any(isinstance(m, FiLMDualBatchNorm) for m in model.modules())


def with_mix(state: Params, lam: float) -> Params:
    """``state`` with every dual BN's ``mix`` buffer set to ``lam`` (Eq. 4.2's lambda)."""
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"the dual-BN mix lambda must be in [0, 1], got {lam}")
    return {k: torch.full_like(v, lam) if k == "mix" or k.endswith(".mix") else v for k, v in state.items()}


def has_dual_bn(model: nn.Module) -> bool:
    """Whether ``model`` has any dual BN layer."""
    return bool(dual_layers(model))
