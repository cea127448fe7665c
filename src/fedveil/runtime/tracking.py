"""Experiment tracking (``[log]``): each round's metrics row, epsilon included, and the config
also go to TensorBoard and/or MLflow, besides the run directory.

The libraries are optional (``pip install 'fedveil[tracking]'``) and imported only when a
sink is asked for. A resumed run continues the same TensorBoard folder (the events of rounds
after the checkpoint it resumes from are purged, then logged again) and the same MLflow run
(its id is kept in ``RUN_DIR/mlflow_run_id.txt``; the rounds that run already holds are not
logged again: a resume recomputes them identically).
"""
from __future__ import annotations

import contextlib
import importlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..config import LogConfig
from ..errors import ConfigError
from .callbacks import Callback
from .run_dir import dotted_keys

TENSORBOARD_DIR = "tensorboard"
MLFLOW_RUN_ID_FILE = "mlflow_run_id.txt"
INSTALL = "pip install 'fedveil[tracking]'"
ROW_KEY = "cohort_size"  # in every metrics row: the rounds an MLflow run holds are its steps


def _library(module: str, need: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"{need}: {INSTALL}") from None


def _tensorboard() -> Any:
    return _library("torch.utils.tensorboard", "log.tensorboard needs the tensorboard package")


def _mlflow() -> Any:
    return _library("mlflow", "log.mlflow_uri needs MLflow")


def check_tracking(log: LogConfig) -> None:
    """Raise :class:`ConfigError` if a sink that ``log`` asks for lacks its library."""
    if log.tensorboard:
        _tensorboard()
    if log.mlflow_uri is not None:
        _mlflow()


def scalars(tree: dict[str, Any], prefix: str = "", lists: bool = True) -> dict[str, float]:
    """The numbers of ``tree`` by name: nested dicts as ``key/sub``, lists of numbers (with
    ``lists``) as ``key/<index>``, e.g. ``epsilon_per_client/3``; anything else left out."""
    out: dict[str, float] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(scalars(value, f"{name}/", lists))
        elif isinstance(value, list) and lists:
            out.update(scalars(dict(enumerate(value)), f"{name}/", lists))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[name] = float(value)
    return out


def row_scalars(row: dict[str, Any]) -> dict[str, float]:
    """A metrics row's numbers by name, without ``round`` (their step)."""
    return scalars({k: v for k, v in row.items() if k != "round"})


