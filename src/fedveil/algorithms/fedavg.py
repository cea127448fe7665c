"""FedAvg (McMahan et al., 2017): local SGD, then the server averages the client updates."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .. import params as P
from ..data.arrays import ArrayDataset
from ..errors import ConfigError
from ..models.functional import buffer_names
from ..training.adversarial import prefixed, unprefixed
from ..training.local import GradHook
from ..training.request import TaskLoss
from .adversarial import AdversarialParams, AdversarialRequests
from .base import ALGORITHMS, Algorithm, AlgorithmParams, ClientResult, ClientTask, RunContext, State


class FedAvgParams(AlgorithmParams):
    """FedAvg's settings: weighting, server step, optional adversarial training and the buffers' treatment (FedBN)."""

    weighting: Literal["samples", "uniform"] = Field(
        "samples", description="average weighted by client training-set size, or uniformly"
    )
    server_lr: float = Field(1.0, gt=0.0, description="server step on the averaged update")
    adversarial: AdversarialParams | None = Field(
        None, description="PGD adversarial training (Eq. 4.1; FedAvg+AT, or dual-BN AT with a dual_ norm model)"
    )
    buffers: Literal["average", "local"] = Field(
        "average", description="model buffers (BatchNorm running statistics): averaged like the parameters "
        "(without the server step), or kept by each client (FedBN); no effect on models without buffers"
    )


@ALGORITHMS.register("fedavg", "FedAvg: average of client updates (sample-weighted or uniform)")
class FedAvg(Algorithm):
    """w <- w + eta_s * sum_k p_k (w_k - w), p_k = n_k / n (or 1/m with uniform weighting)."""

    Params = FedAvgParams
    supports_client_dp = True
    secure_summable = True

    def __init__(self, params: FedAvgParams, ctx: RunContext) -> None:
        super().__init__(params, ctx)
        self.buffer_keys = frozenset(buffer_names(ctx.trainer.model))
        adversarial = getattr(params, "adversarial", None)
        self.adversarial = None if adversarial is None else AdversarialRequests(adversarial, ctx.trainer.model)
        own_update = (type(self).client_update is not FedAvg.client_update or type(self).grad_hook is not FedAvg.grad_hook
                      or type(self).request_options is not FedAvg.request_options
                      or type(self).training_rows is not FedAvg.training_rows)
        if self.adversarial is not None and own_update:
            raise ConfigError(f"algorithm.adversarial is not supported by {type(self).__name__} (FedAvg and its server optimisers only)")
        self.local_buffers = getattr(params, "buffers", "average") == "local" and bool(self.buffer_keys)
        if self.local_buffers:
            if type(self).client_update is not FedAvg.client_update and not self.has_personal_models:
                raise ConfigError(f"algorithm.buffers = \"local\" is not supported by {type(self).__name__}")
            # each client's model: the global parameters with its own running statistics
            self.has_personal_models = True

    def grad_hook(self, server_state: State, client_state: State | None) -> GradHook | None:
        """Subclasses add terms to the local gradient (FedProx, SCAFFOLD)."""
        return None

    def request_options(self, task: ClientTask) -> dict[str, Any]:
        """Subclasses widen the local training's request (an ``objective``, an ``input_fn``:
        FedFed's distillation); default none."""
        return {}

    def training_rows(self, server_state: State, task: ClientTask) -> ArrayDataset:
        """The rows of the local training: the client's own (FedFed appends shared features
        after them, with ``private_rows`` in its ``request_options``)."""
        return task.data.train

    def client_update(self, server_state: State, client_state: State | None, task: ClientTask) -> ClientResult:
        """Local SGD from the global model (adversarially if set); sends the delta,
        ``num_examples`` and ``steps``, keeping buffers local under ``buffers = "local"``."""
        start = self._with_own_buffers(server_state["params"], client_state)
        hook = self.grad_hook(server_state, client_state)
        rows = self.training_rows(server_state, task)
        if self.adversarial is None:
            new, stats = task.trainer.train(start, rows, task.generator, task.round, hook, dp=task.dp,
                                            **self.request_options(task))
        else:  # the model wrapped as clean / adversarial pairs: its state names gain "net."
            request = self.adversarial.request(task.trainer.model, TaskLoss(task.trainer.loss_fn))
            new, stats = task.trainer.train(prefixed(start), rows, task.generator, task.round, dp=task.dp, **request)
            new = unprefixed(new)
        delta = P.sub(new, start)
        if self.local_buffers:  # the statistics stay with the client: not in the message
            delta = {k: v for k, v in delta.items() if k not in self.buffer_keys}
            client_state = {**(client_state or {}), "buffers": {k: new[k] for k in self.buffer_keys}}
        message = {"delta": delta, "num_examples": task.data.num_train, "steps": stats.steps}
        return ClientResult(message=message, state=client_state, stats=stats)

    def _with_own_buffers(self, params: P.Params, client_state: State | None) -> P.Params:
        if not self.local_buffers or client_state is None or "buffers" not in client_state:
            return params
        return {**params, **client_state["buffers"]}

    def personal_params(self, server_state: State, client_state: State | None, task: ClientTask) -> P.Params:
        """With ``buffers = "local"``: the global parameters and the client's own statistics."""
        return self._with_own_buffers(server_state["params"], client_state)

    def weights(self, messages: list[dict[str, Any]]) -> list[float]:
        """The averaging weights p_k of ``messages``: their ``num_examples``, or all 1 with uniform weighting."""
        if self.hp.weighting == "uniform":
            return [1.0] * len(messages)
        return [float(m["num_examples"]) for m in messages]

    def server_update(self, server_state: State, mean_delta: P.Params) -> State:
        """Apply the averaged update of the parameters (``mean_delta`` has no buffers);
        server optimisers (FedAvgM, FedAdam...) override this."""
        params = server_state["params"]
        return {**server_state, "params": {**params, **P.add(self.trained(params), mean_delta, self.hp.server_lr)}}

    def trained(self, params: P.Params) -> P.Params:
        """The entries of ``params`` that SGD trains (its buffers left out)."""
        return {k: v for k, v in params.items() if k not in self.buffer_keys}

    def aggregate(self, server_state: State, results: list[tuple[int, dict[str, Any]]], round_idx: int) -> State:
        """The weighted mean delta through :meth:`server_update`; averaged buffers are added without the server step."""
        if not results:  # an empty Poisson cohort leaves the model unchanged
            return server_state
        messages = [m for _, m in results]
        mean_delta = P.weighted_mean([m["delta"] for m in messages], self.weights(messages))
        state = self.server_update(server_state, self.trained(mean_delta))
        averaged = {k: state["params"][k] + d for k, d in mean_delta.items() if k in self.buffer_keys}
        return {**state, "params": {**state["params"], **averaged}} if averaged else state
