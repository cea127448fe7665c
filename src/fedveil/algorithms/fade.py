"""FADE: federated adversarial debiasing (Hong et al., KDD 2021; dissertation ch. 3; spec 004).

Each user trains encoder G, task head f and group discriminator D (``fade_mlp`` /
``fade_cnn`` models, :mod:`fedveil.models.fade`) on one loss,
``L_task(f(z), y) + adv(D(GRL_lambda(z)), g)`` (Alg. 3.1 via the gradient reversal layer):
D learns to recognise the user's own group g, G learns to hide it. The group label is a
per-row group of the user's data (``group_key``) read only inside the objective: it never
leaves the user. The server averages all of (f, G, D) with momentum beta (Alg. 3.2):
``theta <- beta sum_i (n_i / N) theta_i + (1 - beta) theta``, i.e. FedAvg with server
step beta (beta = 1 is FedAvg).

Adversarial losses (``adversarial_loss``): ``vanilla`` = mean CE of D on the own group
(Eq. 3.3, the negative log-likelihood); ``squared`` = ``(mean CE)^2 / 2`` (Eq. 3.6, the
batch mean squared, as the official ``sq_bce``); ``power`` = ``mean(CE^q) / q`` (Eq. 3.7,
the power inside the expectation). With two groups the two-logit CE is the BCE of Eq. 3.3.

Decisions on the spec's open points (spec 004 §1.5, §1.10, §1.12):

* Opt-out (Alg. 3.1 else-branch): a user that opts out this round (``opt_out_clients``,
  or with probability ``opt_out`` per round, drawn from the run seed) trains with the task
  loss only and a parameter mask on ``disc.*``: D stays bit-identical and is uploaded
  unchanged (a zero update), which keeps client-level DP-FedAvg's update shape.
* lambda_t = lam (2 / (1 + exp(-10 p)) - 1), p = max(t - warmup_rounds, 0) / T (global
  round t, spec §1.10), written into the state's ``reverse.lam`` buffer each round; the
  DANN learning-rate decay is the trainer's ``client.lr_schedule = "dann"``, per round.
* Divergence guard (official code): per step in the code; here per round, since training
  steps belong to the trainer. A user reports the adversarial loss of its trained model
  on its training rows; if one exceeds ``guard``, the server re-initialises D (Xavier
  normal, zero bias) and runs the next round with lambda = 0. The report is a statistic
  of raw data, so the guard is off under DP at either level (it would be an unaccounted release).
* Unlabelled users (``unlabelled_clients``, UDA targets) have no task loss; with
  ``im_weight > 0`` they add SHOT's information maximisation ``E[H(p)] - H(E[p])``
  (user-collapse mitigation, §1.8), with ``pseudo_label_weight > 0`` SHOT's CE on
  clustering pseudo-labels computed once per round from the round's starting model
  (two centroid iterations, cosine distance), and ``freeze_head_unlabelled`` keeps f fixed
  as SHOT does. Pseudo-labels depend on all of a user's rows, so they rule out example-level DP. ``entropy_weights`` weighs each row's adversarial loss
  by CDAN's ``1 + exp(-H(p))``, normalised within the batch (use with ``conditioning="cdan"``).
* Squared loss, IM and entropy weights couple the rows of a batch: per-example DP-SGD
  cannot bound them and refuses; vanilla and power losses run under example-level DP.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from .. import params as P
from ..errors import ConfigError
from ..models.functional import forward, submodule_forward
from ..seeding import derive_seed
from ..data.arrays import ArrayDataset
from ..training.request import Batch, Objective
from .base import ALGORITHMS, AlgorithmParams, ClientResult, ClientTask, RunContext, State
from .fedavg import FedAvg

DISC_PREFIX = "disc."
HEAD_PREFIX = "head."
LAMBDA_KEY = "reverse.lam"
GUARD_ROWS = 512  # rows a user scores for the divergence guard
PSEUDO_KEY = "shot_pseudo_label"


class FadeParams(AlgorithmParams):
    """FADE's settings: group key, server momentum beta, the lambda schedule,
    adversarial loss, opt-outs, SHOT options and the divergence guard."""

    group_key: str = Field("sex", min_length=1, description="per-row group of the data that D predicts (sensitive attribute or domain)")
    beta: float = Field(0.5, gt=0.0, le=1.0, description="server momentum beta of Alg. 3.2 (1 = FedAvg)")
    weighting: Literal["samples", "uniform"] = Field("samples", description="user weights n_i / N or uniform")
    lam: float = Field(1.0, ge=0.0, description="largest adversarial weight lambda (0 = no adversary)")
    lam_schedule: Literal["dann", "constant"] = Field("dann", description="lambda_t: DANN ramp 0 -> lam, or lam throughout")
    warmup_rounds: int = Field(0, ge=0, description="rounds before the lambda ramp starts (lambda = 0)")
    adversarial_loss: Literal["vanilla", "squared", "power"] = Field(
        "vanilla", description="vanilla (Eq. 3.3), squared batch loss (Eq. 3.6) or power q inside the mean (Eq. 3.7)"
    )
    q: float = Field(2.0, ge=1.0, description="the power of adversarial_loss = power")
    opt_out: float = Field(0.0, ge=0.0, le=1.0, description="probability a user sits out the adversarial game in a round")
    opt_out_clients: list[int] = Field(default_factory=list, description="users that never join the adversarial game")
    unlabelled_clients: list[int] = Field(default_factory=list, description="users without labels (UDA targets): no task loss")
    im_weight: float = Field(0.0, ge=0.0, description="SHOT information maximisation weight for unlabelled users")
    pseudo_label_weight: float = Field(
        0.0, ge=0.0, description="SHOT: weight of the CE on clustering pseudo-labels for unlabelled users (0 = off)"
    )
    freeze_head_unlabelled: bool = Field(False, description="SHOT: unlabelled users keep the task head f fixed")
    entropy_weights: bool = Field(False, description="CDAN entropy conditioning weights 1 + exp(-H(p)) on the adversarial loss")
    guard: float | None = Field(10.0, gt=0.0, description="re-initialise D when a user's adversarial loss exceeds this (None = off)")


@dataclass(frozen=True)
class FadeObjective(Objective):
    """One user's loss: task CE (labelled users), SHOT IM (unlabelled, optional) and the
    adversarial loss of D on the user's own group (when the user plays the game)."""

    group_key: str
    labelled: bool = True
    adversarial: bool = True
    adversarial_loss: str = "vanilla"
    q: float = 2.0
    im_weight: float = 0.0
    entropy_weights: bool = False
    pseudo_label_weight: float = 0.0

    @property
    def per_example_ok(self) -> bool:  # type: ignore[override]
        """False when a term couples the batch's rows (squared loss, entropy weights, IM), so DP-SGD refuses it."""
        couples = self.adversarial and (self.adversarial_loss == "squared" or self.entropy_weights)
        return not couples and not (not self.labelled and self.im_weight > 0)

    def mean(self, out: tuple[torch.Tensor, torch.Tensor], batch: Batch) -> torch.Tensor:
        """Task CE (or SHOT IM / pseudo-label CE for unlabelled users) plus, for a player, :meth:`adversarial_term`."""
        logits, group_logits = out
        loss = logits.sum() * 0.0
        if self.labelled:
            loss = loss + F.cross_entropy(logits, batch.y)
        else:
            if self.im_weight > 0:
                loss = loss + self.im_weight * information_maximisation(logits)
            if self.pseudo_label_weight > 0:
                loss = loss + self.pseudo_label_weight * F.cross_entropy(logits, batch.groups[PSEUDO_KEY])
        if self.adversarial:
            loss = loss + self.adversarial_term(logits, group_logits, batch)
        return loss

    def adversarial_term(self, logits: torch.Tensor, group_logits: torch.Tensor, batch: Batch) -> torch.Tensor:
        """D's loss on the own group: vanilla CE (Eq. 3.3), power ``CE^q / q``
        (Eq. 3.7) or squared ``mean^2 / 2`` (Eq. 3.6), entropy-weighted when set."""
        ce = F.cross_entropy(group_logits, batch.groups[self.group_key].long(), reduction="none")
        if self.adversarial_loss == "power":
            ce = ce**self.q / self.q
        if self.entropy_weights:
            weights = 1.0 + torch.exp(-entropy(torch.softmax(logits, dim=1).detach()))
            term = (weights * ce).sum() / weights.sum()
        else:
            term = ce.mean()
        return 0.5 * term**2 if self.adversarial_loss == "squared" else term


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Row entropies ``-sum_c p_c log(p_c + 1e-5)`` (CDAN's form)."""
    return -(probs * torch.log(probs + 1e-5)).sum(1)


def information_maximisation(logits: torch.Tensor) -> torch.Tensor:
    """SHOT's ``E_x[H(p(x))] - H(E_x[p(x)])``: confident yet diverse predictions (spec §1.9)."""
    probs = torch.softmax(logits, dim=1)
    return entropy(probs).mean() - entropy(probs.mean(0, keepdim=True)).sum()


def _cosine_nearest(z: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    z_n = F.normalize(z, dim=1)
    c_n = F.normalize(centroids, dim=1)
    return (z_n @ c_n.T).argmax(1)


def shot_pseudo_labels(z: torch.Tensor, probs: torch.Tensor, iterations: int = 2) -> torch.Tensor:
    """SHOT's self-supervised pseudo-labels (Liang et al. 2020, spec §1.9): class centroids of
    the features weighted by the predicted probabilities, each row labelled by its nearest
    centroid in cosine distance; then centroids of the labelled rows and relabelling."""
    weights = probs
    labels = probs.argmax(1)
    for _ in range(iterations):
        centroids = weights.T @ z / (weights.sum(0)[:, None] + 1e-8)
        labels = _cosine_nearest(z, centroids)
        weights = F.one_hot(labels, probs.shape[1]).to(z.dtype)
    return labels


def lambda_at(round_idx: int, rounds: int, lam: float, schedule: str, warmup: int) -> float:
    """lambda_t = lam (2 / (1 + exp(-10 p)) - 1), p = max(t - warmup, 0) / T (spec §1.10)."""
    if schedule == "constant":
        return lam if round_idx >= warmup else 0.0
    p = max(round_idx - warmup, 0) / rounds
    return lam * (2.0 / (1.0 + math.exp(-10.0 * p)) - 1.0)


@ALGORITHMS.register("fade", "FADE: adversarial debiasing across users, group labels kept local (vanilla / squared loss)")
class Fade(FedAvg):
    """Alg. 3.1 (user update through the trainer's objective) and Alg. 3.2 (momentum beta)."""

    secure_summable = False  # the divergence guard reads each client's group loss

    public_metrics = ("lambda", "adversarial_users")  # the schedule's lambda and the opt-out draws
    signal_labels = {
        "lambda": "adversarial weight lambda (schedule)", "adversarial_users": "share of clients training the adversary",
        "group_loss": "group discriminator loss",
    }
    Params = FadeParams
    hp: FadeParams

    def __init__(self, params: FadeParams, ctx: RunContext) -> None:
        super().__init__(params, ctx)
        for key in ("unlabelled_clients", "opt_out_clients"):
            outside = [c for c in getattr(params, key) if not 0 <= c < ctx.num_clients]
            if outside:
                raise ConfigError(
                    f"algorithm.{key}: client ids must lie in [0, {ctx.num_clients}) for {ctx.num_clients} clients, "
                    f"got {outside}"
                )
        names = [n for n, _ in ctx.trainer.model.named_parameters()]
        self.disc_names = [n for n in names if n.startswith(DISC_PREFIX)]
        buffers = [n for n, _ in ctx.trainer.model.named_buffers()]
        if not self.disc_names or LAMBDA_KEY not in buffers:
            raise ConfigError(
                "fade needs a FADE network with a discriminator behind a gradient reversal "
                "(model.name = \"fade_mlp\" or \"fade_cnn\")"
            )
        # losses of batch statistics cannot be clipped per example: the runtime refuses example-level DP
        coupled = [o for o in (self.objective(c, True) for c in self._sample_clients()) if not o.per_example_ok]
        # pseudo-labels are computed from all of a user's rows: one row's label depends on the others
        if coupled or (params.pseudo_label_weight > 0 and params.unlabelled_clients):
            self.supports_example_dp = False

    def _sample_clients(self) -> list[int]:
        """One labelled and (if any) one unlabelled user id: the kinds of objective this run uses."""
        unlabelled = self.hp.unlabelled_clients[:1]
        labelled = [c for c in range(self.ctx.num_clients) if c not in self.hp.unlabelled_clients][:1]
        return labelled + unlabelled

    def init_server(self, initial: P.Params) -> State:
        """The initial model and ``lambda_off_round = -1`` (no divergence-guard reset pending)."""
        return {"params": initial, "lambda_off_round": -1}

    def lambda_of(self, server_state: State, round_idx: int) -> float:
        """lambda_t of round ``round_idx`` (:func:`lambda_at`); 0 in the round after a divergence-guard reset."""
        if server_state.get("lambda_off_round") == round_idx:  # the round after a divergence guard reset
            return 0.0
        return lambda_at(round_idx, self.ctx.rounds, self.hp.lam, self.hp.lam_schedule, self.hp.warmup_rounds)

    def plays(self, client_id: int, round_idx: int) -> bool:
        """Whether the user joins the adversarial game this round (not opted out)."""
        if client_id in self.hp.opt_out_clients or self.hp.lam == 0:
            return False
        if self.hp.opt_out == 0:
            return True
        draw = torch.Generator().manual_seed(derive_seed(self.ctx.seed, "fade-opt-out", round_idx, client_id))
        return bool(torch.rand((), generator=draw, device=draw.device) >= self.hp.opt_out)

    def objective(self, client_id: int, plays: bool) -> FadeObjective:
        """The :class:`FadeObjective` of user ``client_id``: labelled or not, and with D's term if it ``plays``."""
        hp = self.hp
        return FadeObjective(
            hp.group_key, labelled=client_id not in hp.unlabelled_clients, adversarial=plays,
            adversarial_loss=hp.adversarial_loss, q=hp.q, im_weight=hp.im_weight, entropy_weights=hp.entropy_weights,
            pseudo_label_weight=hp.pseudo_label_weight,
        )

    def check_groups(self, task: ClientTask) -> None:
        """The user's rows carry ``group_key`` with values the discriminator can output."""
        groups = task.data.train.groups
        if self.hp.group_key not in groups:
            raise ConfigError(
                f"fade: the data has no group '{self.hp.group_key}' (groups: {', '.join(sorted(groups)) or 'none'}); "
                "set algorithm.group_key"
            )
        outputs = self.ctx.trainer.model.disc.out.out_features
        largest = int(groups[self.hp.group_key].max()) if len(groups[self.hp.group_key]) else 0
        if largest >= outputs:
            raise ConfigError(
                f"fade: group '{self.hp.group_key}' has value {largest} but the discriminator has {outputs} outputs; "
                f"set model.options.groups = {largest + 1}"
            )

    def client_update(self, server_state: State, client_state: State | None, task: ClientTask) -> ClientResult:
        """Alg. 3.1: train with lambda_t in the reversal layer (D frozen when the user opts out;
        SHOT for unlabelled users), send the delta and, outside DP, the group loss the guard reads."""
        self.check_groups(task)
        plays = self.plays(task.client_id, task.round)
        start = dict(server_state["params"])
        lam = self.lambda_of(server_state, task.round) if plays else 0.0
        start[LAMBDA_KEY] = torch.full_like(start[LAMBDA_KEY], lam)
        frozen = [] if plays else list(self.disc_names)
        data = task.data.train
        if task.client_id in self.hp.unlabelled_clients:
            if self.hp.freeze_head_unlabelled:
                frozen += [n for n in start if n.startswith(HEAD_PREFIX)]
            if self.hp.pseudo_label_weight > 0:
                data = self.with_pseudo_labels(start, data, task)
        mask = {n: torch.zeros_like(start[n]) for n in frozen} or None
        objective = self.objective(task.client_id, plays)
        new, stats = task.trainer.train(
            start, data, task.generator, task.round, dp=task.dp, objective=objective, param_mask=mask
        )
        message: dict[str, Any] = {"delta": P.sub(new, start), "num_examples": task.data.num_train, "steps": stats.steps}
        metrics = {"lambda": lam, "adversarial_users": float(plays)}
        if plays and self.hp.guard is not None and not self.ctx.private:  # an un-noised loss: never under DP
            message["group_loss"] = self.group_loss(new, task, objective)
            metrics["group_loss"] = message["group_loss"]
        return ClientResult(message=message, state=client_state, stats=stats, extra_metrics=metrics)

    def with_pseudo_labels(self, state: P.Params, data: ArrayDataset, task: ClientTask) -> ArrayDataset:
        """The user's rows with SHOT pseudo-labels from the round's starting model (labels never used)."""
        model = task.trainer.model
        with torch.no_grad():
            z = submodule_forward(model, "encoder", state, data.x)
            probs = torch.softmax(submodule_forward(model, "head", state, z), dim=1)
        pseudo = shot_pseudo_labels(z, probs)
        return ArrayDataset(data.x, data.y, {**data.groups, PSEUDO_KEY: pseudo}, data.info)

    def group_loss(self, state: P.Params, task: ClientTask, objective: FadeObjective) -> float:
        """The trained model's adversarial loss on (up to GUARD_ROWS of) the user's training rows."""
        data = task.data.train
        rows = torch.arange(min(len(data), GUARD_ROWS), device=data.x.device)
        batch = Batch.of(data, rows)
        with torch.no_grad():
            logits, group_logits = forward(task.trainer.model, state, batch.x)
            return float(objective.adversarial_term(logits, group_logits, batch))

    def server_update(self, server_state: State, mean_delta: P.Params) -> State:
        """Alg. 3.2: theta + beta * sum_i p_i (theta_i - theta) = beta * sum_i p_i theta_i + (1 - beta) theta."""
        params = server_state["params"]
        return {**server_state, "params": {**params, **P.add(self.trained(params), mean_delta, self.hp.beta)}}

    def aggregate(self, server_state: State, results: list[tuple[int, dict[str, Any]]], round_idx: int) -> State:
        """FedAvg with server step beta (Alg. 3.2); a reported group loss
        above ``guard`` re-initialises D and turns lambda off next round."""
        state = super().aggregate(server_state, results, round_idx)
        losses = [m["group_loss"] for _, m in results if "group_loss" in m]
        if self.hp.guard is not None and losses and max(losses) > self.hp.guard:
            state = {**state, "params": self.reset_discriminator(state["params"], round_idx), "lambda_off_round": round_idx + 1}
        return state

    def reset_discriminator(self, params: P.Params, round_idx: int) -> P.Params:
        """D re-initialised: Xavier-normal weights, zero biases (the official divergence guard)."""
        draw = torch.Generator().manual_seed(derive_seed(self.ctx.seed, "fade-guard", round_idx))
        fresh = dict(params)
        for name in self.disc_names:
            value = params[name]
            if name.endswith("weight"):
                fan_out, fan_in = value.shape[0], value[0].numel()
                std = math.sqrt(2.0 / (fan_in + fan_out))
                fresh[name] = (torch.randn(value.shape, generator=draw, dtype=value.dtype, device=draw.device) * std).to(value.device)
            else:
                fresh[name] = torch.zeros_like(value)
        return fresh

    def predict(self, model, state: P.Params, x: torch.Tensor) -> torch.Tensor:
        """The task head's logits (the discriminator's output is not a prediction)."""
        return forward(model, state, x)[0]
