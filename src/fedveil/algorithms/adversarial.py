"""Adversarial training as an option of an algorithm (``[algorithm.adversarial]``): FedAvg+AT
and Split-Mix's dual-BN adversarial training (spec 000 part 2 §A.7, Eq. 4.1, Alg. C.1).

With a model whose norm is ``dual_batch_average`` / ``dual_batch_tracked`` the clean and
adversarial halves use separate BNs and the trained model's robustness is chosen at test
time by mixing them (``fedveil evaluate --lam``); with an ordinary model both halves share
its BNs (FedAvg+AT with lambda_n in [0, 1]). With ``oat_lams`` and a ``film_dual_`` norm it is
OAT (FedAvg+OAT): lambda drawn per step, the model conditioned on it, chosen at test time.
"""
from __future__ import annotations

import threading
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from torch import nn

from ..errors import ConfigError
from ..models.dual_bn import has_film
from ..models.ensemble import BaseEnsemble
from ..training.adversarial import PGD, AdversarialPair, OATPair, PerBasePair, adversarial_request
from ..training.request import Objective


class AdversarialParams(BaseModel):
    """``[algorithm.adversarial]``: the PGD attack, the adversarial
    loss weight lambda_n (Eq. 4.1) and the OAT lambdas."""

    model_config = ConfigDict(extra="forbid")

    lam: float = Field(0.5, ge=0.0, le=1.0, description="lambda_n of Eq. 4.1: weight of the adversarial loss (0.5 with dual BN)")
    eps: float = Field(8 / 255, gt=0.0, description="L-inf radius of the PGD attack (pixels in [0, 1])")
    steps: int = Field(7, ge=1, description="PGD steps")
    step_size: float | None = Field(None, gt=0.0, description="PGD step; default min(1.25 eps, eps + 4/255) / steps (the code's)")
    random_start: bool = Field(True, description="start PGD from a uniform point of the eps-ball")
    per_base: bool = Field(
        False, description="Split-Mix: attack each base on its own, as the reference code (M times the PGD cost); "
        "default one attack against all of a client's bases (their summed loss)"
    )
    oat_lams: list[float] | None = Field(
        None, description="OAT (FedAvg+OAT): lambda drawn per step from these, the model conditioned on it "
        "(needs norm = \"film_dual_...\"); lam is then unused"
    )

    @field_validator("oat_lams")
    @classmethod
    def _check_lams(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and (not value or any(not 0.0 <= v <= 1.0 for v in value)):
            raise ValueError(f"oat_lams must be a non-empty list of values in [0, 1], got {value}")
        return value

    def attack(self) -> PGD:
        """The PGD attack these settings describe."""
        return PGD(self.eps, self.steps, self.step_size, self.random_start)


class AdversarialRequests:
    """The train-request arguments of adversarial training for each network an algorithm
    trains, built once per network (clients run in threads; equal requests stack)."""

    def __init__(self, params: AdversarialParams, model: nn.Module) -> None:
        if params.oat_lams is not None and not has_film(model):
            raise ConfigError("algorithm.adversarial.oat_lams (OAT) needs a lambda-conditioned model: "
                              "set model.options.norm = \"film_dual_batch_average\" (or _tracked)")
        if params.per_base and not isinstance(model, BaseEnsemble):
            raise ConfigError("algorithm.adversarial.per_base attacks the bases of a Split-Mix model one by one: "
                              "use algorithm = \"split_mix\" with model.options.bases > 1")
        if params.per_base and params.oat_lams is not None:
            raise ConfigError("algorithm.adversarial: per_base and oat_lams cannot be combined")
        self.params, self.attack, self._pairs = params, params.attack(), {}
        self._lock = threading.Lock()

    def request(self, net: nn.Module, inner: Objective) -> dict[str, Any]:
        """The ``trainer.train`` keyword arguments that train ``net`` adversarially around
        the objective ``inner``; the clean / adversarial pair is built once per network."""
        oat = self.params.oat_lams
        with self._lock:
            pair = self._pairs.get(id(net))
            if pair is None:
                kind = PerBasePair if self.params.per_base else (AdversarialPair if oat is None else OATPair)
                pair = self._pairs[id(net)] = kind(net)
        return adversarial_request(net, inner, self.params.lam, self.attack, pair, None if oat is None else tuple(oat),
                                   self.params.per_base)
