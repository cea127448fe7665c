"""Where per-client state lives: in memory (default) or one file per client on disk.

Stateful algorithms keep one state per client that has ever taken part (SCAFFOLD's
control variates, Local's own models). In memory that grows with the population; with
``federation.client_state = "disk"`` only the cohort's states are in memory at a time,
so memory grows with the cohort.

Both stores keep states compact: a tensor that does not own its storage is stored as a
contiguous clone. The vectorized executor returns each client's tensors as views of the cohort's stacked
results; keeping a view would keep all the cohort's rows alive, and ``torch.save`` of a
view writes its whole storage.

Disk layout and crash consistency (a killed run resumes bit-for-bit)
--------------------------------------------------------------------
``client_states/c{cid}.r{round}.pt`` holds client ``cid``'s state as of the end of
round ``round`` (1-based), written to a temporary file, fsynced and renamed into place.
A new state is a new file, so the version a checkpoint relies on is never overwritten:

* the checkpoint stores the index ``{cid: round}`` of every client's newest version,
  not the states;
* after writing version ``r`` of a client, its previous version ``r_old`` is deleted at
  once if ``r_old`` is newer than the last checkpoint (no checkpoint refers to it);
  otherwise the last checkpoint still needs it, and it is deleted only once the next
  checkpoint has been saved (two steps: :meth:`to_checkpoint` gives the index to save,
  :meth:`checkpoint_saved` then deletes the superseded versions);
* on resume, :meth:`restore` keeps exactly the versions in the checkpoint's index and
  deletes every other state file: versions written after the checkpoint by the killed
  run, versions a crash kept from being deleted, torn temporary files. A version the
  index names but the directory lacks is an error rather than a silently fresh client.

So at any moment the files hold every state the last saved checkpoint refers to, and
the number of files stays at most two per client.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

from ..algorithms.base import State
from .device import to_cpu
from .run_dir import RunDirError, atomic_write

BACKENDS = ("memory", "disk")
_STATE_FILE = re.compile(r"c(\d+)\.r(\d+)\.pt(\.(?:[0-9a-f]+\.)?tmp)?")  # .tmp: a torn atomic_write


def owns_storage(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is contiguous and its storage holds exactly its own elements."""
    own = tensor.numel() * tensor.element_size()
    return tensor.is_contiguous() and tensor.storage_offset() == 0 and tensor.untyped_storage().nbytes() == own


