"""Where a run's record goes, apart from how the run is orchestrated.

:class:`~fedveil.runtime.simulation.Simulation` runs the rounds (cohorts, executor,
privacy checks, evaluation) and hands a :class:`RunRecorder` what is worth keeping: the
partition facts, one metrics row per round, a checkpoint state every so often, and the
summary at the end; on resume it asks the recorder for the last checkpoint and the rows
written up to it. :class:`DirectoryRecorder` keeps all that in a run directory
(``config.json``, ``metrics.jsonl``, ``summary.json``, ``checkpoint.pt``, plots: see
:mod:`~fedveil.runtime.run_dir`); :class:`MemoryRecorder` keeps it in memory, for a
deployment server that orchestrates without a local run directory, or for tests.

Checkpoints hold CPU tensors whatever the run's device, and are loaded onto the device
the resuming run asks for.
"""
from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any, Callable

import torch

from .client_store import ClientStateStore, make_client_store
from .device import to_cpu
from .report import PARTITION_FILE
from .run_dir import CLIENT_METRICS_FILE, CLIENT_STATES_DIR, SUMMARY_FILE, RunDirectory


class RunRecorder:
    """The interface the round loop records through; every method but :meth:`client_store`
    may do nothing (a recorder that keeps nothing cannot resume)."""

    where = "the recorder"  # for messages: where the record is kept

    def load_checkpoint(self, device: torch.device | str = "cpu") -> dict[str, Any] | None:
        """The last saved checkpoint state with its tensors on ``device``, or None to start afresh."""
        return None

    def client_store(self, backend: str, device: torch.device | str = "cpu") -> ClientStateStore:
        """An empty store of the clients' states of kind ``backend`` (``federation.client_state``)."""
        raise NotImplementedError

    def rows_through(self, round_done: int) -> list[dict[str, Any]]:
        """The metrics rows of rounds ``<= round_done`` recorded so far (a resume starts
        there); rows of later rounds (written after that checkpoint) are forgotten."""
        return []

    def record_partition(self, facts: dict[str, Any]) -> None:
        """Client sizes and label counts of the partition (``partition.json``)."""

    def record_row(self, row: dict[str, Any]) -> None:
        """One round's metrics row, as soon as the round is done."""

    def save_checkpoint(self, state: dict[str, Any]) -> None:
        """Everything needed to continue the run bit for bit (tensors on any device)."""

    def save_model(self, params: dict[str, torch.Tensor]) -> None:
        """The final global model (parameters and buffers), at the end of the run."""

    def finish(self, summary: dict[str, Any], client_rows: list[dict[str, Any]]) -> None:
        """The run's summary and the final per-client metrics."""


class MemoryRecorder(RunRecorder):
    """Keeps the record in memory: ``rows``, ``partition``, ``summary``, ``client_rows``, ``model`` and
    the last checkpoint (serialised as a checkpoint file would be, so a later
    :class:`~fedveil.runtime.simulation.Simulation` given this recorder resumes from it).
    ``client_state_dir``: where ``federation.client_state = "disk"`` keeps the states."""

    where = "memory"

    def __init__(self, client_state_dir: str | os.PathLike | None = None) -> None:
        self.client_state_dir = client_state_dir
        self.rows: list[dict[str, Any]] = []
        self.partition: dict[str, Any] | None = None
        self.summary: dict[str, Any] | None = None
        self.client_rows: list[dict[str, Any]] | None = None
        self.model: dict[str, torch.Tensor] | None = None
        self._checkpoint: bytes | None = None

    def load_checkpoint(self, device: torch.device | str = "cpu") -> dict[str, Any] | None:
        """The last checkpoint saved here, deserialised onto ``device``, or None."""
        if self._checkpoint is None:
            return None
        return torch.load(io.BytesIO(self._checkpoint), weights_only=True, map_location=device)

    def client_store(self, backend: str, device: torch.device | str = "cpu") -> ClientStateStore:
        """A store of kind ``backend``; ``disk`` needs ``client_state_dir`` (else ``ValueError``)."""
        if backend == "disk" and self.client_state_dir is None:
            raise ValueError("federation.client_state = \"disk\" needs a folder: MemoryRecorder(client_state_dir=...)")
        return make_client_store(backend, self.client_state_dir or ".", device)

    def rows_through(self, round_done: int) -> list[dict[str, Any]]:
        """Forget the rows of rounds after ``round_done``; return copies of the others."""
        self.rows = [r for r in self.rows if r["round"] <= round_done]
        return [dict(r) for r in self.rows]

    def record_partition(self, facts: dict[str, Any]) -> None:
        """Keep ``facts`` as ``partition``."""
        self.partition = facts

    def record_row(self, row: dict[str, Any]) -> None:
        """Append a JSON round-trip copy of ``row`` to ``rows``."""
        self.rows.append(json.loads(json.dumps(row)))  # as a metrics.jsonl line would keep it

    def save_checkpoint(self, state: dict[str, Any]) -> None:
        """Keep ``state``, as CPU tensors, serialised by ``torch.save``."""
        buffer = io.BytesIO()
        torch.save(to_cpu(state), buffer)
        self._checkpoint = buffer.getvalue()

    def save_model(self, params: dict[str, torch.Tensor]) -> None:
        """Keep ``params`` as CPU tensors in ``model``."""
        self.model = to_cpu(dict(params))

    def finish(self, summary: dict[str, Any], client_rows: list[dict[str, Any]]) -> None:
        """Keep ``summary`` and ``client_rows``."""
        self.summary, self.client_rows = summary, client_rows


