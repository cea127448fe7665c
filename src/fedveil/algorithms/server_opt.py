"""Server optimisers on the averaged client update: FedAvgM, FedAdam, FedYogi.

Clients train exactly as in FedAvg; the server treats the averaged update
Delta = sum_k p_k (w_k - w) as a (negative) pseudo-gradient and feeds it to an
optimiser whose state (m, v) lives in the server state, so it is checkpointed with it.

Weights: p_k default to the clients' training-set sizes (``weighting = "samples"``, as
FedAvg); Reddi et al. (2021, "Adaptive Federated Optimization") average the cohort's
updates uniformly, which is ``weighting = "uniform"``.
"""
from __future__ import annotations

import torch
from pydantic import Field

from .. import params as P
from .base import ALGORITHMS, State
from .fedavg import FedAvg, FedAvgParams


class FedAvgMParams(FedAvgParams):
    """FedAvg's settings plus the server momentum beta."""

    server_momentum: float = Field(0.9, ge=0.0, lt=1.0, description="server momentum beta")


@ALGORITHMS.register("fedavgm", "FedAvgM: FedAvg with heavy-ball momentum on the server")
class FedAvgM(FedAvg):
    """FedAvgM (Hsu, Qi & Brown 2019, "Measuring the Effects of Non-Identical Data
    Distribution for Federated Visual Classification", arXiv:1909.06335):
    v <- beta v + Delta;  w <- w + eta_s v  (v starts at zero; beta = 0 is FedAvg).
    """

    Params = FedAvgMParams

    def init_server(self, initial: P.Params) -> State:
        """The initial model and a zero momentum v."""
        return {"params": initial, "momentum": P.zeros_like(self.trained(initial))}

    def server_update(self, server_state: State, mean_delta: P.Params) -> State:
        """v <- beta v + Delta; w <- w + eta_s v."""
        v = P.add(mean_delta, server_state["momentum"], self.hp.server_momentum)
        params = server_state["params"]
        return {**server_state, "params": {**params, **P.add(self.trained(params), v, self.hp.server_lr)}, "momentum": v}


class AdaptiveParams(FedAvgParams):
    """FedAdam's and FedYogi's settings: server step eta, moment decays beta1 / beta2 and adaptivity tau."""

    server_lr: float = Field(0.01, gt=0.0, description="server step eta")
    beta1: float = Field(0.9, ge=0.0, lt=1.0, description="decay of the first moment m")
    beta2: float = Field(0.99, ge=0.0, lt=1.0, description="decay of the second moment v")
    tau: float = Field(1e-3, gt=0.0, description="adaptivity tau (added to sqrt(v); v starts at tau^2)")


class _AdaptiveServer(FedAvg):
    """Algorithm 2 of Reddi et al. 2021, "Adaptive Federated Optimization" (ICLR):
    m_t = b1 m_{t-1} + (1 - b1) Delta_t;  v_t from ``second_moment``;
    w <- w + eta m_t / (sqrt(v_t) + tau), with m_{-1} = 0, v_{-1} = tau^2 and,
    as in the paper, no bias correction.
    """

    Params = AdaptiveParams

    def second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> torch.Tensor:
        """v_t from v_{t-1} and the squared update Delta_t^2."""
        raise NotImplementedError

    def init_server(self, initial: P.Params) -> State:
        trained = self.trained(initial)
        v0 = {k: torch.full_like(t, self.hp.tau**2) for k, t in trained.items()}
        return {"params": initial, "m": P.zeros_like(trained), "v": v0}

    def server_update(self, server_state: State, mean_delta: P.Params) -> State:
        hp, w = self.hp, server_state["params"]
        m = {k: hp.beta1 * server_state["m"][k] + (1 - hp.beta1) * d for k, d in mean_delta.items()}
        v = {k: self.second_moment(server_state["v"][k], d * d) for k, d in mean_delta.items()}
        new = {**w, **{k: w[k] + hp.server_lr * m[k] / (v[k].sqrt() + hp.tau) for k in mean_delta}}
        return {**server_state, "params": new, "m": m, "v": v}


@ALGORITHMS.register("fedadam", "FedAdam: Adam (without bias correction) on the server")
class FedAdam(_AdaptiveServer):
    """FedAdam (Reddi et al. 2021, Alg. 2): v_t = b2 v_{t-1} + (1 - b2) Delta_t^2."""

    def second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> torch.Tensor:
        """Adam's v_t = b2 v_{t-1} + (1 - b2) Delta_t^2."""
        return self.hp.beta2 * v + (1 - self.hp.beta2) * d2


@ALGORITHMS.register("fedyogi", "FedYogi: Yogi (additive second-moment update) on the server")
class FedYogi(_AdaptiveServer):
    """FedYogi (Reddi et al. 2021, Alg. 2): v_t = v_{t-1} - (1 - b2) Delta_t^2 sign(v_{t-1} - Delta_t^2)."""

    def second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> torch.Tensor:
        """Yogi's v_t = v_{t-1} - (1 - b2) Delta_t^2 sign(v_{t-1} - Delta_t^2)."""
        return v - (1 - self.hp.beta2) * d2 * torch.sign(v - d2)
