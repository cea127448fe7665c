"""ADDS: adaptive differentiable sampling of client subnets (Gong et al. 2021, arXiv
2110.15522; spec 001 §1). Not a client sampler: each client learns which hidden units of a
shared supernet to keep.

Client i, each round (Alg. 1 lines 10-17):

* split its training rows at random into weight rows (90%) and validation rows (10%),
  re-drawn every round (§3.2);
* reset the keep ratios alpha_k of every sampleable layer to ``alpha_init`` (line 11);
* train with the shared trainer. Each step's batch of weight rows is joined by a batch of
  validation rows and fresh uniforms (:class:`ArchitectureRows`); the supernet
  (:class:`~fedveil.models.supernet.SampledNet`) samples unit masks with probabilities
  ``p_c = sigmoid((b_c - beta(alpha_k)) / eps)`` (Eq. 13-14). Weight rows train the weights
  under hard masks (line 14); validation rows train the alphas through straight-through
  masks on detached weights (line 13, Eq. 9 and 18), plus the regulariser ``lam sum_k
  alpha_k^2`` (Eq. 5-6, :class:`KeepRatioTerm`). Both steps share one gradient evaluation:
  the weight step's masks are drawn from the alphas before that step's update (the paper
  redraws them after it), a lag of one step;
* keep the top ``round(alpha_k C_k)`` units of each layer by importance (line 16) and upload
  that subnet's weights with its index map (one bit per unit).

The server averages each entry over the clients whose subnet holds it, entries nobody holds
keep their value (Eq. 19, unweighted; ``weighting = "samples"`` weights by n_i).
``lam = None`` gives each client ``lam_i = JSD(P_i, U) / JSD_max + 0.5`` from its label
distribution (§4.1.4, :func:`label_skew_lambda`); ``eps_t = eps0 decay^t`` (t = round).
``sampling = False`` keeps every unit with no architecture step: FedAvg on the supernet
(§4.1.2). Acc_L, the client's subnet on its own test rows before aggregation, is logged as
``local_accuracy``; so are the uploaded and downloaded sizes and the subnet's MACs.

Example-level DP-SGD is not supported: the keep ratios and the final unit choice (FC
importances are mean activations over the client's rows) read private rows outside
DP-SGD's clipping. Decisions on the spec's open points are in ``docs/adds.md``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import Field

from .. import params as P
from ..data.arrays import ArrayDataset
from ..errors import ConfigError
from ..models import subnet as sn
from ..models.functional import forward, method_call
from ..models.supernet import ALPHA, EPS, LABEL, ROLE, UNIFORMS, UNIT_MASK
from ..models.unit_sampling import top_units
from ..training.request import Batch, LossFn, Objective
from .base import ALGORITHMS, Algorithm, AlgorithmParams, ClientResult, ClientTask, RunContext, State


class ADDSParams(AlgorithmParams):
    """Hyper-parameters of :class:`ADDS`: the eps schedule, keep ratios and their step, lam and the validation split."""

    sampling: bool = Field(True, description="false: keep every unit, no architecture step (FedAvg on the supernet)")
    eps0: float = Field(1.0, gt=0.0, description="sampling temperature ('inexactness') of round 0")
    eps_decay: float = Field(0.98, gt=0.0, le=1.0, description="eps_t = eps0 * eps_decay^t")
    alpha_init: float = Field(0.99, gt=0.0, lt=1.0, description="keep ratio every layer starts each round from")
    arch_lr: float = Field(0.01, gt=0.0, description="step size of the keep ratios (the weights use client.lr; "
                           "with client.momentum m the gradient is scaled by 1 - m, so the steady-state step is arch_lr)")
    lam: float | None = Field(
        None, ge=0.0, description="regulariser weight lam of Eq. 5 for every client; none = JSD(labels, uniform) / max + 0.5"
    )
    lam_offset: float = Field(0.5, ge=0.0, description="lam_i = normalised JSD + lam_offset when lam is none")
    val_fraction: float = Field(0.1, gt=0.0, lt=1.0, description="share of a client's training rows for the architecture step")
    val_batch_size: int = Field(0, ge=0, description="validation rows per step; 0 = client.batch_size")
    weighting: Literal["uniform", "samples"] = Field("uniform", description="Eq. 19 is unweighted; samples = by n_i")


# ---------------------------------------------------------------------------- pieces of a step


@dataclass(frozen=True)
class ADDSLoss(Objective):
    """Mean loss of the weight rows plus mean loss of the validation rows (``groups[ROLE]``):
    L_train + L_val of Eq. 4-5 (the regulariser enters as a gradient term)."""

    loss_fn: LossFn

    @property
    def per_example_ok(self) -> bool:
        """False: a step's masks and FC importances come from the whole batch."""
        return False  # the masks and FC importances of a step come from the whole batch

    def mean(self, out: torch.Tensor, batch: Batch) -> torch.Tensor:
        """L_train + L_val: the mean loss of the weight rows plus that of the validation rows (Eq. 4-5)."""
        role = batch.groups[ROLE].bool()
        parts = [self.loss_fn(out[rows], batch.y[rows]) for rows in (~role, role) if rows.any()]
        return sum(parts)


