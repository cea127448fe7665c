"""FedFed phase 1, feature distillation (Yang et al. NeurIPS 2023, Alg. 1; spec 003 §1.3-1.6),
and the release of the shared performance-sensitive features.

``fedfed_distill`` is FedAvg on the feature distiller (model ``fedfed_vae``: a beta-VAE
generator q and a classifier f) with the loss of the official code's VAE step (the paper
gives only Eq. 9; spec 003 §1.5), per batch:

    recon * MSE(x_r, x) + ce_shared * CE(f(x_s + sigma n), y) + kl * KL(q(z|x) || N(0, I)) + ce_raw * CE(f(x), y)

with ``x_r = q(x)``, ``x_s = x - x_r`` clipped to ``||x_s|| <= rho ||x||`` (the paper's bound;
the code has none) and KL the mean over rows and latent units. The reparameterisation draws
and the noise n come from the client's generator through the batch's groups
(:class:`DistillationDraws`), one per row (the code shares one noise tensor per batch).

After phase 1, :func:`release_features` makes a client's shared set once: ``x_p = x_s + sigma
n`` with z = mu (no reparameterisation noise), accounted per record by
:func:`~fedveil.privacy.feature_release.feature_releases`. Example- and client-level DP are refused
for phase 1: as in the paper, the generator trains on raw data, so the release's guarantee holds
given the generator, not for its training (``docs/fedfed.md``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field

from ..data.arrays import ArrayDataset
from ..errors import ConfigError
from ..models.fedfed import NOISE, VAE_EPS
from ..models.functional import forward, method_call
from ..params import Params
from ..training.request import Batch, LossFn, Objective
from .base import ALGORITHMS, ClientTask, RunContext
from .fedavg import FedAvg, FedAvgParams


class DistillationParams(FedAvgParams):
    recon: float = Field(5.0, ge=0.0, description="weight of MSE(x_r, x), the robust part's reconstruction (code: re)")
    ce_shared: float = Field(2.0, ge=0.0, description="weight of CE(f(x_s + sigma n), y), Eq. 9 (code: ce)")
    kl: float = Field(0.005, ge=0.0, description="weight of the VAE's KL term (code: kl)")
    ce_raw: float = Field(0.4, ge=0.0, description="weight of CE(f(x), y), the classifier on raw inputs (code: x_ce)")


@dataclass(frozen=True)
class DistillationLoss(Objective):
    """The weighted sum of the four terms (module docstring) for ``out = (f(x), f(x_s + sigma n),
    x_r, mu, logvar)``."""

    loss_fn: LossFn
    recon: float
    ce_shared: float
    kl: float
    ce_raw: float

    def mean(self, out: tuple, batch: Batch) -> torch.Tensor:
        logits_x, logits_s, x_r, mu, logvar = out
        kl = -0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).mean()
        return (self.recon * F.mse_loss(x_r, batch.x) + self.ce_shared * self.loss_fn(logits_s, batch.y)
                + self.kl * kl + self.ce_raw * self.loss_fn(logits_x, batch.y))


@dataclass(frozen=True)
class DistillationDraws:
    """Input hook: standard normal draws for the reparameterisation (``latent`` per row) and
    the classifier's noise (one image per row), from the client's generator."""

    latent: int

    def __call__(self, state: Params, batch: Batch, generator: torch.Generator) -> Batch:
        n, device = len(batch.x), batch.x.device
        eps = torch.randn((n, self.latent), generator=generator, device=generator.device).to(device)
        noise = torch.randn(batch.x.shape, generator=generator, device=generator.device).to(device)
        return Batch(batch.x, batch.y, {**batch.groups, VAE_EPS: eps, NOISE: noise})


@ALGORITHMS.register("fedfed_distill", "FedFed phase 1: FedAvg of a beta-VAE generator + classifier (feature distillation)")
class FedFedDistill(FedAvg):
    """FedAvg with the distillation loss and draws (Alg. 1); see the module docstring."""

    Params = DistillationParams
    supports_example_dp = False  # as the paper: the generator trains on raw data (module docstring)
    supports_client_dp = False

    def __init__(self, params: DistillationParams, ctx: RunContext) -> None:
        super().__init__(params, ctx)
        model = ctx.trainer.model
        if not hasattr(model, "split"):
            raise ConfigError("algorithm 'fedfed_distill' trains a feature distiller: use model = \"fedfed_vae\"")
        self.objective = DistillationLoss(ctx.trainer.loss_fn, params.recon, params.ce_shared, params.kl, params.ce_raw)
        self.draws = DistillationDraws(model.mu.out_features)

    def request_options(self, task: ClientTask) -> dict[str, Any]:
        return {"objective": self.objective, "input_fn": self.draws}

    def predict(self, model: torch.nn.Module, state: Params, x: torch.Tensor) -> torch.Tensor:
        """The classifier on raw inputs (the first output)."""
        return forward(model, state, x)[0]


def release_features(model: torch.nn.Module, state: Params, data: ArrayDataset, sigma: float,
                     generator: torch.Generator) -> ArrayDataset:
    """A client's shared set (Alg. 1, last line): for every row ``x_p = x_s + sigma n``, x_s the
    clipped residual of the generator's reconstruction from z = mu, n ~ N(0, I) from
    ``generator``; labels and groups kept. Account it with ``feature_releases(sigma, rho, M)``."""
    if sigma < 0:
        raise ValueError(f"sigma must be >= 0, got {sigma}")
    with torch.no_grad():
        _, x_s, _, _ = method_call(model, state, "split", data.x)
        noise = torch.randn(x_s.shape, generator=generator, device=generator.device).to(x_s.device)
    return ArrayDataset(x_s + sigma * noise, data.y, dict(data.groups), dict(data.info))
