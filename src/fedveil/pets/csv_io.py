"""Read and write the challenge's CSV files (spec 002 §4.1) for :class:`PandemicTables`.

One file per table, ``<table>.csv`` (``person.csv``, ``household.csv``, ``residence_locations.csv``,
``activity_locations.csv``, ``activity_location_assignment.csv``, ``population_network.csv``,
``disease_outcome.csv``) plus the hidden week in ``disease_outcome_target.csv`` when known.
Every file has a header row; the columns of :data:`~fedveil.pets.tables.SCHEMA` are required
(in any order), further columns are kept. ``disease_outcome.state`` holds the letters S, I, R;
longitude and latitude are floats, every other column an integer.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .tables import FLOAT_COLUMNS, SCHEMA, STATE_CODE, STATES, PandemicTables, Table, check_columns

FILES = {name: f"{name}.csv" for name in SCHEMA if name != "target"} | {"target": "disease_outcome_target.csv"}


def write_csv_tables(data: PandemicTables, directory: str | Path) -> Path:
    """Write every table of ``data`` into ``directory`` (created if needed)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name, table in data.tables().items():
        _write(directory / FILES[name], table)
    return directory


def read_csv_tables(directory: str | Path) -> PandemicTables:
    """Read the tables written by :func:`write_csv_tables` (or the challenge's files)."""
    directory = Path(directory)
    tables = {}
    for name, file in FILES.items():
        path = directory / file
        if not path.exists():
            if name == "target":
                continue
            raise FileNotFoundError(f"{path}: missing (a data set needs {', '.join(v for k, v in FILES.items() if k != 'target')})")
        tables[name] = _read(path, name)
    return PandemicTables(**tables)


def _write(path: Path, table: Table) -> None:
    columns = list(table)
    text = []
    for c in columns:
        values = table[c]
        if c == "state":
            text.append(np.asarray(STATES)[values])
        elif c in FLOAT_COLUMNS:
            text.append(np.char.mod("%.6f", values))
        else:
            text.append(values.astype(np.int64).astype(str))
    lines = [",".join(columns)] + [",".join(row) for row in zip(*text)]
    path.write_text("\n".join(lines) + "\n")


def _read(path: Path, name: str) -> Table:
    with path.open() as f:
        header = f.readline().strip().split(",")
    check_columns(name, {c: np.zeros(0) for c in header}, str(path))
    converters = {}
    if "state" in header:
        converters[header.index("state")] = lambda s: STATE_CODE.get(s.strip(), -1)
    try:
        values = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2, converters=converters or None, dtype=float)
    except ValueError as err:
        raise ValueError(f"{path}: cannot parse as numbers ({err})") from err
    if values.shape[1] != len(header) and len(values):
        raise ValueError(f"{path}: rows have {values.shape[1]} fields, the header {len(header)}")
    values = values.reshape(-1, len(header))
    table = {}
    for j, c in enumerate(header):
        col = values[:, j]
        if c in FLOAT_COLUMNS:
            table[c] = col
        elif c == "state":
            bad = np.flatnonzero(col < 0)
            if len(bad):
                raise ValueError(f"{path}: state must be one of {', '.join(STATES)}; data row {bad[0] + 1} has something else")
            table[c] = col.astype(np.int8)
        else:
            table[c] = col.astype(np.int64)
    return table
