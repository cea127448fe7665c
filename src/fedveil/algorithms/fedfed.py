"""FedFed (Yang et al. NeurIPS 2023; spec 003): phase 1, feature distillation (Alg. 1,
§1.3-1.6), the one-shot release of the shared performance-sensitive features, and phase 2,
training on own rows plus the shared features (Alg. 2-4) as an add-on to FedAvg, FedProx,
SCAFFOLD and FedNova.

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

Phase 2 (``fedfed_fedavg``, ``fedfed_fedprox``, ``fedfed_scaffold``, ``fedfed_fednova``) is
the base algorithm with a setup phase (:class:`SharedFeatures`): before round 0 every client
releases its rows' features with the phase-1 run's generator (``distiller``), recorded in its
privacy ledger even at ``privacy.level = "none"``; the server pools them. Each round a
client trains on its own rows followed by a class-balanced draw of as many pooled rows
(the official code's draw, spec 003 §1.7; ``private_rows``: steps are epochs over the own
rows, shared rows join each batch in proportion, DP-SGD accounts only the own rows). The
labels of the shared rows travel in the clear, as in the paper: the guarantee covers the
features, not the labels. FedNova is the canonical update (``fednova.py``), not Alg. 4's
printed sign.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import Field

from ..data.arrays import ArrayDataset
from ..data.federated import ClientData
from ..errors import ConfigError
from ..models import build_model
from ..models.fedfed import NOISE, VAE_EPS
from ..models.functional import forward, method_call, model_state
from ..params import Params
from ..privacy.events import Release
from ..privacy.feature_release import feature_releases
from ..privacy.randomness import RandomSource, standard_normal
from ..training.request import Batch, LossFn, Objective
from .base import ALGORITHMS, AlgorithmParams, ClientResult, ClientTask, RunContext, SetupResult, State
from .fedavg import FedAvg, FedAvgParams
from .fednova import FedNova
from .fedprox import FedProx, FedProxParams
from .scaffold import Scaffold, ScaffoldParams


class DistillationParams(FedAvgParams):
    """FedAvg's settings plus the weights of the four terms of the distillation loss."""

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
        """recon MSE(x_r, x) + ce_shared CE(f(x_s + sigma n), y) + kl KL + ce_raw CE(f(x), y) for the batch."""
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

    signal_labels = {
        "reconstruction_mse": "robust part's reconstruction MSE (own test rows)",
        "shared_norm_share": "shared part's norm share ||x_s|| / ||x|| (<= rho)",
    }

    def request_options(self, task: ClientTask) -> dict[str, Any]:
        """The distillation loss and the reparameterisation and noise draws (:class:`DistillationDraws`)."""
        return {"objective": self.objective, "input_fn": self.draws}

    def client_update(self, server_state: State, client_state: State | None, task: ClientTask) -> ClientResult:
        """FedAvg's update, and how well the trained distiller splits the client's own test rows
        (its training rows when it has none): the robust part's reconstruction error and the
        shared part's share of each row's norm, what says whether distillation worked (the
        classifier's accuracy does not)."""
        result = super().client_update(server_state, client_state, task)
        rows = task.data.test if len(task.data.test) else task.data.train
        trained = dict(self._with_own_buffers(server_state["params"], client_state))
        trained.update({k: trained[k] + d for k, d in result.message["delta"].items()})
        if result.state is not None and "buffers" in result.state:
            trained.update(result.state["buffers"])
        with torch.no_grad():
            x_r, x_s, _, _ = method_call(task.trainer.model, trained, "split", rows.x)
            norms = rows.x.flatten(1).norm(dim=1).clamp_min(1e-12)
            result.extra_metrics.update(
                reconstruction_mse=float(F.mse_loss(x_r, rows.x)),
                shared_norm_share=float((x_s.flatten(1).norm(dim=1) / norms).mean()),
            )
        return result

    def predict(self, model: torch.nn.Module, state: Params, x: torch.Tensor) -> torch.Tensor:
        """The classifier on raw inputs (the first output)."""
        return forward(model, state, x)[0]


