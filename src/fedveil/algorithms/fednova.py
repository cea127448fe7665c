"""FedNova (Wang et al. 2020, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", NeurIPS; the generalised update of Sec. 3
and the normalised averaging of Sec. 4).

Clients train as in FedAvg but may take different numbers of steps tau_i. The server
normalises each update by the client's accumulated step weight a_i = ||a_i||_1,
d_i = Delta_i / a_i, and rescales by the effective step count:
w <- w + eta_s tau_eff sum_i p_i d_i,  tau_eff = sum_i p_i a_i,
with p_i = n_i / n over the cohort (or 1/m with uniform weighting).
Plain local SGD gives a_i = tau_i; local momentum rho gives
a_i = [tau_i - rho (1 - rho^tau_i) / (1 - rho)] / (1 - rho).
Weight decay is ignored in a_i.
"""
from __future__ import annotations

from typing import Any

from .. import params as P
from .base import ALGORITHMS, State
from .fedavg import FedAvg


def step_weight(steps: int, momentum: float) -> float:
    """a_i = ||a_i||_1 for ``steps`` local SGD steps with heavy-ball ``momentum``."""
    if momentum == 0:
        return float(steps)
    rho = momentum
    return (steps - rho * (1 - rho**steps) / (1 - rho)) / (1 - rho)


@ALGORITHMS.register("fednova", "FedNova: FedAvg with updates normalised by each client's local steps")
class FedNova(FedAvg):
    """Normalised averaging (Wang et al. 2020); equals FedAvg when all a_i are equal."""

    supports_client_dp = False  # its aggregate depends on each client's step count
    secure_summable = False

    def aggregate(self, server_state: State, results: list[tuple[int, dict[str, Any]]], round_idx: int) -> State:
        """w + eta_s tau_eff sum_i p_i Delta_i / a_i: each update normalised by its step weight a_i."""
        if not results:
            return server_state
        messages = [m for _, m in results]
        p = self.weights(messages)
        a = [step_weight(m["steps"], self.ctx.trainer.config.momentum) for m in messages]
        tau_eff = sum(pi * ai for pi, ai in zip(p, a)) / sum(p)
        normalised = P.weighted_mean([P.scale(m["delta"], 1.0 / ai) for m, ai in zip(messages, a)], p)
        return self.server_update(server_state, P.scale(normalised, tau_eff))
