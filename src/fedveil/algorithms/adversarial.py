"""Adversarial training as an option of an algorithm (``[algorithm.adversarial]``): FedAvg+AT
and Split-Mix's dual-BN adversarial training (spec 000 part 2 §A.7, Eq. 4.1, Alg. C.1).

With a model whose norm is ``dual_batch_average`` / ``dual_batch_tracked`` the clean and
adversarial halves use separate BNs and the trained model's robustness is chosen at test
time by mixing them (``fedveil evaluate --lam``); with an ordinary model both halves share
its BNs (FedAvg+AT with lambda_n in [0, 1]).
"""
from __future__ import annotations

import threading
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from ..training.adversarial import PGD, AdversarialPair, adversarial_request
from ..training.request import Objective


class AdversarialParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lam: float = Field(0.5, ge=0.0, le=1.0, description="lambda_n of Eq. 4.1: weight of the adversarial loss (0.5 with dual BN)")
    eps: float = Field(8 / 255, gt=0.0, description="L-inf radius of the PGD attack (pixels in [0, 1])")
    steps: int = Field(7, ge=1, description="PGD steps")
    step_size: float | None = Field(None, gt=0.0, description="PGD step; default min(1.25 eps, eps + 4/255) / steps (the code's)")
    random_start: bool = Field(True, description="start PGD from a uniform point of the eps-ball")

    def attack(self) -> PGD:
        return PGD(self.eps, self.steps, self.step_size, self.random_start)


class AdversarialRequests:
    """The train-request arguments of adversarial training for each network an algorithm
    trains, built once per network (clients run in threads; equal requests stack)."""

    def __init__(self, params: AdversarialParams) -> None:
        self.params, self.attack, self._pairs = params, params.attack(), {}
        self._lock = threading.Lock()

    def request(self, net: nn.Module, inner: Objective) -> dict[str, Any]:
        with self._lock:
            pair = self._pairs.get(id(net))
            if pair is None:
                pair = self._pairs[id(net)] = AdversarialPair(net)
        return adversarial_request(net, inner, self.params.lam, self.attack, pair)