class DirectoryRecorder(RunRecorder):
    """Keeps the record in a run directory. ``plots(path)`` draws the PNGs at the end
    (:func:`~fedveil.runtime.report.write_report`; None: no plots)."""

    def __init__(self, run_dir: RunDirectory, resume: bool, plots: Callable[[Path], Any] | None = None) -> None:
        self.run_dir, self.resume, self.plots = run_dir, resume, plots

    @classmethod
    def open(
        cls, out: str | os.PathLike, config: dict[str, Any], resume: bool = False, plots: Callable[[Path], Any] | None = None,
    ) -> "DirectoryRecorder":
        """A new run directory ``out`` for ``config`` (refused if it holds anything), or with
        ``resume`` the existing run of the same config there (created if there is none)."""
        run_dir = RunDirectory.open_for_resume(out, config) if resume else RunDirectory.create(out, config)
        return cls(run_dir, resume, plots)

    @property
    def path(self) -> Path:
        """The run directory's path."""
        return self.run_dir.path

    @property
    def where(self) -> str:
        """The run directory's path, quoted, for messages."""
        return f"'{self.run_dir.path}'"

    def load_checkpoint(self, device: torch.device | str = "cpu") -> dict[str, Any] | None:
        """When resuming, the run directory's checkpoint on ``device`` (None if it has none); otherwise None."""
        return self.run_dir.load_checkpoint(map_location=device) if self.resume else None

    def client_store(self, backend: str, device: torch.device | str = "cpu") -> ClientStateStore:
        """A store of kind ``backend``; ``disk`` keeps the states under the run's ``client_states/``."""
        return make_client_store(backend, self.run_dir.file(CLIENT_STATES_DIR), device)

    def rows_through(self, round_done: int) -> list[dict[str, Any]]:
        """The rows of rounds ``<= round_done``; later rows are dropped from ``metrics.jsonl``."""
        return self.run_dir.keep_metrics_through(round_done)

    def record_partition(self, facts: dict[str, Any]) -> None:
        """Write ``facts`` to ``partition.json``."""
        self.run_dir.write_json(PARTITION_FILE, facts)

    def record_row(self, row: dict[str, Any]) -> None:
        """Append ``row`` to ``metrics.jsonl``."""
        self.run_dir.append_metrics(row)

    def save_checkpoint(self, state: dict[str, Any]) -> None:
        """Write ``state`` to ``checkpoint.pt`` (CPU tensors, atomically)."""
        self.run_dir.save_checkpoint(state)

    def save_model(self, params: dict[str, torch.Tensor]) -> None:
        """Write ``params`` to ``model.pt`` (CPU tensors, atomically)."""
        self.run_dir.save_model(params)

    def finish(self, summary: dict[str, Any], client_rows: list[dict[str, Any]]) -> None:
        """Write ``client_metrics.json`` and ``summary.json``, then draw the plots (if any)."""
        self.run_dir.write_json(CLIENT_METRICS_FILE, client_rows)
        self.run_dir.write_json(SUMMARY_FILE, summary)
        if self.plots is not None:
            self.plots(self.run_dir.path)


__all__ = ["DirectoryRecorder", "MemoryRecorder", "RunRecorder"]
