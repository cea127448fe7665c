"""IFCA clustering with private cluster selection, and IFCA-preconditioned MR-MTL
(Ghosh et al. 2020; spec 002 §1.4, §2.8, App. C.2 Alg. 2, [C1] ``ifca_mrmtl.py``).

G cluster models (centroids), each randomly initialised from its own seed. In the first
N_sel = select_fraction x R rounds every silo picks the centroid with the lowest score on
its own training set; afterwards membership is frozen. While round < N_fed
(= fedavg_fraction x R) a silo trains a copy of its centroid (cluster-FedAvg); later
rounds train its own model towards the centroid with MR-MTL's lambda/2 ||w - w_g||^2
(lambda = 0: IFCA + local fine-tuning). Each centroid moves by the p-weighted mean of its
members' updates (eq. C.1/C.2). Variants: ``select_fraction = fedavg_fraction = 1`` is
IFCA with selection every round; ``select_fraction = 0.1, fedavg_fraction = 1`` is
"IFCA (10%)"; ``fedavg_fraction = select_fraction = 0.05, lam > 0`` is IFCA-warm-started
MR-MTL (Fig. 1.6).

Private selection (report-noisy-max, eq. 1.5): argmin_g (s_g - Gumbel(2 Delta / eps_sel)),
eps_sel = ``selection_budget_fraction`` x the silo's epsilon (0.03 in the paper), each
selection ``eps_sel^2 / 8``-zCDP, composed with the silo's DP-SGD steps; the privacy plan
calibrates the DP-SGD noise so that the total stays at the silo's budget. Scores:
classification error rate, sensitivity 1/(n - 1) (eq. B.1); regression mean training loss
clipped at ``loss_clip``. Decision: that mean of losses in [0, loss_clip] has sensitivity
loss_clip / n under replace-one, which we use; [C1] uses loss_clip itself (n times more
noise than needed).
"""
from __future__ import annotations

import math
from typing import Any, Literal

import torch
from pydantic import Field, model_validator
from torch.func import vmap

from .. import params as P
from ..errors import ConfigError
from ..models.functional import forward
from ..privacy.events import Release, report_noisy_max_release
from ..privacy.randomness import gumbel
from ..seeding import derive_seed
from .base import ALGORITHMS, Algorithm, AlgorithmParams, ClientResult, ClientTask, State
from .mean_regularized import regulariser, sample_weight


class IFCAParams(AlgorithmParams):
    """IFCA's settings: clusters G, the selection and cluster-FedAvg
    phases, MR-MTL's lambda and the selection budget."""

    clusters: int = Field(3, ge=1, description="number of cluster models G")
    select_fraction: float = Field(0.1, gt=0.0, le=1.0, description="fraction of rounds in which silos (re)choose a cluster")
    fedavg_fraction: float = Field(1.0, ge=0.0, le=1.0, description="fraction of rounds that train the cluster model itself")
    lam: float = Field(0.0, ge=0.0, description="MR-MTL pull towards the cluster model after the cluster-FedAvg phase")
    selection_budget_fraction: float = Field(0.03, gt=0.0, lt=1.0, description="share of a silo's epsilon per selection")
    loss_clip: float = Field(0.1, gt=0.0, description="regression: training losses are clipped here for the score")
    weighting: Literal["samples", "uniform"] = Field("samples", description="member weights within a cluster")
    reg_in_clip: bool = Field(True, description="under DP-SGD clip the regulariser gradient with each example's ([C1])")

    @model_validator(mode="after")
    def _phases(self) -> "IFCAParams":
        if self.fedavg_fraction < self.select_fraction:
            raise ValueError("fedavg_fraction must be >= select_fraction (clusters are trained while they are chosen)")
        return self