def release_features(model: torch.nn.Module, state: Params, data: ArrayDataset, sigma: float,
                     source: RandomSource) -> ArrayDataset:
    """A client's shared set (Alg. 1, last line): for every row ``x_p = x_s + sigma n``, x_s the
    clipped residual of the generator's reconstruction from z = mu, n ~ N(0, I) from
    ``source`` (the run's ``"fedfed-release"`` stream); labels and groups kept. Account it
    with ``feature_releases(sigma, rho, M)``."""
    if sigma < 0:
        raise ValueError(f"sigma must be >= 0, got {sigma}")
    with torch.no_grad():
        _, x_s, _, _ = method_call(model, state, "split", data.x)
        noise = standard_normal(x_s.shape, source, device=x_s.device)
    return ArrayDataset(x_s + sigma * noise, data.y, dict(data.groups), dict(data.info))


# ---------------------------------------------------------------------------- phase 2


class SharedFeatureParams(AlgorithmParams):
    """Phase 2's settings: the phase-1 run whose generator splits the features, and the release noise sigma."""

    distiller: str = Field(
        ..., description="directory of the finished phase-1 run (algorithm fedfed_distill) whose generator splits the features"
    )
    sigma: float = Field(0.15, gt=0.0, description="std of the Gaussian noise on every released feature (sigma_s)")


def load_distiller(run_dir: str, ctx: RunContext) -> tuple[torch.nn.Module, Params]:
    """The phase-1 run's feature distiller (its ``config.json`` model, ``model.pt`` state) on
    the run's device; a clear error when it is not a finished ``fedfed_vae`` run for this data
    (same data set, clients, partition and seed: :func:`data_differences`)."""
    path = Path(run_dir)
    config_file, model_file = path / "config.json", path / "model.pt"  # fedveil.runtime.run_dir's layout
    if not config_file.is_file() or not model_file.is_file():
        raise ConfigError(f"algorithm.distiller: '{run_dir}' is not a finished fedveil run (needs config.json and model.pt)")
    phase1 = json.loads(config_file.read_text())
    model_config = phase1["model"]
    if model_config["name"] != "fedfed_vae":
        raise ConfigError(f"algorithm.distiller: '{run_dir}' trained model '{model_config['name']}', not a fedfed_vae distiller")
    if "data" in phase1:  # every run's config.json has it; a bare model-only config is not compared
        differs = [f"{key} {was!r} there, {now!r} here" for key, was, now in data_differences(phase1, ctx)]
        if differs:
            raise ConfigError(f"algorithm.distiller: '{run_dir}' ran on other data than this run: {'; '.join(differs)}")
    try:
        model = build_model("fedfed_vae", ctx.input_shape, ctx.num_classes, **model_config.get("options", {}))
        model.to(ctx.device).load_state_dict(torch.load(model_file, map_location=ctx.device, weights_only=True))
    except (ValueError, RuntimeError) as err:
        raise ConfigError(f"algorithm.distiller: '{run_dir}' does not fit this run's data: {err}") from None
    return model, model_state(model)  # the loaded values in the model's own dtype and device


def data_differences(phase1: dict[str, Any], ctx: RunContext) -> list[tuple[str, Any, Any]]:
    """``(key, phase 1's value, this run's)`` for each of the data set, client count,
    partition settings and seed (which rows each client holds) that differ."""

    def identity(data: dict[str, Any], seed: Any) -> dict[str, Any]:
        partition = {f"data.partition.{k}": v for k, v in (data.get("partition") or {}).items()}
        return {"data.name": data.get("name"), "data.num_clients": data.get("num_clients"), **partition, "seed": seed}

    was, now = identity(phase1["data"], phase1.get("seed")), identity(ctx.data, ctx.seed)
    return [(key, was.get(key), now.get(key)) for key in dict.fromkeys([*was, *now]) if was.get(key) != now.get(key)]


def balanced_draw(labels: torch.Tensor, n: int, num_classes: int, generator: torch.Generator) -> torch.Tensor:
    """Indices of ``n`` pooled rows: ``n // C`` of every class present (without replacement
    while the class has enough rows), the rest uniformly from the whole pool (spec 003 §1.7)."""
    on = generator.device
    y = labels.to(on)
    picks = []
    for c in range(num_classes):
        rows = (y == c).nonzero().flatten()
        if len(rows) == 0:
            continue
        per = n // num_classes
        if per <= len(rows):
            picks.append(rows[torch.randperm(len(rows), generator=generator, device=on)[:per]])
        else:
            picks.append(rows[torch.randint(len(rows), (per,), generator=generator, device=on)])
    taken = sum(len(p) for p in picks)
    picks.append(torch.randint(len(y), (n - taken,), generator=generator, device=on))
    return torch.cat(picks).to(labels.device)


