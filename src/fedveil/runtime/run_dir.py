"""The run directory: resolved config, per-round metrics, summary, checkpoint (and, with
``federation.client_state = "disk"``, the clients' states under ``client_states/``).

Writes are crash-safe: ``metrics.jsonl`` is appended and fsynced row by row, JSON files
and the checkpoint are written to a temporary file and renamed into place, so a killed
run never leaves a half-written file and loses at most the rounds since its checkpoint.
An existing run is never overwritten: it can only be resumed, with the same config.
"""
from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

import torch

from .device import to_cpu

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
CLIENT_METRICS_FILE = "client_metrics.json"
CHECKPOINT_FILE = "checkpoint.pt"
TMP_SUFFIX = ".tmp"  # atomic_write's temporary files: <name>.<hex>.tmp
MODEL_FILE = "model.pt"  # the final global model's state (parameters and buffers), on the CPU
CLIENT_STATES_DIR = "client_states"


class RunDirError(RuntimeError):
    """The run directory cannot be used as asked (already holds a run, another config...)."""


# settings that change where a run is reported, not what it computes: a resume may change them
# Settings that change how a run is reported or where it computes, not what it computes: a
# resume may change them (a run started on a GPU can finish on the CPU: checkpoints hold CPU
# tensors; the numbers then differ from an uninterrupted run only by float kernel order).
REPORTING_KEYS = ("log", "device")


def config_fingerprint(config: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of a resolved config, its reporting and placement settings left out."""
    kept = {k: v for k, v in config.items() if k not in REPORTING_KEYS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()


def atomic_write(path: Path, write, mode: int | None = None) -> None:
    """Call ``write(handle)`` on a temporary file, fsync it and rename it to ``path``. The
    temporary name (``<name>.<random>.tmp``) is unique, so two processes writing the same
    file (say, both re-scoring one finished run) never write into each other's. ``mode``
    (e.g. ``0o600``): the file is created with exactly these permission bits, whatever the
    umask (default: the umask's)."""
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}{TMP_SUFFIX}")
    try:
        with _exclusive(tmp, mode) as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _exclusive(path: Path, mode: int | None):
    """A new file opened for binary writing (``FileExistsError`` if it exists), ``mode`` exact."""
    if mode is None:
        return open(path, "xb")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode)
    handle = os.fdopen(fd, "wb")
    if hasattr(os, "fchmod"):  # never wider than created; adds back owner bits a umask took
        os.fchmod(fd, mode)
    return handle


