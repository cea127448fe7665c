"""Callbacks: code that watches a run (progress bar, custom loggers) without changing it."""
from __future__ import annotations

from typing import Any

from tqdm.auto import tqdm


class Callback:
    """Override any of the three hooks; rows are the dicts written to ``metrics.jsonl``."""

    def on_run_start(self, total_rounds: int, start_round: int) -> None:
        pass

    def on_round_end(self, row: dict[str, Any]) -> None:
        pass

    def on_run_end(self, summary: dict[str, Any]) -> None:
        pass


class ProgressBar(Callback):
    """A tqdm bar over rounds showing the latest headline metrics."""

    SHOWN = {
        "global_test_accuracy": "acc",
        "global_test_mse": "mse",
        "personal_accuracy_mean": "pers_acc",
        "personal_mse_mean": "pers_mse",
        "epsilon": "eps",
        "train_loss": "loss",
    }

    def __init__(self, description: str = "rounds") -> None:
        self.description = description
        self.bar: tqdm | None = None

    def on_run_start(self, total_rounds: int, start_round: int) -> None:
        self.bar = tqdm(total=total_rounds, initial=start_round, desc=self.description, unit="round", dynamic_ncols=True)

    def on_round_end(self, row: dict[str, Any]) -> None:
        if self.bar is None:
            return
        shown = {label: row[key] for key, label in self.SHOWN.items() if isinstance(row.get(key), float)}
        self.bar.set_postfix({k: f"{v:.4g}" for k, v in shown.items()}, refresh=False)
        self.bar.update(1)

    def on_run_end(self, summary: dict[str, Any]) -> None:
        if self.bar is not None:
            self.bar.close()