def flat_config(config: dict[str, Any]) -> dict[str, str]:
    """The config as ``section.key -> value``, values as text (strings as they are, the rest as JSON)."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in dotted_keys(config).items()}


class Sink(Callback):
    """A callback that holds something open while the run goes (a writer, a remote run)."""

    def close(self, status: str = "FINISHED") -> None:
        """Let go of it; ``status``: how the run ended (FINISHED, FAILED or KILLED)."""


class TensorBoardSink(Sink):
    """Each row's numbers as scalars at step ``round`` and the config as text (``key = value``
    lines, step 0), in TensorBoard event files under ``log_dir``."""

    def __init__(self, log_dir: str | Path, config: dict[str, Any]) -> None:
        self.tensorboard = _tensorboard()
        self.log_dir, self.config = Path(log_dir), config
        self.writer = None

    def on_run_start(self, total_rounds: int, start_round: int) -> None:
        """Open the writer (purging events after the resumed round) and, on a fresh run, log the config."""
        # events at steps >= purge_step, logged by a session that died after the checkpoint
        # this one starts from, are dropped by TensorBoard's reader
        purge_step = start_round + 1 if start_round else 0
        self.writer = self.tensorboard.SummaryWriter(str(self.log_dir), purge_step=purge_step)
        if start_round == 0:
            text = "\n".join(f"    {k} = {v}" for k, v in flat_config(self.config).items())  # indented: verbatim
            self.writer.add_text("config", text, 0)

    def on_round_end(self, row: dict[str, Any]) -> None:
        """Log ``row``'s numbers as scalars at step ``round`` and flush."""
        for tag, value in row_scalars(row).items():
            self.writer.add_scalar(tag, value, row["round"])
        self.writer.flush()

    def on_run_end(self, summary: dict[str, Any]) -> None:
        """Close the writer."""
        self.close()

    def close(self, status: str = "FINISHED") -> None:
        """Close the writer, if open (``status`` is not used)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class MLflowSink(Sink):
    """One MLflow run: the config as params (``federation.rounds``...), each row's numbers as
    metrics at step ``round``, the summary's as ``summary/<key>`` (lists left out). The run's
    id goes to ``run_id_file``, so that a resumed fedveil run continues the same MLflow run.
    Connects at construction: a bad URI is a :class:`ConfigError` before the run starts."""

    def __init__(
        self, uri: str, experiment: str, run_name: str, config: dict[str, Any], run_id_file: str | Path,
    ) -> None:
        self.mlflow = _mlflow()
        self.run_name, self.config, self.run_id_file = run_name, config, Path(run_id_file)
        self.run_id: str | None = None
        self.logged_through, self.summary_logged = 0, False
        with self._errors(f"log.mlflow_uri '{uri}'"):
            self.client = self.mlflow.tracking.MlflowClient(tracking_uri=uri)
            found = self.client.get_experiment_by_name(experiment)
            self.experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)

    @contextlib.contextmanager
    def _errors(self, what: str, hint: str = "") -> Iterator[None]:
        """MLflow's errors (and a missing database driver) as one-line :class:`ConfigError`s."""
        try:
            yield
        except ImportError as err:
            raise ConfigError(f"{what} needs {err.name or 'a missing package'}: {INSTALL}") from None
        except self.mlflow.exceptions.MlflowException as err:
            raise ConfigError(f"{what}: {str(err.message).strip().splitlines()[0]}{hint}") from None

    def on_run_start(self, total_rounds: int, start_round: int) -> None:
        """Continue the MLflow run named in ``run_id_file``, or create one and log the config as params."""
        if self.run_id_file.exists():
            self.run_id = self.run_id_file.read_text().strip()
            hint = f"; delete {self.run_id_file} to log to a new MLflow run"
            with self._errors(f"MLflow run {self.run_id} of {self.run_id_file}", hint):
                run = self.client.get_run(self.run_id)
            history = self.client.get_metric_history(self.run_id, ROW_KEY)
            self.logged_through = max((m.step for m in history), default=0)
            self.summary_logged = "summary/rounds" in run.data.metrics
            self.client.update_run(self.run_id, status="RUNNING")
            return
        tags = {"fedveil.run_dir": str(self.run_id_file.parent.resolve())}
        self.run_id = self.client.create_run(self.experiment_id, run_name=self.run_name, tags=tags).info.run_id
        self.run_id_file.write_text(self.run_id + "\n")
        params = [self.mlflow.entities.Param(k, v) for k, v in flat_config(self.config).items()]
        self.client.log_batch(self.run_id, params=params)

    def _log(self, values: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        metrics = [self.mlflow.entities.Metric(k, v, now, step) for k, v in values.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def on_round_end(self, row: dict[str, Any]) -> None:
        """Log ``row``'s numbers at step ``round``, unless the MLflow run already holds that round."""
        if row["round"] > self.logged_through:
            self._log(row_scalars(row), row["round"])

    def on_run_end(self, summary: dict[str, Any]) -> None:
        """Log the summary's numbers as ``summary/<key>`` (unless a resumed run holds them), then end the MLflow run."""
        if not self.summary_logged:
            self._log(scalars(summary, "summary/", lists=False), summary["rounds_completed"])
        self.close()

    def close(self, status: str = "FINISHED") -> None:
        """End the MLflow run with ``status``, if one is open."""
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, status)
            self.run_id = None


@contextlib.contextmanager
def tracking_sinks(log: LogConfig, run_dir: str | Path, config: dict[str, Any]) -> Iterator[list[Sink]]:
    """The sinks ``log`` asks for, for run directory ``run_dir`` and its resolved ``config``.
    If the run raises, they are closed: the MLflow run ends FAILED (KILLED when interrupted)."""
    run_dir = Path(run_dir)
    sinks: list[Sink] = []
    if log.tensorboard:
        sinks.append(TensorBoardSink(run_dir / TENSORBOARD_DIR, config))
    if log.mlflow_uri is not None:
        run_name = log.mlflow_run_name or run_dir.resolve().name
        sinks.append(MLflowSink(log.mlflow_uri, log.mlflow_experiment, run_name, config, run_dir / MLFLOW_RUN_ID_FILE))
    try:
        yield sinks
    except BaseException as err:
        status = "KILLED" if isinstance(err, KeyboardInterrupt) else "FAILED"
        for sink in sinks:
            with contextlib.suppress(Exception):  # the run's own error is the one to report
                sink.close(status)
        raise
