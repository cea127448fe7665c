"""Silos that read their own files: the server operator writes ``federation.json`` from the
run's config alone (no rows anywhere), and each silo encodes its own CSV or Parquet file
by the schema in it (``fedveil deploy schema``; ``fedveil deploy silo --table FILE``).

The schema is the config's ``table`` options, complete: the feature columns, the
categories of every categorical column and the label's classes (a silo sees only its own
rows, so nothing may be inferred from them), the task, the split fractions and the
standardisation (``per_client`` or ``none``: ``pooled`` needs every silo's rows). A silo
checks its file against it when its service starts and stops with one line naming the
column: a missing or extra column, text in a numeric column, a value outside its
categories, an empty cell. Its rows are split into train / validation / test by a stream
seeded by (seed, silo): not the pooled simulation's split, which interleaves every
client's draws.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..config import RunConfig
from ..data.errors import DataError
from ..data.federated import ClientData, split_client_rows, standardise_client
from ..data.loaders.table import encode_table
from ..data.table_files import read_table
from ..runtime.run_dir import config_fingerprint, read_json
from ..runtime.simulation import FederationShape
from ..seeding import numpy_generator
from .private_files import private_folder, write_private
from .silo_data import FEDERATION_FILE, SiloDataError, silo_folder
from .silo_identity import make_silo_key

SILO_ID_FILE = "silo.json"
SCHEMA_OPTIONS = ("label", "features", "categorical", "groups", "categories", "classes", "task")


def table_schema(config: RunConfig) -> dict[str, Any]:
    """The schema every silo encodes its file by, from ``config.data`` alone; a one-line
    DataError for what it leaves open."""
    data = config.data
    if data.name != "table":
        raise DataError(f"data.name: silos read their own files for the 'table' data set, not '{data.name}'")
    options = dict(data.options)
    for needed in ("label", "features", "task"):
        if options.get(needed) in (None, "auto"):
            raise DataError(f"data.options.{needed}: name it in the config; a silo's own rows must not decide it")
    task, categorical = options["task"], list(options.get("categorical") or [])
    categories = dict(options.get("categories") or {})
    missing = [c for c in categorical if c not in categories]
    if missing:
        raise DataError(f"data.options.categories: list the values of {', '.join(missing)}; each silo sees only its own")
    if task == "classification" and not options.get("classes"):
        raise DataError("data.options.classes: list the label's classes; a silo may hold only some of them")
    if data.standardize == "pooled":
        raise DataError('data.standardize: "pooled" needs every silo\'s rows; use "per_client" or "none"')
    names = []
    for feature in options["features"]:
        names += [f"{feature}={v}" for v in categories[feature]] if feature in categorical else [feature]
    return {
        "options": {k: options[k] for k in SCHEMA_OPTIONS if k in options},
        "feature_names": names, "num_classes": len(options.get("classes") or []),
        "val_fraction": data.val_fraction, "test_fraction": data.test_fraction, "standardize": data.standardize,
        "seed": config.seed,
    }


def write_schema_federation(config: RunConfig, out: str | os.PathLike) -> FederationShape:
    """``federation.json`` for the config's schema, and per silo a folder with a copy of it,
    ``silo.json`` (its id) and its identity key: no rows anywhere."""
    out = Path(out)
    if (out / FEDERATION_FILE).exists():
        raise SiloDataError(f"'{out}' already holds a federation ({FEDERATION_FILE}); choose another --out")
    schema = table_schema(config)
    task = schema["options"]["task"]
    model = config.model.name if config.model.name != "auto" else ("mlp" if task == "classification" else "linear")
    shape = FederationShape(config.data.num_clients, task, schema["num_classes"], (len(schema["feature_names"]),), model)
    facts = {
        **asdict(shape), "input_shape": list(shape.input_shape), "table": schema,
        "fingerprint": config_fingerprint(config.model_dump(mode="json")),
    }
    private_folder(out)
    keys = {}
    for cid in range(shape.num_clients):
        folder = private_folder(silo_folder(out, cid))
        write_private(folder / SILO_ID_FILE, lambda handle, cid=cid: handle.write(json.dumps({"client_id": cid}).encode()))
        keys[str(cid)] = make_silo_key(folder)
    facts["silo_keys"] = keys
    text = (json.dumps(facts, indent=2) + "\n").encode()
    for cid in range(shape.num_clients):
        write_private(silo_folder(out, cid) / FEDERATION_FILE, lambda handle: handle.write(text))
    write_private(out / FEDERATION_FILE, lambda handle: handle.write(text))
    return shape


def load_silo_table(folder: str | os.PathLike, table: str | os.PathLike) -> tuple[int, ClientData]:
    """(silo id, rows) of silo ``folder`` from its own ``table`` file, encoded, split and
    standardised by the schema of its ``federation.json``."""
    folder, table = Path(folder), Path(table)
    facts = read_json(folder / FEDERATION_FILE) if (folder / FEDERATION_FILE).is_file() else {}
    schema = facts.get("table")
    if not isinstance(schema, dict):
        raise SiloDataError(f"'{folder}' holds no table schema; the operator writes it with 'fedveil deploy schema'")
    try:
        client_id = int(read_json(folder / SILO_ID_FILE)["client_id"])
    except (OSError, KeyError, TypeError, ValueError):
        raise SiloDataError(f"'{folder}' has no {SILO_ID_FILE} saying which silo it is") from None
    options = schema["options"]
    expected = set(options["features"]) | {options["label"]} | set(options.get("groups") or [])
    columns = read_table(table)  # read once: checked for extra columns, then encoded
    extra = sorted(set(columns) - expected)
    if extra:
        raise DataError(f"'{table.name}': column '{extra[0]}' is not in the federation's schema ({', '.join(sorted(expected))})")
    source = encode_table(columns, f"'{table.name}'", **options)
    names = source.train.info["feature_names"]
    if names != schema["feature_names"]:
        raise DataError(f"'{table.name}' encodes to columns {', '.join(names)}, not the schema's {', '.join(schema['feature_names'])}")
    rng = numpy_generator(int(schema["seed"]), "silo-split", client_id)
    client = split_client_rows(source.train, float(schema["val_fraction"]), float(schema["test_fraction"]), rng)
    if schema["standardize"] == "per_client" and source.continuous:
        client = standardise_client(client, source.continuous)
    return client_id, client
