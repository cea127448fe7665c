"""A finished run read back from its directory: the simulation rebuilt from ``config.json``
and the final server and client states from its last checkpoint, so that any client's
personal model (or the global one) can be scored again without retraining or touching
the run."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ..algorithms.base import Params, State
from ..config import validate
from ..errors import ConfigError
from .run_dir import CHECKPOINT_FILE, CLIENT_STATES_DIR, CONFIG_FILE, read_json
from .simulation import Simulation


def saved_simulation(run_dir: str | Path, data_root: str | None = None) -> Simulation:
    """The run's :class:`Simulation` rebuilt from its ``config.json`` (``data_root`` overrides
    where its data set lives)."""
    run_dir = Path(run_dir)
    if not (run_dir / CONFIG_FILE).is_file():
        raise ConfigError(f"'{run_dir}' is not a fedveil run (no {CONFIG_FILE})")
    raw = read_json(run_dir / CONFIG_FILE)
    if data_root is not None:
        raw["data"]["root"] = data_root
    return Simulation.from_config(validate(raw))


def final_checkpoint(run_dir: str | Path) -> dict:
    """The last checkpoint of ``run_dir`` with every client's state loaded (the disk store
    keeps them in ``client_states/``); a clear error where the run has none."""
    run_dir = Path(run_dir)
    if not (run_dir / CHECKPOINT_FILE).is_file():
        raise ConfigError(f"'{run_dir}' has no {CHECKPOINT_FILE}: not a fedveil run, or one that never checkpointed")
    checkpoint = torch.load(run_dir / CHECKPOINT_FILE, weights_only=True)
    clients = {}
    for cid, entry in checkpoint["clients"].items():
        if isinstance(entry, int):  # the disk store's index: the round of the client's newest state
            entry = torch.load(run_dir / CLIENT_STATES_DIR / f"c{cid}.r{entry}.pt", weights_only=True)
        clients[int(cid)] = entry
    checkpoint["clients"] = clients
    return checkpoint


@dataclass
class FinishedRun:
    """A run that completed all its rounds: its :class:`Simulation` (data, model, algorithm
    as configured) and its final ``server_state`` and ``client_states``."""

    sim: Simulation
    server_state: State
    client_states: dict[int, State]

    @classmethod
    def load(cls, run_dir: str | Path, data_root: str | None = None) -> "FinishedRun":
        """Read ``run_dir`` (``data_root`` overrides where its data set lives); refused with one
        line if the run stopped before its last round."""
        sim = saved_simulation(run_dir, data_root)
        checkpoint = final_checkpoint(run_dir)
        rounds = sim.config.federation.rounds
        if checkpoint["round"] != rounds:
            raise ConfigError(f"'{run_dir}' stopped after round {checkpoint['round']} of {rounds}: resume it first")
        return cls(sim, checkpoint["server"], checkpoint["clients"])

    def global_params(self) -> Params:
        """The final global model (MR-MTL's mean, Ditto's global model...)."""
        if not self.sim.algorithm.has_global_model:
            raise ConfigError(f"algorithm '{self.sim.config.algorithm.name}' has no global model")
        return self.sim.algorithm.global_params(self.server_state)

    def personal_params(self, cid: int) -> Params:
        """Client ``cid``'s personal model as the run's last evaluation built it."""
        if not self.sim.algorithm.has_personal_models:
            raise ConfigError(f"algorithm '{self.sim.config.algorithm.name}' has no personal models")
        rounds = self.sim.config.federation.rounds
        return self.sim.evaluator().personal_params(
            self.server_state, self.client_states.get(cid), cid, self.sim.data.clients[cid], rounds - 1
        )


__all__ = ["FinishedRun", "final_checkpoint", "saved_simulation"]