@dataclass(frozen=True)
class KeepRatioTerm:
    """Gradient hook on the keep ratios: adds the regulariser's ``2 lam alpha_k`` (Eq. 6; the
    spec's note that Eq. 18 omits it), rescales to the architecture step size (the trainer
    steps every parameter with the client lr), and drops a component that would push a
    ratio already outside ``alpha_range`` further out (the projection of spec 001 §1.8)."""

    lam: float
    alpha_range: tuple[float, float]
    scale: float

    def __call__(self, w: P.Params, g: P.Params) -> P.Params:
        lo, hi = self.alpha_range
        alpha = w[ALPHA]
        step = (g[ALPHA] + 2 * self.lam * alpha.clamp(lo, hi)) * self.scale
        outward = ((alpha >= hi) & (step < 0)) | ((alpha <= lo) & (step > 0))
        return {**g, ALPHA: torch.where(outward, torch.zeros_like(step), step)}


@dataclass(frozen=True)
class ArchitectureRows:
    """Input hook: each step's weight rows (role 0) gain ``batch`` validation rows (role 1),
    one vector of uniforms per role for the Bernoulli masks, the round's eps and the labels."""

    val: ArrayDataset
    eps: float
    units: int
    batch: int

    def __call__(self, state: P.Params, batch: Batch, generator: torch.Generator) -> Batch:
        device = batch.x.device
        idx = torch.randperm(len(self.val), generator=generator, device=generator.device)[: self.batch].to(device)
        val = Batch.of(self.val, idx)
        u_train, u_val = (torch.rand(self.units, generator=generator, device=generator.device).to(device) for _ in range(2))
        n_t, n_v = len(batch.y), len(val.y)
        groups = {k: torch.cat([batch.groups[k], val.groups[k]]) for k in batch.groups}
        groups[ROLE] = torch.cat([torch.zeros(n_t, device=device), torch.ones(n_v, device=device)])
        groups[UNIFORMS] = torch.cat([u_train.expand(n_t, -1), u_val.expand(n_v, -1)])
        groups[EPS] = torch.full((n_t + n_v,), self.eps, device=device)
        groups[LABEL] = torch.cat([batch.y, val.y])  # LRP starts from the true class's logit
        return Batch(torch.cat([batch.x, val.x]), torch.cat([batch.y, val.y]), groups)


def label_skew_lambda(labels: torch.Tensor, num_classes: int, offset: float = 0.5) -> float:
    """lam_i = JSD(P_i, U_C) / JSD_max(C) + offset (§4.1.4 with spec 001 §1.9's Norm): P_i the
    client's label distribution, U_C uniform, JSD_max = JSD(one-hot, U_C); in nats."""
    if num_classes < 2:
        raise ValueError("label skew needs at least 2 classes")
    p = torch.bincount(labels.long().flatten(), minlength=num_classes).double()
    p = p / p.sum()
    u = torch.full_like(p, 1.0 / num_classes)
    c = num_classes
    jsd_max = 0.5 * (math.log(2 * c / (c + 1)) + math.log(2 / (c + 1)) / c + (c - 1) / c * math.log(2))
    return float(jensen_shannon(p, u)) / jsd_max + offset


