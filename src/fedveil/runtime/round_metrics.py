"""Per-round evaluation with named metrics (DESIGN idea 5).

Keys (``S`` is ``accuracy`` for classification, ``mse`` for regression):

* ``global_test_loss``, ``global_test_S``: the global model on the pooled test set;
* ``global_client_S_{mean,weighted_mean,std,worst10}``: the global model on each
  client's own test split, summarised over clients (weights = test rows);
* ``personal_S_{mean,weighted_mean,std,worst10}``: each client's personal model on its
  own test split (algorithms with personal models only);
* ``global_val_S`` / ``personal_val_S``: the same models on the clients' validation
  splits, pooled (only with ``data.val_fraction > 0``); best-round selection uses these.
"""
from __future__ import annotations

from typing import Any

from ..algorithms.base import Algorithm, ClientTask, State
from ..data.federated import FederatedDataset
from ..params import Params
from .evaluation import evaluate, score_name, summarize_clients
from ..training.local import LocalTrainer
from ..seeding import torch_generator


class RoundEvaluator:
    """Scores the global and personal models of one round; returns the row and per-client rows."""

    def __init__(
        self,
        algorithm: Algorithm,
        data: FederatedDataset,
        trainer: LocalTrainer,
        seed: int,
        batch_size: int,
        personal: bool,
    ) -> None:
        self.algorithm, self.data, self.trainer, self.seed = algorithm, data, trainer, seed
        self.batch_size = batch_size
        self.personal = personal and algorithm.has_personal_models
        self.score = score_name(data.task)
        self.higher_is_better = self.score == "accuracy"

    def _eval(self, params: Params, split) -> dict[str, float]:
        return evaluate(self.trainer.model, params, split, self.data.task, self.batch_size)

    def __call__(
        self, server_state: State, client_states: dict[int, State], round_idx: int
    ) -> tuple[dict[str, float], list[dict[str, Any]]]:
        row: dict[str, float] = {}
        clients: list[dict[str, Any]] = [
            {"client": i, "num_train": c.num_train, "num_test": len(c.test)} for i, c in enumerate(self.data.clients)
        ]
        if self.algorithm.has_global_model:
            params = self.algorithm.global_params(server_state)
            pooled = self._eval(params, self.data.test)
            row["global_test_loss"] = pooled["loss"]
            row[f"global_test_{self.score}"] = pooled[self.score]
            row.update(self._over_clients("global", [params] * self.data.num_clients, clients))
        if self.personal:
            personal = [self._personal_params(server_state, client_states, i, round_idx) for i in range(self.data.num_clients)]
            row.update(self._over_clients("personal", personal, clients))
        return row, clients

    def _personal_params(self, server_state: State, client_states: dict[int, State], cid: int, round_idx: int) -> Params:
        state = client_states.get(cid)
        if state is None:
            state = self.algorithm.init_client(cid, server_state)
        task = ClientTask(
            client_id=cid,
            round=round_idx,
            data=self.data.clients[cid],
            generator=torch_generator(self.seed, "personal", round_idx, cid),
            trainer=self.trainer,
        )
        return self.algorithm.personal_params(server_state, state, task)

    def _over_clients(self, kind: str, params: list[Params], clients: list[dict[str, Any]]) -> dict[str, float]:
        """Per-client test scores summarised, plus the pooled validation score."""
        prefix = "global_client" if kind == "global" else "personal"
        values, weights = [], []
        val_total, val_rows = 0.0, 0
        for cid, (p, client) in enumerate(zip(params, self.data.clients)):
            if len(client.test):
                result = self._eval(p, client.test)
                clients[cid][f"{kind}_{self.score}"] = result[self.score]
                values.append(result[self.score])
                weights.append(result["n"])
            if client.val is not None and len(client.val):
                result = self._eval(p, client.val)
                val_total += result[self.score] * result["n"]
                val_rows += result["n"]
        row = {}
        if values:
            stats = summarize_clients(values, weights, self.higher_is_better)
            row.update({f"{prefix}_{self.score}_{k}": v for k, v in stats.items()})
        if val_rows:
            row[f"{kind}_val_{self.score}"] = val_total / val_rows
        return row
