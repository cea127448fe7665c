"""Ditto (Li et al. 2021, "Ditto: Fair and Robust Federated Learning Through
Personalization"), as run in spec 002 §2.5 with the FedAvg solver.

Each round a silo trains the global model from w_bar (FedAvg's update) *and* its personal
model v_k on F_k(v) + lambda/2 ||v - w_bar||^2, regularised towards the round's w_bar.
Two local trainings per round: under silo-specific DP both touch the data, so the privacy
plan accounts twice the DP-SGD steps and each silo's noise is larger (the "privacy
overhead" of §1.4 / Fig. 1.4). Without DP, lambda interpolates between local (0) and
FedAvg (large lambda). The regulariser's gradient joins each per-example gradient before
clipping (``reg_in_clip``), as in [C1] (see :mod:`fedveil.algorithms.mean_regularized`).

Personal initialisation: a silo's v_k is created at its first participation as a copy of
the global model of that round (with every silo in round 0, the common initial model, as
in Li et al.; under partial participation a late silo starts from the current w_bar).
"""
from __future__ import annotations

from pydantic import Field

from .. import params as P
from .base import ALGORITHMS, ClientResult, ClientTask, State
from .fedavg import FedAvg, FedAvgParams
from .mean_regularized import regulariser


class DittoParams(FedAvgParams):
    """FedAvg's settings plus Ditto's pull lambda of the personal models and where its gradient is clipped."""

    lam: float = Field(0.1, ge=0.0, description="strength lambda of the personal models' pull towards the global model")
    reg_in_clip: bool = Field(True, description="under DP-SGD clip the regulariser gradient with each example's ([C1])")


@ALGORITHMS.register("ditto", "Ditto: FedAvg plus personal models regularised towards the global model")
class Ditto(FedAvg):
    """FedAvg for w_bar; personal v_k <- LocalSGD(F_k + lambda/2 ||v - w_bar||^2) every round."""

    Params = DittoParams
    has_personal_models = True
    supports_client_dp = False  # the personal models are trained on raw data after the global update
    trainings_per_round = 2

    def init_client(self, client_id: int, server_state: State) -> State:
        """The personal model v_k, a copy of the global model of the silo's first round."""
        return {"personal": P.clone(server_state["params"])}

    def client_update(self, server_state: State, client_state: State | None, task: ClientTask) -> ClientResult:
        """FedAvg's update of w_bar, then a second training of v_k with
        the pull lambda (v - w_bar) towards the round's global model."""
        result = super().client_update(server_state, client_state, task)
        hook = regulariser(self.hp.lam, server_state["params"], self.hp.reg_in_clip)
        personal, _ = task.trainer.train(
            client_state["personal"], task.data.train, task.generator, task.round, hook, dp=task.dp
        )
        return ClientResult(message=result.message, state={"personal": personal}, stats=result.stats)

    def personal_params(self, server_state: State, client_state: State | None, task: ClientTask) -> P.Params:
        """The silo's v_k; the global model for a silo that never trained."""
        if client_state is None:
            return server_state["params"]
        return client_state["personal"]
