"""SCAFFOLD (Karimireddy et al. 2020, "SCAFFOLD: Stochastic Controlled Averaging for
Federated Learning", ICML, Algorithm 1 with option II).

Server holds x and control variate c; client i holds c_i (zero at first). Locally
y_i <- y_i - eta_l (g_i(y_i) - c_i + c) for K steps, then
c_i+ = c_i - c + (x - y_i) / (K eta_l), and the client sends (y_i - x, c_i+ - c_i).
The server averages both uniformly over the cohort S of the N clients:
x <- x + eta_g mean(Delta y),  c <- c + (|S| / N) mean(Delta c).

K is the number of steps the client actually took and eta_l the local learning rate
of the round. The local optimiser's weight decay and momentum act on top of the
corrected gradient, so with them (x - y_i) / (K eta_l) is only an approximation of
the mean corrected gradient that option II assumes.
"""
from __future__ import annotations

from typing import Any

from pydantic import Field

from .. import params as P
from ..engine.grad_terms import AffineGradTerm
from ..training.local import GradHook
from .base import ALGORITHMS, AlgorithmParams, ClientResult, ClientTask, State
from .fedavg import FedAvg

class ScaffoldParams(AlgorithmParams):
    """SCAFFOLD's settings: the global step eta_g."""

    server_lr: float = Field(1.0, gt=0.0, description="global step eta_g on the averaged update")


@ALGORITHMS.register("scaffold", "SCAFFOLD: local steps corrected by server/client control variates")
class Scaffold(FedAvg):
    """SCAFFOLD, Algorithm 1 (option II) of Karimireddy et al. 2020."""

    Params = ScaffoldParams
    supports_client_dp = False  # control-variate deltas are released too
    secure_summable = False  # the control variates are averaged too

    def init_server(self, initial: P.Params) -> State:
        """The initial model x and a zero server control variate c."""
        return {"params": initial, "control": P.zeros_like(initial)}

    def init_client(self, client_id: int, server_state: State) -> State:
        """A zero client control variate c_i."""
        return {"control": P.zeros_like(server_state["params"])}

    def grad_hook(self, server_state: State, client_state: State | None) -> GradHook:
        """The correction c - c_i added to every local gradient."""
        correction = P.sub(server_state["control"], client_state["control"])  # c - c_i
        return AffineGradTerm(0.0, correction)

    def client_update(self, server_state: State, client_state: State | None, task: ClientTask) -> ClientResult:
        """FedAvg's update, then c_i+ = c_i - c + (x - y_i) / (K eta_l) (option II); sends Delta c_i too."""
        result = super().client_update(server_state, client_state, task)
        c, c_i, delta = server_state["control"], client_state["control"], result.message["delta"]
        step = result.message["steps"] * task.trainer.lr_at(task.round)  # K eta_l
        new_c_i = {k: c_i[k] - c[k] - delta[k] / step for k in c_i}  # (x - y_i) = -delta
        message = {**result.message, "delta_control": P.sub(new_c_i, c_i)}
        return ClientResult(message=message, state={"control": new_c_i}, stats=result.stats)

    def aggregate(self, server_state: State, results: list[tuple[int, dict[str, Any]]], round_idx: int) -> State:
        """x <- x + eta_g mean(Delta y), c <- c + (|S| / N) mean(Delta c), both means uniform."""
        if not results:
            return server_state
        uniform = [1.0] * len(results)
        mean_delta = P.weighted_mean([m["delta"] for _, m in results], uniform)
        mean_dc = P.weighted_mean([m["delta_control"] for _, m in results], uniform)
        state = self.server_update(server_state, mean_delta)
        fraction = len(results) / self.ctx.num_clients
        return {**state, "control": P.add(server_state["control"], mean_dc, fraction)}