def compact(value: Any) -> Any:
    """``value`` with every tensor that does not own its storage (a view, a non-contiguous
    tensor) replaced by a contiguous clone; tensors that do are kept, copying is not free."""
    if isinstance(value, torch.Tensor):
        value = value.detach()
        return value if owns_storage(value) else value.clone(memory_format=torch.contiguous_format)
    if isinstance(value, dict):
        return {k: compact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(compact(v) for v in value)
    return value


class ClientStateStore:
    """The states of the clients that have trained so far, by client id.

    ``get`` returns None for a client without state (the caller then initialises it);
    ``put`` records a client's state at the end of a round. ``to_checkpoint`` is what a
    checkpoint stores, ``checkpoint_saved`` is called once it is safely written, and
    ``restore`` reloads the store from a checkpoint's entry on resume.
    """

    def get(self, cid: int) -> State | None:
        """Client ``cid``'s newest state, or None if it has none."""
        raise NotImplementedError

    def put(self, cid: int, state: State, round_done: int) -> None:
        """Record ``state`` as client ``cid``'s state at the end of round ``round_done``."""
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    def to_checkpoint(self) -> dict[int, Any]:
        """What a checkpoint stores to restore the store."""
        raise NotImplementedError

    def checkpoint_saved(self, round_done: int) -> None:
        """The checkpoint of round ``round_done`` is written; older versions may go."""

    def restore(self, entry: dict[int, Any], round_done: int) -> None:
        """Reload the store from a checkpoint's ``entry`` (saved after round ``round_done``)."""
        raise NotImplementedError


class MemoryClientStore(ClientStateStore):
    """States in a dict; the checkpoint holds them all (``{cid: state}``)."""

    def __init__(self) -> None:
        self._states: dict[int, State] = {}

    def get(self, cid: int) -> State | None:
        """Client ``cid``'s state, or None."""
        return self._states.get(cid)

    def put(self, cid: int, state: State, round_done: int) -> None:
        """Keep ``state``, compacted (:func:`compact`), as client ``cid``'s."""
        self._states[cid] = compact(state)

    def __len__(self) -> int:
        return len(self._states)

    def to_checkpoint(self) -> dict[int, State]:
        """The states themselves, ``{cid: state}``."""
        return self._states

    def restore(self, entry: dict[int, State], round_done: int) -> None:
        """Take the states of ``entry``."""
        self._states = dict(entry)


class DiskClientStore(ClientStateStore):
    """One file per client version under ``directory``; the checkpoint holds ``{cid: round}``.
    Files hold CPU tensors; :meth:`get` loads them onto ``device`` (the run's)."""

    def __init__(self, directory: str | os.PathLike, device: torch.device | str = "cpu") -> None:
        self.directory = Path(directory)
        self.device = torch.device(device)
        self._latest: dict[int, int] = {}  # cid -> round of its newest version on disk
        self._checkpoint_round = 0  # round of the last saved checkpoint
        self._superseded: list[Path] = []  # versions only the last checkpoint still needs

    def path(self, cid: int, round_done: int) -> Path:
        """The file of client ``cid``'s state as of the end of round ``round_done``."""
        return self.directory / f"c{cid}.r{round_done}.pt"

    def get(self, cid: int) -> State | None:
        """Client ``cid``'s newest version loaded onto ``device``, or None if it has none."""
        round_done = self._latest.get(cid)
        if round_done is None:
            return None
        return torch.load(self.path(cid, round_done), weights_only=True, map_location=self.device)

    def put(self, cid: int, state: State, round_done: int) -> None:
        """Write ``state`` as a new version atomically and retire the previous one (module doc)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        compacted = compact(to_cpu(state))
        atomic_write(self.path(cid, round_done), lambda handle: torch.save(compacted, handle))
        previous = self._latest.get(cid)
        self._latest[cid] = round_done
        if previous is None or previous == round_done:
            return
        if previous <= self._checkpoint_round:
            self._superseded.append(self.path(cid, previous))
        else:
            self.path(cid, previous).unlink()

    def __len__(self) -> int:
        return len(self._latest)

    def to_checkpoint(self) -> dict[int, int]:
        """The index ``{cid: round}`` of every client's newest version."""
        return dict(self._latest)

    def checkpoint_saved(self, round_done: int) -> None:
        """Delete the versions only the previous checkpoint needed; ``round_done`` is now the last checkpoint's."""
        for path in self._superseded:
            path.unlink(missing_ok=True)
        self._superseded = []
        self._checkpoint_round = round_done

    def restore(self, entry: dict[int, int], round_done: int) -> None:
        """Keep exactly the versions of checkpoint index ``entry``; delete every other state file."""
        self._latest = dict(entry)
        self._checkpoint_round = round_done
        self._superseded = []
        found = set()
        for cid, version, name in self._state_files():
            if version is not None and self._latest.get(cid) == version:
                found.add(cid)
            else:
                (self.directory / name).unlink()
        missing = sorted(set(self._latest) - found)
        if missing:
            shown = ", ".join(f"c{c}.r{self._latest[c]}.pt" for c in missing[:5])
            raise RunDirError(
                f"{len(missing)} client state file(s) the checkpoint needs are missing from "
                f"'{self.directory}' ({shown}); the run cannot resume exactly: start a new run"
            )

    def _state_files(self) -> list[tuple[int, int | None, str]]:
        """``(cid, round, name)`` of the state files present; round None for temporary files."""
        if not self.directory.is_dir():
            return []
        out = []
        for name in os.listdir(self.directory):
            match = _STATE_FILE.fullmatch(name)
            if match:
                out.append((int(match[1]), None if match[3] else int(match[2]), name))
        return out


def make_client_store(backend: str, directory: str | os.PathLike, device: torch.device | str = "cpu") -> ClientStateStore:
    """The store ``federation.client_state`` names; ``directory`` and ``device`` (where loaded
    states go) are used by ``disk`` only: in memory, states stay where the run put them."""
    if backend == "memory":
        return MemoryClientStore()
    if backend == "disk":
        return DiskClientStore(directory, device)
    raise ValueError(f"unknown client state backend '{backend}'; choose one of {', '.join(BACKENDS)}")
