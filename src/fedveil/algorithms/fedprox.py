"""FedProx (Li et al. 2020, "Federated Optimization in Heterogeneous Networks", MLSys).

Each client minimises its loss plus a proximal term that keeps it near the global
model w^t (Eq. 2): h_k(w; w^t) = F_k(w) + mu/2 ||w - w^t||^2. The term enters local
SGD as the extra gradient mu (w - w^t); aggregation is FedAvg's. mu = 0 is FedAvg.
"""
from __future__ import annotations

from pydantic import Field

from .. import params as P
from ..engine.grad_terms import AffineGradTerm
from ..training.local import GradHook
from .base import ALGORITHMS, State
from .fedavg import FedAvg, FedAvgParams

class FedProxParams(FedAvgParams):
    """FedAvg's settings plus the proximal strength mu (Eq. 2)."""

    mu: float = Field(0.01, ge=0.0, description="proximal strength mu (0 = FedAvg)")


@ALGORITHMS.register("fedprox", "FedProx: FedAvg with a proximal term mu/2 ||w - w_global||^2 in local training")
class FedProx(FedAvg):
    """FedAvg whose local gradient gains mu (w - w^t) (Li et al. 2020, Eq. 2)."""

    Params = FedProxParams

    def grad_hook(self, server_state: State, client_state: State | None) -> GradHook:
        """mu (w - w^t) = mu w - mu w^t, affine in w so the vectorized executor can stack it."""
        mu = self.hp.mu
        return AffineGradTerm(mu, P.scale(server_state["params"], -mu))
