"""Local training only: every client trains its own model and nothing is shared.

The usual baseline for personalisation (e.g. "Local Only" in Collins et al. 2021,
"Exploiting Shared Representations for Personalized Federated Learning"): client i
runs local SGD on its own data, from the common initial model, in each round it is
sampled. There is no global model: ``global_params`` is just the initial model, and
the runtime does not report global metrics because ``has_global_model`` is False.
"""
from __future__ import annotations

from typing import Any

from .. import params as P
from .base import ALGORITHMS, Algorithm, ClientResult, ClientTask, State


@ALGORITHMS.register("local", "Local: each client trains only its own model, no communication")
class Local(Algorithm):
    """Per-client models trained in isolation; the server state never changes."""

    delta_messages = False  # nothing is aggregated

    has_personal_models = True
    has_global_model = False

    def init_client(self, client_id: int, server_state: State) -> State:
        """The client's own model, a copy of the initial model."""
        return {"params": P.clone(server_state["params"])}

    def client_update(self, server_state: State, client_state: State | None, task: ClientTask) -> ClientResult:
        """Local SGD on the client's own model; the message is empty."""
        new, stats = task.trainer.train(
            client_state["params"], task.data.train, task.generator, task.round, dp=task.dp
        )
        return ClientResult(message={}, state={"params": new}, stats=stats)

    def aggregate(self, server_state: State, results: list[tuple[int, dict[str, Any]]], round_idx: int) -> State:
        """Nothing to aggregate: the server state stays as it is."""
        return server_state

    def personal_params(self, server_state: State, client_state: State | None, task: ClientTask) -> P.Params:
        """The client's own model."""
        return client_state["params"]