def jensen_shannon(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """JSD(P, Q) = KL(P||M)/2 + KL(Q||M)/2 with M = (P + Q)/2, in nats."""
    m = 0.5 * (p + q)

    def kl(a: torch.Tensor) -> torch.Tensor:
        pos = a > 0
        return (a[pos] * (a[pos] / m[pos]).log()).sum()

    return 0.5 * kl(p) + 0.5 * kl(q)


# ---------------------------------------------------------------------------- subnet messages


class SubnetAggregation:
    """What ADDS and FedDrop share: the supernet's structure, subnet messages (weights of the
    kept entries + the index map) and Eq. 19's entry-wise aggregation."""

    def __init__(self, ctx: RunContext, name: str) -> None:
        model = ctx.trainer.model
        if not (hasattr(model, "unit_axes") and hasattr(model, "unit_counts")):
            raise ConfigError(f"algorithm '{name}' samples units of a supernet: use model = \"adds_vgg\"")
        self.model, self.axes, self.counts = model, model.unit_axes(), list(model.unit_counts)
        self.num_units = sum(self.counts)

    def message(self, state: P.Params, keep: list[torch.Tensor], num_examples: int) -> dict[str, Any]:
        """A client's upload: the kept entries of the weights (no
        keep ratios), the index map ``keep`` and ``num_examples``."""
        weights = {k: v for k, v in state.items() if k != ALPHA}
        return {"subnet": sn.extract(weights, self.axes, keep), "index_map": torch.cat(keep), "num_examples": num_examples}

    def aggregate(self, params: P.Params, messages: list[dict[str, Any]], weighting: str) -> P.Params:
        """Eq. 19: per entry, the mean over the subnets holding it; other entries unchanged."""
        values, masks = [], []
        for m in messages:
            keep = sn.split_index_map(m["index_map"], self.counts)
            values.append({n: sn.embed(v, params[n], self.axes.get(n, []), keep) for n, v in m["subnet"].items()})
            masks.append({n: sn.element_mask(params[n].shape, self.axes.get(n, []), keep) for n in m["subnet"]})
        weights = [1.0 if weighting == "uniform" else float(m["num_examples"]) for m in messages]
        return P.masked_mean(params, values, masks, weights)

    def unit_mask_rows(self, keep: list[torch.Tensor], rows: int) -> torch.Tensor:
        """The kept units ``keep`` as one float mask row per input, ``(rows, num_units)`` (the ``UNIT_MASK`` group)."""
        return torch.cat(keep).to(torch.get_default_dtype()).expand(rows, -1)

    def costs(self, state: P.Params, keep: list[torch.Tensor], message: dict[str, Any]) -> dict[str, float]:
        """Per round: floats down (the supernet), floats and index-map bits up, subnet MACs."""
        down = sum(v.numel() for k, v in state.items() if k != ALPHA)
        up = sum(v.numel() for v in message["subnet"].values())
        return {"params_downloaded": down, "params_uploaded": up, "upload_share": up / down, "index_map_bits": self.num_units,
                "subnet_macs": self.model.macs([int(k.sum()) for k in keep]), "kept_units": float(torch.cat(keep).float().mean())}

    def local_accuracy(self, state: P.Params, keep: list[torch.Tensor], test: ArrayDataset) -> dict[str, float]:
        """Acc_L: the subnet on the client's own test rows (before aggregation)."""
        if len(test) == 0:
            return {}
        logits = forward(self.model, state, test.x, groups={UNIT_MASK: self.unit_mask_rows(keep, len(test))})
        return {"local_accuracy": float((logits.argmax(1) == test.y).double().mean())}


# ---------------------------------------------------------------------------- the algorithm

SUBNET_SIGNALS = {  # what ADDS and FedDrop clients report about their subnets
    "kept_units": "share of units kept", "upload_share": "upload share (subnet / supernet parameters)",
    "local_accuracy": "subnet accuracy on own test rows (Acc_L)", "params_uploaded": "parameters uploaded per client",
    "params_downloaded": "parameters downloaded per client", "subnet_macs": "subnet MACs", "index_map_bits": "index-map bits",
}


@ALGORITHMS.register("adds", "ADDS: clients learn keep ratios of supernet units; subnets aggregated by index maps")
class ADDS(Algorithm):
    """ADDS (Alg. 1, Eq. 12-19); see the module docstring."""

    delta_messages = False  # its messages are sampled sub-networks, not a delta
    signal_labels = {
        **SUBNET_SIGNALS, "lambda": "keep-ratio penalty lambda", "eps": "keep-ratio epsilon",
        "alpha_mean": "mean keep ratio alpha (learned)",
    }

    Params = ADDSParams
    supports_example_dp = False
    submodel_messages = True  # each client uploads its subnet only

    def __init__(self, params: ADDSParams, ctx: RunContext) -> None:
        super().__init__(params, ctx)
        self.subnets = SubnetAggregation(ctx, "adds")
        lo, hi = self.subnets.model.alpha_range
        if not lo <= params.alpha_init <= hi:
            raise ConfigError(f"adds: alpha_init {params.alpha_init} must lie in the model's keep-ratio range [{lo}, {hi}]")
        self.objective = ADDSLoss(ctx.trainer.loss_fn)
        self.lams: dict[int, float] = {}

    def lam_of(self, client_id: int, train: ArrayDataset) -> float:
        """Client ``client_id``'s regulariser weight lam_i:
        ``lam`` if set, else from its label skew (§4.1.4), cached."""
        if self.hp.lam is not None:
            return self.hp.lam
        if client_id not in self.lams:
            self.lams[client_id] = label_skew_lambda(train.y, self.ctx.num_classes, self.hp.lam_offset)
        return self.lams[client_id]

    def split(self, data: ArrayDataset, generator: torch.Generator) -> tuple[ArrayDataset, ArrayDataset]:
        """Weight rows and validation rows, re-drawn each round (§3.2)."""
        n = len(data)
        if n < 2:
            raise ConfigError("adds: a client needs at least 2 training rows (weight and validation rows)")
        n_val = min(n - 1, max(1, round(self.hp.val_fraction * n)))
        order = torch.randperm(n, generator=generator, device=generator.device).to(data.x.device)
        return data.subset(order[n_val:]), data.subset(order[:n_val])

    def client_update(self, server_state: State, client_state: State | None, task: ClientTask) -> ClientResult:
        """Alg. 1 lines 10-17: split the rows, train weights and keep ratios from ``alpha_init``,
        upload the top units' subnet; ``sampling = False`` trains and uploads the whole supernet."""
        model, params, trainer = self.subnets.model, server_state["params"], task.trainer
        extra: dict[str, float] = {}
        if not self.hp.sampling:
            new, stats = trainer.train(params, task.data.train, task.generator, task.round)
            keep = [torch.ones(c, dtype=torch.bool, device=params[ALPHA].device) for c in self.subnets.counts]
        else:
            train, val = self.split(task.data.train, task.generator)
            lam = self.lam_of(task.client_id, task.data.train)
            start = {**params, ALPHA: torch.full_like(params[ALPHA], self.hp.alpha_init)}
            eps = self.hp.eps0 * self.hp.eps_decay**task.round
            rows = ArchitectureRows(val, eps, self.subnets.num_units, self.hp.val_batch_size or trainer.config.batch_size or len(val))
            # the trainer steps alpha with the client's lr and momentum m: scaling by arch_lr (1 - m) / lr
            # makes the steady-state step arch_lr * gradient (momentum would otherwise multiply it by 1 / (1 - m))
            scale = self.hp.arch_lr * (1 - trainer.config.momentum) / trainer.lr_at(task.round)
            hook = KeepRatioTerm(lam, model.alpha_range, scale)
            new, stats = trainer.train(start, train, task.generator, task.round, hook,
                                       objective=self.objective, input_fn=rows)
            alphas = model.alphas(new[ALPHA])
            importances = method_call(model, new, "importances", train.x, train.y)
            keep = [top_units(float(a), b) for a, b in zip(alphas, importances)]
            extra.update({"lambda": lam, "eps": eps, "alpha_mean": float(alphas.mean())})
            extra.update({f"alpha_{k}": float(a) for k, a in enumerate(alphas)})
        message = self.subnets.message(new, keep, task.data.num_train)
        extra.update(self.subnets.costs(new, keep, message))
        extra.update(self.subnets.local_accuracy(new, keep, task.data.test))
        return ClientResult(message=message, stats=stats, extra_metrics=extra)

    def aggregate(self, server_state: State, results: list[tuple[int, dict[str, Any]]], round_idx: int) -> State:
        """Eq. 19: each entry the mean over the subnets that hold
        it (others unchanged); an empty cohort changes nothing."""
        if not results:
            return server_state
        params = self.subnets.aggregate(server_state["params"], [m for _, m in results], self.hp.weighting)
        return {**server_state, "params": params}
