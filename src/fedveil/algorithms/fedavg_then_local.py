"""FedAvg, then local fine-tuning from the FedAvg model (spec 002 §2.4, "Finetune").

Rounds 0 .. R_g - 1 are FedAvg rounds (R_g = ``switch_fraction`` x rounds, 0.5 in the
paper; Fig. G.1 uses 0.25/0.5/0.75); from round R_g on every silo trains its own copy
of the FedAvg model on its own data, with no more communication. The DP-SGD steps are
those of FedAvg, so the noise is the same. (Unlike ``fedavg_ft``, which fine-tunes a copy
of the current global model only to evaluate it, this changes training itself.)
"""
from __future__ import annotations

import math

from pydantic import Field

from .. import params as P
from .base import ALGORITHMS, ClientResult, ClientTask, State
from .fedavg import FedAvg, FedAvgParams


class FedAvgThenLocalParams(FedAvgParams):
    """FedAvg's settings plus the fraction of rounds trained with FedAvg before the local phase."""

    switch_fraction: float = Field(0.5, ge=0.0, le=1.0, description="fraction of rounds trained with FedAvg before local training")


@ALGORITHMS.register("fedavg_then_local", "FedAvg for a fraction of the rounds, then local fine-tuning (switch point)")
class FedAvgThenLocal(FedAvg):
    """FedAvg while ``round < switch_round``; afterwards local SGD from the last global model."""

    Params = FedAvgThenLocalParams
    has_personal_models = True
    supports_client_dp = False  # the local phase releases personal models

    @property
    def switch_round(self) -> int:
        """R_g = floor(``switch_fraction`` x rounds), the first round of local training."""
        return math.floor(self.hp.switch_fraction * self.ctx.rounds)

    def client_update(self, server_state: State, client_state: State | None, task: ClientTask) -> ClientResult:
        """FedAvg's update before :attr:`switch_round`; then local SGD on the silo's own copy, sending nothing."""
        if task.round < self.switch_round:
            return super().client_update(server_state, client_state, task)
        start = server_state["params"] if client_state is None else client_state["params"]
        new, stats = task.trainer.train(start, task.data.train, task.generator, task.round, dp=task.dp)
        return ClientResult(message={}, state={"params": new}, stats=stats)

    def aggregate(self, server_state, results, round_idx: int) -> State:
        """FedAvg's aggregation before :attr:`switch_round`; afterwards the server state stays as it is."""
        if round_idx >= self.switch_round:
            return server_state
        return super().aggregate(server_state, results, round_idx)

    def personal_params(self, server_state: State, client_state: State | None, task: ClientTask) -> P.Params:
        """The silo's locally trained model; the global model if it has none yet."""
        return server_state["params"] if client_state is None else client_state["params"]
