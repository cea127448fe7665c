"""FedAvg with local fine-tuning: the global model, then a few epochs on the client's data.

The standard personalisation baseline ("FedAvg-FT"; e.g. Wang et al. 2019,
"Federated Evaluation of On-device Personalization", and Yu et al. 2020,
"Salvaging Federated Learning by Local Adaptation"). Training is exactly FedAvg's;
client i's personal model is w_i = LocalSGD_i(w, E_ft epochs) from the current global w.
"""
from __future__ import annotations

import dataclasses

from pydantic import Field

from .. import params as P
from .base import ALGORITHMS, ClientTask, State
from .fedavg import FedAvg, FedAvgParams


class FedAvgFTParams(FedAvgParams):
    """FedAvg's settings plus the fine-tuning epochs and learning rate of the personal models."""

    finetune_epochs: int = Field(1, ge=0, description="local fine-tuning epochs (0 = personal model is the global one)")
    finetune_lr: float | None = Field(None, gt=0.0, description="fine-tuning learning rate (default: the client lr)")


@ALGORITHMS.register("fedavg_ft", "FedAvg + local fine-tuning of the global model for personal models")
class FedAvgFT(FedAvg):
    """FedAvg whose personal models are the global model fine-tuned on each client's training data."""

    Params = FedAvgFTParams
    has_personal_models = True
    supports_example_dp = False  # fine-tuning at evaluation is not planned in the privacy budget yet

    def personal_params(self, server_state: State, client_state: State | None, task: ClientTask) -> P.Params:
        """The current global model fine-tuned for ``finetune_epochs`` on the client's training rows (no DP)."""
        start = self.global_params(server_state)
        if self.hp.finetune_epochs == 0:
            return start
        cfg = task.trainer.config
        lr = cfg.lr if self.hp.finetune_lr is None else self.hp.finetune_lr
        trainer = dataclasses.replace(
            task.trainer, config=cfg.model_copy(update={"epochs": self.hp.finetune_epochs, "steps": None, "lr": lr})
        )
        personal, _ = trainer.train(start, task.data.train, task.generator, task.round)
        return personal
