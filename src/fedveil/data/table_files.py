"""Reading a table from disk as named columns: CSV (the standard library's reader, a
header row required) or Parquet (``pyarrow``, the ``tables`` extra). Values stay as the
file has them (text for CSV); :mod:`fedveil.data.loaders.table` types and encodes them."""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from .errors import DataError

SUFFIXES = (".csv", ".parquet")
Columns = dict[str, list[Any]]


def read_table(path: Path) -> Columns:
    """The columns of one CSV or Parquet file, by header name, in file order."""
    if not path.is_file():
        raise DataError(f"table file '{path}' does not exist")
    if path.suffix.lower() == ".parquet":
        return _read_parquet(path)
    if path.suffix.lower() == ".csv":
        return _read_csv(path)
    raise DataError(f"'{path.name}': a table is a .csv or .parquet file")


def _read_csv(path: Path) -> Columns:
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle)
        try:
            header = next(reader)
        except StopIteration:
            raise DataError(f"'{path.name}' is empty: a CSV table needs a header row") from None
        names = [h.strip() for h in header]
        if len(set(names)) != len(names) or "" in names:
            raise DataError(f"'{path.name}': the header has an empty or repeated column name")
        columns: Columns = {name: [] for name in names}
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) != len(names):
                raise DataError(f"'{path.name}' line {line}: {len(row)} values for {len(names)} columns")
            for name, value in zip(names, row):
                columns[name].append(value.strip())
    return columns


def _read_parquet(path: Path) -> Columns:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"'{path.name}': reading Parquet needs pyarrow: pip install 'fedveil[tables]'") from None
    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow's own errors: a corrupt or non-Parquet file
        raise DataError(f"'{path.name}' is not a readable Parquet file: {err}") from None
    return {name: table.column(name).to_pylist() for name in table.column_names}


def table_files(path: Path) -> list[Path]:
    """``path`` itself, or the CSV and Parquet files of a folder in name order (one client each)."""
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in SUFFIXES)
        if not files:
            raise DataError(f"folder '{path}' holds no .csv or .parquet file")
        return files
    return [path]
