"""A silo's own rows on its own disk, and the federation facts every party shares.

``fedveil deploy prepare CONFIG --out DIR`` runs the config's data pipeline once (load,
partition, split: exactly what a simulation of the same config does) and writes

* ``DIR/federation.json``: the facts every party may know (number of silos, task, input
  shape, classes, model, the config's fingerprint), no rows;
* ``DIR/silo-<k>/silo.pt``: silo k's train / validation / test rows and nothing else, with
  a copy of ``federation.json``.

Each ``silo-<k>`` folder is then handed to silo k's machine; the server gets only
``federation.json``. This is how a simulation's numbers are reproduced over the network
(the test in tests/deploy does so). A consortium whose silos already hold their own
records writes each silo's file itself with :func:`save_silo` (the same tensors a
loader gives: ``x``, ``y`` and optional ``groups`` per split).

Files hold tensors only and are read with ``torch.load(weights_only=True)``. Everything
this module writes is created 0600 in folders created 0700 (:mod:`.private_files`): a
silo's rows are readable by the account that holds them only.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ..config import RunConfig
from ..data.arrays import ArrayDataset
from ..data.errors import DataError
from ..data.federated import ClientData
from ..runtime.dataset import build_dataset
from ..runtime.run_dir import config_fingerprint, read_json
from ..runtime.simulation import FederationShape
from .private_files import private_folder, write_private
from .silo_identity import make_silo_key

FEDERATION_FILE = "federation.json"
SILO_FILE = "silo.pt"


class SiloDataError(DataError):
    """A silo folder or federation file that is missing, malformed or of another run."""


def silo_folder(out: str | os.PathLike, client_id: int) -> Path:
    """Silo ``client_id``'s folder ``silo-<id>`` under ``out``."""
    return Path(out) / f"silo-{client_id}"


def prepare_silos(config: RunConfig, out: str | os.PathLike) -> FederationShape:
    """Partition the config's data as a simulation would and write one folder per silo plus
    ``federation.json`` under ``out`` (which must not hold a federation yet)."""
    out = Path(out)
    if (out / FEDERATION_FILE).exists():
        raise SiloDataError(f"'{out}' already holds a prepared federation ({FEDERATION_FILE}); choose another --out")
    data = build_dataset(config.data, config.seed)
    shape = FederationShape.of(data, config.model.name)
    fingerprint = config_fingerprint(config.model_dump(mode="json"))
    facts = {**asdict(shape), "input_shape": list(shape.input_shape), "fingerprint": fingerprint}
    private_folder(out)
    for cid, client in enumerate(data.clients):
        save_silo(silo_folder(out, cid), cid, client, fingerprint)
    facts["silo_keys"] = {str(cid): make_silo_key(silo_folder(out, cid)) for cid in range(shape.num_clients)}
    for cid in range(shape.num_clients):
        _write_facts(silo_folder(out, cid) / FEDERATION_FILE, facts)  # each silo knows the federation's shape
    _write_facts(out / FEDERATION_FILE, facts)
    return shape


def _write_facts(path: Path, facts: dict[str, Any]) -> None:
    write_private(path, lambda handle: handle.write((json.dumps(facts, indent=2) + "\n").encode()))


def read_federation(path: str | os.PathLike) -> tuple[FederationShape, str]:
    """The shape and config fingerprint in ``federation.json`` (a file or the folder holding it)."""
    path = Path(path)
    if path.is_dir():
        path = path / FEDERATION_FILE
    if not path.is_file():
        raise SiloDataError(f"no {FEDERATION_FILE} at '{path}'; run 'fedveil deploy prepare' first")
    facts = read_json(path)
    try:
        shape = FederationShape(
            int(facts["num_clients"]), str(facts["task"]), int(facts["num_classes"]),
            tuple(int(d) for d in facts["input_shape"]), str(facts["model_name"]),
        )
        return shape, str(facts["fingerprint"])
    except (KeyError, TypeError, ValueError) as err:
        raise SiloDataError(f"{path}: malformed federation file ({err})") from None


def read_silo_keys(path: str | os.PathLike) -> dict[int, str]:
    """Each silo's registered public key (hex) from ``federation.json``; empty for a federation
    prepared before silos had keys (their identity is then unchecked)."""
    path = Path(path)
    facts = read_json(path / FEDERATION_FILE if path.is_dir() else path)
    try:
        return {int(cid): str(key) for cid, key in (facts.get("silo_keys") or {}).items()}
    except (TypeError, ValueError, AttributeError) as err:
        raise SiloDataError(f"{path}: malformed silo_keys ({err})") from None


def _split(ds: ArrayDataset | None) -> dict[str, Any] | None:
    return None if ds is None else {"x": ds.x.cpu(), "y": ds.y.cpu(), "groups": {k: g.cpu() for k, g in ds.groups.items()}}


def save_silo(folder: str | os.PathLike, client_id: int, data: ClientData, fingerprint: str = "") -> Path:
    """Write silo ``client_id``'s rows (``data``) as ``folder/silo.pt`` (0600; ``folder`` and
    its missing parents are created 0700)."""
    folder = private_folder(folder)
    payload = {
        "client_id": client_id, "fingerprint": fingerprint,
        "train": _split(data.train), "val": _split(data.val), "test": _split(data.test),
    }
    path = folder / SILO_FILE
    write_private(path, lambda handle: torch.save(payload, handle))
    return path


def _dataset(split: dict[str, Any], path: Path, name: str) -> ArrayDataset:
    try:
        return ArrayDataset(split["x"], split["y"], dict(split.get("groups") or {}))
    except (KeyError, TypeError, ValueError) as err:
        raise SiloDataError(f"{path}: the {name} split is malformed ({err})") from None


def load_silo(folder: str | os.PathLike) -> tuple[int, ClientData, str]:
    """(client id, rows, config fingerprint) of the silo whose folder is ``folder``."""
    path = Path(folder) / SILO_FILE
    if not path.is_file():
        raise SiloDataError(f"no {SILO_FILE} in '{folder}'; give the silo folder written by 'fedveil deploy prepare'")
    try:
        payload = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:  # torch raises many types for a torn or foreign file
        raise SiloDataError(f"cannot read {path}: it is damaged or not a silo file ({type(err).__name__})") from None
    if not isinstance(payload, dict) or "train" not in payload or "client_id" not in payload:
        raise SiloDataError(f"{path} is not a fedveil silo file")
    data = ClientData(
        _dataset(payload["train"], path, "train"),
        None if payload.get("val") is None else _dataset(payload["val"], path, "val"),
        _dataset(payload["test"], path, "test"),
    )
    return int(payload["client_id"]), data, str(payload.get("fingerprint", ""))