@ALGORITHMS.register("ifca", "IFCA clustered FL with private cluster selection (+ optional MR-MTL towards the cluster)")
class IFCA(Algorithm):
    """G cluster models; silos privately pick one, train it, then optionally personalise towards it."""

    Params = IFCAParams

    def is_public_metric(self, name: str) -> bool:
        """The cluster shares: post-processing of the private (report-noisy-max) choices."""
        return name.startswith("cluster_") and name.endswith("_share")
    has_personal_models = True
    has_global_model = False

    def __init__(self, params: IFCAParams, ctx) -> None:
        super().__init__(params, ctx)
        self.scoring_model = ctx.model_factory()  # the architecture the centroids are scored with

    @property
    def selection_rounds(self) -> int:
        """N_sel = floor(``select_fraction`` x R), at least 1: the rounds in which silos choose a cluster."""
        return max(1, math.floor(self.hp.select_fraction * self.ctx.rounds))

    @property
    def fedavg_rounds(self) -> int:
        """N_fed = floor(``fedavg_fraction`` x R): the rounds that train the cluster models themselves."""
        return math.floor(self.hp.fedavg_fraction * self.ctx.rounds)

    def init_server(self, initial: P.Params) -> State:
        """G centroids, each initialised on the CPU from its own seed, beside the initial model."""
        centroids = []
        for g in range(self.hp.clusters):
            model = self.ctx.model_factory("cpu")  # drawn on the CPU: the same centroids on any device
            with torch.random.fork_rng():
                torch.manual_seed(derive_seed(self.ctx.seed, "ifca-centroid", g))
                for module in model.modules():
                    if hasattr(module, "reset_parameters"):
                        module.reset_parameters()
            centroids.append({k: v.detach().to(self.ctx.device, copy=True) for k, v in model.named_parameters()})
        return {"params": initial, "centroids": dict(enumerate(centroids))}

    # ------------------------------------------------------------------ selection
    def _selects(self, round_idx: int, client_state: State | None) -> bool:
        return round_idx < self.selection_rounds or client_state is None

    def selection_epsilon(self, budget: float | None) -> float:
        """eps_sel = ``selection_budget_fraction`` x the silo's epsilon; a ConfigError without one."""
        if budget is None:
            raise ConfigError("privacy: private IFCA selection needs privacy.epsilon (eps_sel is a share of it)")
        return self.hp.selection_budget_fraction * budget

    def planned_releases(
        self, client_id: int, num_train: int, budget: float | None, rounds: list[int]
    ) -> dict[int, list[Release]]:
        """One report-noisy-max release per selecting round (and at a first participation after the selection phase)."""
        selecting = [r for r in rounds if r < self.selection_rounds]
        if rounds and rounds[0] >= self.selection_rounds:
            selecting.append(rounds[0])  # first seen after the selection phase: chooses once
        return {r: [report_noisy_max_release(self.selection_epsilon(budget))] for r in selecting}

    def scores(self, centroids: dict[int, P.Params], task: ClientTask) -> torch.Tensor:
        """Error rate (classification) or mean clipped loss (regression) of each centroid on the local training set."""
        data, model = task.data.train, self.scoring_model
        per_example = vmap(lambda o, t: task.trainer.loss_fn(o.unsqueeze(0), t.unsqueeze(0)))
        out = []
        with torch.no_grad():
            for g in range(len(centroids)):
                logits = forward(model, centroids[g], data.x)
                if self.ctx.task == "classification":
                    out.append((logits.argmax(1) != data.y).float().mean())
                else:
                    out.append(per_example(logits, data.y).clamp(max=self.hp.loss_clip).mean())
        return torch.stack(out)

    def sensitivity(self, n: int) -> float:
        """Sensitivity of a score over ``n`` rows: 1/(n - 1) for
        the error rate (eq. B.1), loss_clip / n for regression."""
        if self.ctx.task == "classification":
            return 1.0 / max(n - 1, 1)
        return self.hp.loss_clip / n

    def choose(self, centroids: dict[int, P.Params], task: ClientTask) -> tuple[int, list[Release]]:
        """The centroid with the lowest score, under DP by
        report-noisy-max with Gumbel noise (eq. 1.5), and its releases."""
        scores = self.scores(centroids, task)
        if task.dp is None:
            return int(scores.argmin()), []
        eps_sel = self.selection_epsilon(task.privacy_budget)
        noise = gumbel(len(scores), self.ctx.noise.stream("ifca-selection", task.generator))
        noisy = scores.double() - (2.0 * self.sensitivity(task.data.num_train) / eps_sel) * noise
        return int(noisy.argmin()), [report_noisy_max_release(eps_sel)]

    # ------------------------------------------------------------------ training
    def client_update(self, server_state: State, client_state: State | None, task: ClientTask) -> ClientResult:
        """Chooses a cluster (while selecting), then trains its centroid (cluster-FedAvg)
        or the own model towards it (MR-MTL); sends the delta, cluster and weight."""
        centroids = server_state["centroids"]
        releases: list[Release] = []
        if self._selects(task.round, client_state):
            cluster, releases = self.choose(centroids, task)
        else:
            cluster = client_state["cluster"]
        if task.round < self.fedavg_rounds or client_state is None:
            start, hook = centroids[cluster], None
        else:
            start = client_state["params"]
            hook = regulariser(self.hp.lam, centroids[cluster], self.hp.reg_in_clip)
        new, stats = task.trainer.train(start, task.data.train, task.generator, task.round, hook, dp=task.dp)
        message = {"delta": P.sub(new, start), "cluster": cluster, "weight": sample_weight(self.hp.weighting, task.data.num_train)}
        state = {"params": new, "cluster": cluster}
        return ClientResult(message=message, state=state, stats=stats, releases=releases,
                            extra_metrics={f"cluster_{g}_share": float(cluster == g) for g in range(self.hp.clusters)})

    def aggregate(self, server_state: State, results: list[tuple[int, dict[str, Any]]], round_idx: int) -> State:
        """Moves each centroid by the weighted mean of its members'
        deltas (eq. C.1/C.2); centroids without members stay."""
        centroids = dict(server_state["centroids"])
        for g in range(len(centroids)):
            members = [m for _, m in results if m["cluster"] == g]
            if members:
                mean = P.weighted_mean([m["delta"] for m in members], [m["weight"] for m in members])
                centroids[g] = P.add(centroids[g], mean)
        return {**server_state, "centroids": centroids}

    def personal_params(self, server_state: State, client_state: State | None, task: ClientTask) -> P.Params:
        """The silo's own model; its centroid if training ends in cluster-FedAvg; centroid 0 if it never trained."""
        if client_state is None:
            return server_state["centroids"][0]
        if self.ctx.rounds <= self.fedavg_rounds:  # still cluster-FedAvg at the end: the member's centroid
            return server_state["centroids"][client_state["cluster"]]
        return client_state["params"]