class SharedFeatures:
    """FedFed's phase 2 on top of a FedAvg-family algorithm (module docstring): the setup
    releases and pools every client's features; each round adds a class-balanced draw of
    the pool after the client's own rows."""

    has_setup = True
    supports_client_dp = False  # the shared features are per-record releases, not a client-level quantity

    def __init__(self, params: SharedFeatureParams, ctx: RunContext) -> None:
        super().__init__(params, ctx)
        if ctx.task != "classification":
            raise ConfigError("FedFed shares features with their labels: it needs a classification data set")
        self.distiller, self.distiller_state = load_distiller(params.distiller, ctx)
        self.max_norm = math.sqrt(math.prod(ctx.input_shape))  # ||x|| <= sqrt(d) for pixels in [0, 1]

    def planned_setup_releases(self, client_id: int, num_train: int) -> list[Release]:
        """The per-record feature release of each client (:func:`~fedveil.privacy.feature_release.feature_releases`)."""
        return feature_releases(self.hp.sigma, self.distiller.rho, self.max_norm)

    def client_setup(self, client_id: int, data: ClientData, generator: torch.Generator) -> SetupResult:
        """Releases the client's rows' features x_s + sigma n
        (:func:`release_features`) with their labels; inputs must lie in [0, 1]."""
        x = data.train.x
        if float(x.min()) < 0.0 or float(x.max()) > 1.0:
            raise ConfigError(
                f"FedFed: client {client_id}'s inputs lie in [{float(x.min()):.3g}, {float(x.max()):.3g}]; the release's "
                "bound ||x|| <= sqrt(d) needs pixels in [0, 1] (use unnormalised images)"
            )
        source = self.ctx.noise.stream("fedfed-release", generator)
        shared = release_features(self.distiller, self.distiller_state, data.train, self.hp.sigma, source)
        return SetupResult({"x": shared.x, "y": shared.y}, self.planned_setup_releases(client_id, len(data.train)))

    def finish_setup(self, server_state: State, contributions: list[tuple[int, Any]]) -> State:
        """Pools every client's released features and labels in the server state's ``shared``."""
        pool = {key: torch.cat([c[key] for _, c in contributions]) for key in ("x", "y")}
        return {**server_state, "shared": pool}

    def training_rows(self, server_state: State, task: ClientTask) -> ArrayDataset:
        """The client's own rows followed by a class-balanced draw of as many pooled rows (:func:`balanced_draw`)."""
        own = task.data.train
        pool = server_state["shared"]
        index = balanced_draw(pool["y"], len(own), self.ctx.num_classes, task.generator)
        return ArrayDataset.concat([own, ArrayDataset(pool["x"][index], pool["y"][index])])

    def request_options(self, task: ClientTask) -> dict[str, Any]:
        """The base algorithm's options plus ``private_rows``: only the own rows count for DP-SGD and the epochs."""
        return {**super().request_options(task), "private_rows": task.data.num_train}


class FedFedParams(SharedFeatureParams, FedAvgParams):
    """The shared-feature settings and the base algorithm's."""


class FedFedProxParams(SharedFeatureParams, FedProxParams):
    """The shared-feature settings and the base algorithm's."""


class FedFedScaffoldParams(SharedFeatureParams, ScaffoldParams):
    """The shared-feature settings and the base algorithm's."""


@ALGORITHMS.register("fedfed_fedavg", "FedFed phase 2 on FedAvg: own rows + the shared noisy features (Alg. 2)")
class FedFedAvg(SharedFeatures, FedAvg):
    """FedAvg on own rows plus the shared features (Alg. 2, Eq. 10)."""

    Params = FedFedParams


@ALGORITHMS.register("fedfed_fedprox", "FedFed phase 2 on FedProx (Alg. 2 with Eq. 11)")
class FedFedProx(SharedFeatures, FedProx):
    """FedProx on own rows plus the shared features (Alg. 2 with Eq. 11)."""

    Params = FedFedProxParams


@ALGORITHMS.register("fedfed_scaffold", "FedFed phase 2 on SCAFFOLD (Alg. 3)")
class FedFedScaffold(SharedFeatures, Scaffold):
    """SCAFFOLD (option II) on own rows plus the shared features (Alg. 3)."""

    Params = FedFedScaffoldParams


@ALGORITHMS.register("fedfed_fednova", "FedFed phase 2 on FedNova (Alg. 4, the canonical update)")
class FedFedNova(SharedFeatures, FedNova):
    """FedNova's normalised averaging on own rows plus the shared features (Alg. 4, canonical sign)."""

    Params = FedFedParams
