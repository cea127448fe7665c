"""Federated Dropout (Caldas et al. 2018, "Expanding the Reach of Federated Learning by
Reducing Client Resource Requirements"), ADDS's random sub-model baseline (spec 001 §4).

Each round the server draws one sub-model: a uniformly random ``keep`` fraction of the
units of every sampleable layer of the supernet (conv channels and hidden neurons;
``round(keep C_k)``, at least 1). Every client of the round trains that same sub-model and
uploads it; the server maps the sub-models back into the supernet (the weighted mean per
entry; entries outside the sub-model keep their value, Eq. 19's aggregation).

On the core the sub-model is the supernet with the dropped units' parameters set to zero
and frozen (``param_mask``): a unit whose conv/BN or FC parameters are all zero outputs
ReLU(0) = 0, exactly as if it were removed, and no dropout-style rescaling is applied. The
requests are therefore ordinary ones and take example-level DP-SGD (the sub-model is drawn
by the server, independent of the data); the supernet's own forward has no stacked kernel,
so the vectorized executor trains FedDrop's clients one by one (same numbers).

The spec's erratum 9: "drop rate 0.75" is read as keep 0.75 (Caldas' convention), and
both conv channels and FC neurons are dropped.
"""
from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field

from ..models import subnet as sn
from ..models.supernet import ALPHA
from ..seeding import numpy_generator
from .adds import SUBNET_SIGNALS, SubnetAggregation
from .base import ALGORITHMS, Algorithm, AlgorithmParams, ClientResult, ClientTask, RunContext, State


class FedDropParams(AlgorithmParams):
    """Federated Dropout's settings: the kept share of each layer's units and the weighting of the per-entry mean."""

    keep: float = Field(0.75, gt=0.0, le=1.0, description="share of each layer's units in the round's sub-model")
    weighting: Literal["samples", "uniform"] = Field("samples", description="per-entry mean weighted by n_i, or uniform")


@ALGORITHMS.register("feddrop", "Federated Dropout: all clients of a round train one random sub-model of the supernet")
class FedDrop(Algorithm):
    """See the module docstring."""

    delta_messages = False  # its messages are sampled sub-networks, not a delta

    Params = FedDropParams
    submodel_messages = True  # each client uploads the sub-model it trained
    signal_labels = SUBNET_SIGNALS

    def __init__(self, params: FedDropParams, ctx: RunContext) -> None:
        super().__init__(params, ctx)
        self.subnets = SubnetAggregation(ctx, "feddrop")

    def configure_round(self, server_state: State, cohort: list[int], round_idx: int) -> State:
        """Draws the round's sub-model from the run seed:
        ``round(keep C_k)`` random units per layer, as ``index_map``."""
        rng = numpy_generator(self.ctx.seed, "feddrop", round_idx)
        device = server_state["params"][ALPHA].device
        keep = []
        for c in self.subnets.counts:
            units = torch.zeros(c, dtype=torch.bool, device=device)
            chosen = rng.choice(c, size=max(1, round(self.hp.keep * c)), replace=False)
            units[torch.as_tensor(chosen, device=device)] = True
            keep.append(units)
        return {**server_state, "index_map": torch.cat(keep)}

    def client_update(self, server_state: State, client_state: State | None, task: ClientTask) -> ClientResult:
        """Trains the round's sub-model (dropped units zeroed and frozen by ``param_mask``) and uploads its entries."""
        keep = sn.split_index_map(server_state["index_map"], self.subnets.counts)
        params = server_state["params"]
        masks = {n: sn.element_mask(params[n].shape, axes, keep).to(params[n].dtype) for n, axes in self.subnets.axes.items()}
        start = {n: v * masks[n] if n in masks else v for n, v in params.items()}
        new, stats = task.trainer.train(start, task.data.train, task.generator, task.round, dp=task.dp, param_mask=masks)
        message = self.subnets.message(new, keep, task.data.num_train)
        extra = self.subnets.costs(new, keep, message)
        extra["params_downloaded"] = extra["params_uploaded"]  # the server sends the sub-model only
        extra.update(self.subnets.local_accuracy(new, keep, task.data.test))
        return ClientResult(message=message, stats=stats, extra_metrics=extra)

    def aggregate(self, server_state: State, results: list[tuple[int, dict[str, Any]]], round_idx: int) -> State:
        """Eq. 19's per-entry mean of the sub-models into the supernet; drops the round's ``index_map``."""
        state = {k: v for k, v in server_state.items() if k != "index_map"}
        if not results:
            return state
        return {**state, "params": self.subnets.aggregate(state["params"], [m for _, m in results], self.hp.weighting)}