def write_json(path: Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    atomic_write(path, lambda h: h.write((json.dumps(obj, indent=2) + "\n").encode()))


def read_json(path: Path) -> Any:
    """The JSON value in file ``path``."""
    return json.loads(Path(path).read_text())


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Rows of a ``metrics.jsonl`` file; a torn last line (killed mid-write) is skipped."""
    rows = []
    if not Path(path).exists():
        return rows
    for line in Path(path).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


class RunDirectory:
    """One run's folder. Use :meth:`create` for a new run and :meth:`open_for_resume` to continue."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def file(self, name: str) -> Path:
        """The path of file ``name`` in the run directory."""
        return self.path / name

    @property
    def has_run(self) -> bool:
        """Whether the directory holds a run (its ``config.json``)."""
        return self.file(CONFIG_FILE).exists()

    @classmethod
    def create(cls, path: str | os.PathLike, config: dict[str, Any]) -> "RunDirectory":
        """A new run directory ``path`` holding ``config``; ``RunDirError`` if the folder is not empty."""
        run = cls(path)
        if run.path.exists() and any(run.path.iterdir()):
            hint = "pass --resume to continue it" if run.has_run else "it is not an empty folder"
            raise RunDirError(f"run directory '{run.path}' already exists and is not empty ({hint}), or choose another --out")
        run.path.mkdir(parents=True, exist_ok=True)
        write_json(run.file(CONFIG_FILE), config)
        return run

    @classmethod
    def open_for_resume(cls, path: str | os.PathLike, config: dict[str, Any]) -> "RunDirectory":
        """Reopen a run of the same config (a new directory is created if there is none yet)."""
        run = cls(path)
        if not run.has_run:
            return cls.create(path, config)
        saved = read_json(run.file(CONFIG_FILE))
        if config_fingerprint(saved) != config_fingerprint(config):
            changed = sorted(k for k in _diff_keys(saved, config) if k.split(".")[0] not in REPORTING_KEYS)
            raise RunDirError(
                f"cannot resume '{run.path}': its config differs in {', '.join(changed)}; "
                "resume with the saved config (omit CONFIG) or start a new run with another --out"
            )
        return run

    # --------------------------------------------------------------- metrics
    def append_metrics(self, row: dict[str, Any]) -> None:
        """Append ``row`` as one line of ``metrics.jsonl`` and fsync it."""
        with open(self.file(METRICS_FILE), "a") as handle:
            handle.write(json.dumps(row) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def metrics(self) -> list[dict[str, Any]]:
        """The rows of ``metrics.jsonl`` (:func:`read_metrics`)."""
        return read_metrics(self.file(METRICS_FILE))

    def keep_metrics_through(self, last_round: int) -> list[dict[str, Any]]:
        """Drop rows after ``last_round`` (written after the checkpoint a resume starts from)."""
        rows = [r for r in self.metrics() if r["round"] <= last_round]
        body = "".join(json.dumps(r) + "\n" for r in rows)
        atomic_write(self.file(METRICS_FILE), lambda h: h.write(body.encode()))
        return rows

    # ------------------------------------------------------------ checkpoint
    def save_checkpoint(self, state: dict[str, Any]) -> None:
        """Write ``state`` with every tensor as a CPU tensor (a checkpoint does not depend on
        the device the run computed on)."""
        cpu_state = to_cpu(state)
        atomic_write(self.file(CHECKPOINT_FILE), lambda h: torch.save(cpu_state, h))

    def load_checkpoint(self, map_location: torch.device | str = "cpu") -> dict[str, Any] | None:
        """The checkpoint with its tensors on ``map_location`` (the resuming run's device)."""
        path = self.file(CHECKPOINT_FILE)
        if not path.exists():
            return None
        try:
            return torch.load(path, weights_only=True, map_location=map_location)
        except Exception as err:  # torch raises several types for a damaged file
            raise RunDirError(
                f"checkpoint '{path}' cannot be read: it is damaged or not a fedveil checkpoint ({type(err).__name__}); "
                "delete it to restart the run"
            ) from None

    def write_json(self, name: str, obj: Any) -> None:
        """Write ``obj`` to file ``name`` as indented JSON, atomically."""
        write_json(self.file(name), obj)

    def save_model(self, params: dict[str, torch.Tensor]) -> None:
        """The final global model as a name -> CPU tensor dict (``torch.load(..., weights_only=True)``)."""
        cpu = to_cpu(dict(params))
        atomic_write(self.file(MODEL_FILE), lambda h: torch.save(cpu, h))


def dotted_keys(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A config (or any nested dict) as ``section.key -> value``; empty dicts stay values."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(dotted_keys(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def read_run(path: str | os.PathLike) -> tuple[RunDirectory, list[dict[str, Any]], dict[str, Any]]:
    """A run directory, its metric rows and its config; RunDirError when ``path`` holds no
    run or the run has no finished round yet."""
    run = RunDirectory(path)
    if not run.has_run:
        raise RunDirError(f"'{path}' is not a fedveil run directory (no {CONFIG_FILE})")
    rows = run.metrics()
    if not rows:
        raise RunDirError(f"run '{path}' has no finished round yet")
    return run, rows, read_json(run.file(CONFIG_FILE))


def _diff_keys(a: Any, b: Any, prefix: str = "") -> set[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: set[str] = set()
        for key in set(a) | set(b):
            out |= _diff_keys(a.get(key), b.get(key), f"{prefix}{key}.")
        return out
    return set() if a == b else {prefix.rstrip(".")}
