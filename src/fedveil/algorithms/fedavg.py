"""FedAvg (McMahan et al., 2017): local SGD, then the server averages the client updates."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .. import params as P
from ..training.local import GradHook
from .base import ALGORITHMS, Algorithm, AlgorithmParams, ClientResult, ClientTask, State

class FedAvgParams(AlgorithmParams):
    weighting: Literal["samples", "uniform"] = Field(
        "samples", description="average weighted by client training-set size, or uniformly"
    )
    server_lr: float = Field(1.0, gt=0.0, description="server step on the averaged update")


@ALGORITHMS.register("fedavg", "FedAvg: average of client updates (sample-weighted or uniform)")
class FedAvg(Algorithm):
    """w <- w + eta_s * sum_k p_k (w_k - w), p_k = n_k / n (or 1/m with uniform weighting)."""

    Params = FedAvgParams
    supports_client_dp = True

    def grad_hook(self, server_state: State, client_state: State | None) -> GradHook | None:
        """Subclasses add terms to the local gradient (FedProx, SCAFFOLD)."""
        return None

    def client_update(self, server_state: State, client_state: State | None, task: ClientTask) -> ClientResult:
        start = server_state["params"]
        new, stats = task.trainer.train(
            start, task.data.train, task.generator, task.round, self.grad_hook(server_state, client_state), dp=task.dp
        )
        message = {"delta": P.sub(new, start), "num_examples": task.data.num_train, "steps": stats.steps}
        return ClientResult(message=message, state=client_state, stats=stats)

    def weights(self, messages: list[dict[str, Any]]) -> list[float]:
        if self.hp.weighting == "uniform":
            return [1.0] * len(messages)
        return [float(m["num_examples"]) for m in messages]

    def server_update(self, server_state: State, mean_delta: P.Params) -> State:
        """Apply the averaged update; server optimisers (FedAvgM, FedAdam...) override this."""
        return {**server_state, "params": P.add(server_state["params"], mean_delta, self.hp.server_lr)}

    def aggregate(self, server_state: State, results: list[tuple[int, dict[str, Any]]], round_idx: int) -> State:
        if not results:  # an empty Poisson cohort leaves the model unchanged
            return server_state
        messages = [m for _, m in results]
        mean_delta = P.weighted_mean([m["delta"] for m in messages], self.weights(messages))
        return self.server_update(server_state, mean_delta)
