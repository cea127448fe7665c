"""Per-round evaluation with named metrics (DESIGN idea 5).

Keys (``S`` is ``accuracy`` for classification, ``mse`` for regression; ``M`` is each
key of a metric listed in ``eval.metrics``, e.g. ``equalized_odds_gap``,
``auprc``, ``accuracy_group_1``):

* ``global_test_loss``, ``global_test_S``, ``global_test_M``: the global model on the
  pooled test set;
* ``global_client_S_{mean,weighted_mean,std,worst10}`` and the same for every ``M``: the
  global model on each client's own test split, summarised over clients (weights = test
  rows; a client on whose split ``M`` is undefined, e.g. a gap with one group, is left out);
* ``personal_S_{mean,weighted_mean,std,worst10}`` and ``personal_M_...``: each client's
  personal model on its own test split (algorithms with personal models only);
* ``global_val_S`` / ``personal_val_S``: the same models on the clients' validation
  splits, pooled (only with ``data.val_fraction > 0``); best-round selection uses these.

Every model's outputs come from ``algorithm.predict``, so an algorithm that predicts with
an ensemble, a chosen width or a personal head is scored on what it would really predict.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..algorithms.base import Algorithm, ClientTask, State
from ..data.arrays import ArrayDataset
from ..data.federated import ClientData, FederatedDataset
from ..params import Params
from .evaluation import check_metrics, evaluate_by_metric, higher_is_better, score_name, summarize_clients
from ..training.local import LocalTrainer
from ..seeding import torch_generator

__all__ = ["RoundEvaluator", "check_metrics", "summarize_client_scores"]


class RoundEvaluator:
    """Scores the global and personal models of one round; returns the row and per-client rows.

    ``metrics`` are reported besides the task's loss (pooled test set) and score
    (everywhere); ``group`` is the group key the group metrics read.
    """

    def __init__(
        self,
        algorithm: Algorithm,
        data: FederatedDataset,
        trainer: LocalTrainer,
        seed: int,
        batch_size: int,
        personal: bool,
        metrics: Sequence[str] = (),
        group: str | None = None,
    ) -> None:
        self.algorithm, self.data, self.trainer, self.seed = algorithm, data, trainer, seed
        self.batch_size = batch_size
        self.personal = personal and algorithm.has_personal_models
        self.score = score_name(data.task)
        self.higher_is_better = self.score == "accuracy"
        self.group = group
        extra = [m for m in dict.fromkeys(metrics) if m != self.score]
        # the pooled test set always gets the loss; the clients' splits only when it is listed
        self.pooled_metrics = ["loss", self.score, *(m for m in extra if m != "loss")]
        self.client_metrics = [self.score, *extra]

    def _eval(self, params: Params, split: ArrayDataset, metrics: list[str]) -> dict[str, dict[str, float]]:
        return evaluate_by_metric(
            self.trainer.model, params, split, self.data.task, self.batch_size,
            metrics=metrics, group=self.group, predict=self.algorithm.predict,
        )

    def __call__(
        self, server_state: State, client_states: dict[int, State], round_idx: int
    ) -> tuple[dict[str, float], list[dict[str, Any]]]:
        row: dict[str, float] = {}
        clients: list[dict[str, Any]] = [
            {"client": i, "num_train": c.num_train, "num_test": len(c.test)} for i, c in enumerate(self.data.clients)
        ]
        if self.algorithm.has_global_model:
            params = self.algorithm.global_params(server_state)
            pooled = self._eval(params, self.data.test, self.pooled_metrics)
            for values in pooled.values():
                row.update({f"global_test_{key}": v for key, v in values.items()})
            row.update(self._over_clients("global", [params] * self.data.num_clients, clients))
        if self.personal:
            personal = [self._personal_params(server_state, client_states, i, round_idx) for i in range(self.data.num_clients)]
            row.update(self._over_clients("personal", personal, clients))
        return row, clients

    def _personal_params(self, server_state: State, client_states: dict[int, State], cid: int, round_idx: int) -> Params:
        return self.personal_params(server_state, client_states.get(cid), cid, self.data.clients[cid], round_idx)

    def personal_params(
        self, server_state: State, state: State | None, cid: int, client: ClientData, round_idx: int
    ) -> Params:
        """Client ``cid``'s personal model after round ``round_idx`` from its ``state`` (None:
        never trained, the algorithm initialises it), drawn from its ``"personal"`` stream."""
        if state is None:
            state = self.algorithm.init_client(cid, server_state)
        task = ClientTask(
            client_id=cid,
            round=round_idx,
            data=client,
            generator=torch_generator(self.seed, "personal", round_idx, cid),
            trainer=self.trainer,
        )
        return self.algorithm.personal_params(server_state, state, task)

    def _over_clients(self, kind: str, params: list[Params], clients: list[dict[str, Any]]) -> dict[str, float]:
        """Per-client test scores of every metric summarised, plus the pooled validation score."""
        scores = [self.client_scores(p, client) for p, client in zip(params, self.data.clients)]
        return summarize_client_scores(kind, self.score, scores, clients)

    def client_scores(self, params: Params, client: ClientData) -> dict[str, Any]:
        """One client's scores of model ``params`` (plain data, so a deployed silo can send
        them): ``test`` ``{metric: {key: value}}`` on its test split, ``num_test`` rows, and
        ``val`` (score summed over its validation rows, rows)."""
        out: dict[str, Any] = {"test": {}, "num_test": len(client.test), "val": (0.0, 0)}
        if len(client.test):
            out["test"] = self._eval(params, client.test, self.client_metrics)
        if client.val is not None and len(client.val):
            result = self._eval(params, client.val, [self.score])
            out["val"] = (result[self.score][self.score] * len(client.val), len(client.val))
        return out



def summarize_client_scores(
    kind: str, score: str, scores: list[dict[str, Any]], clients: list[dict[str, Any]]
) -> dict[str, float]:
    """The row's ``{kind}`` keys (``global`` or ``personal``) from every client's
    :meth:`RoundEvaluator.client_scores` (client order; ``score`` is the task's score
    name); each client's values also go into its row of ``clients``."""
    prefix = "global_client" if kind == "global" else "personal"
    # key -> (values, weights, higher is better), keys in the order they first appear
    per_key: dict[str, tuple[list[float], list[float], bool]] = {}
    val_total, val_rows = 0.0, 0
    for client_row, client_score in zip(clients, scores):
        for metric, values in client_score["test"].items():
            for key, value in values.items():
                client_row[f"{kind}_{key}"] = value
                vals, weights, _ = per_key.setdefault(key, ([], [], higher_is_better(metric)))
                vals.append(value)
                weights.append(client_score["num_test"])
        val_total += client_score["val"][0]
        val_rows += client_score["val"][1]
    row = {}
    for key, (values, weights, better) in per_key.items():
        stats = summarize_clients(values, weights, better)
        row.update({f"{prefix}_{key}_{k}": v for k, v in stats.items()})
    if val_rows:
        row[f"{kind}_val_{score}"] = val_total / val_rows
    return row
