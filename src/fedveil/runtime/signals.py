"""A method's own signals, where a researcher looks: the metrics a row holds beyond the
run's common ones (round, loss, score, epsilon, cohort...).

They come from two places: the metrics of ``eval.metrics`` on the global model (fairness
gaps, per-group accuracy, AUPRC: ``global_test_<metric>``) and the averages of the
algorithm's ``ClientResult.extra_metrics`` (FADE's lambda and group loss, ADDS's keep
ratios and upload share, Split-Mix's bases trained...). An algorithm names its own in
``Algorithm.signal_labels``; any other extra metric is shown under its key. The console
summary, the learning-curve PNG and ``fedveil compare`` read them from here.
"""
from __future__ import annotations

import numbers
from typing import Any, Mapping, Sequence

#: Row keys every run may write: not a method's own signal.
COMMON_KEYS = frozenset({
    "round", "cohort_size", "survivors", "lr", "train_loss", "elapsed_s", "epsilon", "epsilon_per_client", "clip",
    "noise_multiplier", "evaluated_silos", "dropped", "person_epsilon",
})
COMMON_PREFIXES = ("global_client_", "global_val_", "personal_", "global_test_loss")


def eval_signals(row: Mapping[str, Any], score: str) -> list[str]:
    """The global model's pooled-test metrics beyond its loss and score, in row order."""
    return [k for k, v in row.items() if k.startswith("global_test_") and k not in (f"global_test_{score}", "global_test_loss")
            and _is_number(v)]


def method_signals(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The algorithm's own per-round metrics in ``rows``, in first-seen order."""
    keys: dict[str, None] = {}
    for row in rows:
        for key, value in row.items():
            if key in COMMON_KEYS or key.startswith(COMMON_PREFIXES) or key.startswith("global_test_"):
                continue
            if _is_number(value):
                keys[key] = None
    return list(keys)


def signal_label(key: str, labels: Mapping[str, str]) -> str:
    """The algorithm's label for ``key`` (``Algorithm.signal_labels``), else the key itself."""
    return labels.get(key, key.replace("_", " "))


def algorithm_labels(name: str | None) -> dict[str, str]:
    """``signal_labels`` of the registered algorithm ``name`` (empty for an unknown one)."""
    from ..registry import UnknownNameError
    from ..algorithms import ALGORITHMS

    if not name:
        return {}
    try:
        return dict(getattr(ALGORITHMS.get(name), "signal_labels", {}))
    except UnknownNameError:
        return {}


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
