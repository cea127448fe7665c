"""Callbacks: code that watches a run (progress bar, custom loggers) without changing it."""
from __future__ import annotations

import sys
from typing import Any, TextIO

from tqdm.auto import tqdm


class Callback:
    """Override any of the three hooks; rows are the dicts written to ``metrics.jsonl``."""

    def on_run_start(self, total_rounds: int, start_round: int) -> None:
        """Called before the first round run (``start_round`` > 0 when a run resumes)."""
        pass

    def on_round_end(self, row: dict[str, Any]) -> None:
        """Called after each round with its ``row``, once the row is recorded."""
        pass

    def on_run_end(self, summary: dict[str, Any]) -> None:
        """Called once with the run's summary, after the recorder has finished."""
        pass


class ProgressBar(Callback):
    """Progress over rounds with the latest headline metrics: a tqdm bar on a terminal;
    elsewhere (a log file, CI, a notebook's captured stderr) ``lines`` plain lines spread
    over the run, the last one at its end. ``interactive`` forces one or the other."""

    SHOWN = {
        "global_test_accuracy": "acc",
        "global_test_mse": "mse",
        "personal_accuracy_mean": "pers_acc",
        "personal_mse_mean": "pers_mse",
        "epsilon": "eps",
        "train_loss": "loss",
    }

    def __init__(
        self, description: str = "rounds", lines: int = 10, stream: TextIO | None = None, interactive: bool | None = None,
    ) -> None:
        self.description, self.lines = description, max(1, lines)
        self.stream = sys.stderr if stream is None else stream
        self.interactive = _is_terminal(self.stream) if interactive is None else interactive
        self.bar: tqdm | None = None
        self.total = self.done = 0
        self.shown: dict[str, float] = {}

    def on_run_start(self, total_rounds: int, start_round: int) -> None:
        """Open the tqdm bar at ``start_round`` of ``total_rounds`` (on a terminal)."""
        self.total, self.done = total_rounds, start_round
        if self.interactive:
            self.bar = tqdm(
                total=total_rounds, initial=start_round, desc=self.description, unit="round", dynamic_ncols=True,
                file=self.stream,
            )

    def on_round_end(self, row: dict[str, Any]) -> None:
        """Advance the bar with ``row``'s headline metrics, or print a plain line at the evenly spaced rounds."""
        self.done += 1
        self.shown.update({label: row[key] for key, label in self.SHOWN.items() if isinstance(row.get(key), float)})
        if self.bar is not None:
            self.bar.set_postfix({k: f"{v:.4g}" for k, v in self.shown.items()}, refresh=False)
            self.bar.update(1)
        elif not self.interactive and self._is_mark(self.done):
            metrics = "  ".join(f"{k} {v:.4g}" for k, v in self.shown.items())
            print(f"{self.description}: round {self.done}/{self.total}  {metrics}".rstrip(), file=self.stream, flush=True)

    def _is_mark(self, done: int) -> bool:
        """Whether round ``done`` is one of the ``lines`` evenly spaced rounds (the last included)."""
        return done == self.total or (done * self.lines) // self.total > ((done - 1) * self.lines) // self.total

    def on_run_end(self, summary: dict[str, Any]) -> None:
        """Close the bar."""
        self.close()

    def close(self) -> None:
        """End the bar's line (also when the run is interrupted)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())
