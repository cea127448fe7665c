"""``summary.json``: the final metrics of a run under stable, documented keys.

Top level holds the last round's evaluation metrics (e.g. ``global_test_accuracy``,
``personal_accuracy_mean``, and for ``eval.metrics`` keys like ``global_test_auprc`` or
``global_client_equalized_odds_gap_mean``; see :mod:`fedveil.runtime.round_metrics`) plus
run facts.
``best`` is the round with the best validation score, only when a validation split
exists (``data.val_fraction > 0``); picking the best round on test data would be
optimistic, so it is never done.
"""
from __future__ import annotations

from typing import Any

from ..config import RunConfig
from ..data.federated import FederatedDataset
from .evaluation import score_name

RUN_KEYS = ("round", "cohort_size", "lr", "train_loss", "elapsed_s", "epsilon", "epsilon_per_client", "clip")


def eval_metrics(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` without the run bookkeeping keys (:data:`RUN_KEYS`): its evaluation metrics."""
    return {k: v for k, v in row.items() if k not in RUN_KEYS}


def best_round(rows: list[dict[str, Any]], task: str) -> dict[str, Any] | None:
    """The evaluated row with the best pooled validation score (global, else personal)."""
    score = score_name(task)
    for key in (f"global_val_{score}", f"personal_val_{score}"):
        scored = [r for r in rows if key in r]
        if scored:
            pick = max if score == "accuracy" else min
            row = pick(scored, key=lambda r: r[key])
            return {"round": row["round"], "selected_by": key, **eval_metrics(row)}
    return None


def build_summary(
    cfg: RunConfig, model_name: str, data: FederatedDataset, privacy_facts: dict[str, Any],
    rows: list[dict[str, Any]], wall_time_s: float,
) -> dict[str, Any]:
    """The run's facts, its last evaluated round's metrics, the best round and the privacy facts."""
    evaluated = [r for r in rows if any(k.startswith(("global_", "personal_")) for k in r)]
    final = evaluated[-1] if evaluated else {}
    return {
        "algorithm": cfg.algorithm.name,
        "dataset": cfg.data.name,
        "model": model_name,
        "task": data.task,
        "score": score_name(data.task),
        "num_clients": data.num_clients,
        "rounds": cfg.federation.rounds,
        "rounds_completed": rows[-1]["round"] if rows else 0,
        "seed": cfg.seed,
        "wall_time_s": wall_time_s,
        "final_round": final.get("round"),
        **eval_metrics(final),
        "best": best_round(evaluated, data.task),
        **privacy_facts,
    }
