"""Your own table: a CSV or Parquet file, or a folder of them (one per client), as a data
set (``[data] name = "table"``; docs/your-model-and-data.md).

Options (``data.options``): ``path`` (a file or a folder; relative to ``data.root`` when
that is set), ``label`` (the target column), ``features`` (default: every other column
except the client and group columns), ``categorical`` (text or code columns one-hot
encoded, each value a column ``name=value``), ``groups`` (columns kept as groups:
fairness metrics and partitioners read them), ``client`` (a column holding each row's
client: the natural partition), ``task`` (``classification``, ``regression`` or
``auto``: classification when the label is text or whole numbers with at most
``MAX_AUTO_CLASSES`` values), ``test_path`` (a held-out table of the same columns), and
``categories`` / ``classes`` (the values of each categorical column and of the label,
fixed instead of read from the rows: a deployed silo, which sees only its own rows, must
encode as every other silo does; a value outside them is an error).

A folder gives one client per file, in name order, as the group ``client``; partition
with ``{ name = "natural", key = "client" }`` and ``num_clients`` = the number of files
(a ``client`` column does the same with ``key`` = its name). Numeric feature columns are
continuous: ``data.standardize`` (pooled, per_client, none) applies to them as to the
built-in tables. Every problem is one line naming the column: a missing column, a
non-numeric feature not declared categorical, an empty value, an empty client file.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..arrays import ArrayDataset
from ..errors import DataError
from ..source import DATASETS, DataSource
from ..table_files import Columns, read_table, table_files

MAX_AUTO_CLASSES = 50
CLIENT_GROUP = "client"  # the group of a folder's files


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value))
    except ValueError:
        return None


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or (isinstance(value, str) and value == "")


def _check_present(columns: Columns, name: str, where: str) -> list[Any]:
    values = columns[name]
    for row, value in enumerate(values):
        if _missing(value):
            raise DataError(f"{where}: column '{name}' has no value at data row {row + 1}; fill or drop that row")
    return values


def _numeric(values: list[Any]) -> np.ndarray | None:
    numbers = [_number(v) for v in values]
    return None if any(n is None for n in numbers) else np.array(numbers, dtype=np.float64)


def _key(value: Any) -> str:
    """A category's name: numbers that are whole print without a decimal point."""
    number = _number(value)
    if number is not None and float(number).is_integer():
        return str(int(number))
    return str(value)


class _Schema:
    """Which column plays which part, the categories of each categorical and group column,
    the label's classes: fixed from the training table, applied to the test table too."""

    def __init__(
        self, columns: Columns, where: str, label: str | None, features, categorical, groups, client, task: str,
        categories: dict[str, list] | None = None, classes: list | None = None,
    ):
        available = list(columns)
        if label is None:
            raise DataError(f"data.options.label: name the target column; {where} has {', '.join(available)}")
        named = [label, *(features or []), *categorical, *groups, *([client] if client else [])]
        for name in named:
            if name not in columns:
                raise DataError(f"{where}: no column '{name}'; it has {', '.join(available)}")
        reserved = {label, *groups, *([client] if client else [])}
        self.features = list(features) if features is not None else [c for c in available if c not in reserved]
        if not self.features:
            raise DataError(f"{where}: no feature column is left besides the label, client and group columns")
        self.categorical = [c for c in self.features if c in set(categorical)]
        self.label, self.groups, self.client = label, list(groups), client
        declared = {name: [_key(v) for v in values] for name, values in (categories or {}).items()}
        unknown = sorted(set(declared) - set(self.categorical))
        if unknown:
            raise DataError(f"data.options.categories: {', '.join(unknown)} is not a categorical feature column")
        self.categories = {
            c: declared[c] if c in declared else sorted({_key(v) for v in _check_present(columns, c, where)})
            for c in self.categorical
        }
        self.group_categories = {g: sorted({_key(v) for v in _check_present(columns, g, where)}) for g in self.groups}
        if client:
            self.group_categories[client] = sorted({_key(v) for v in _check_present(columns, client, where)})
        label_values = _check_present(columns, label, where)
        numbers = _numeric(label_values)
        whole = numbers is not None and bool(np.all(numbers == np.round(numbers)))
        if task == "auto":
            task = "classification" if numbers is None or (whole and len(set(numbers)) <= MAX_AUTO_CLASSES) else "regression"
        if task == "regression" and numbers is None:
            raise DataError(f"{where}: task 'regression' needs a numeric label, but '{label}' holds text")
        if task not in ("classification", "regression"):
            raise DataError(f"data.options.task: '{task}' is not classification, regression or auto")
        self.task = task
        if classes is not None and task != "classification":
            raise DataError("data.options.classes: a regression label has no classes")
        found = sorted({_key(v) for v in label_values}, key=_class_order)
        self.classes = ([_key(c) for c in classes] if classes is not None else found) if task == "classification" else []

    def encode(self, columns: Columns, where: str) -> tuple[ArrayDataset, tuple[int, ...]]:
        """The rows of ``columns`` as features, targets and groups (the client column only
        where the table has it: a held-out test table need not); the continuous columns' indices."""
        blocks, names, continuous = [], [], []
        for name in self.features:
            values = _check_present(columns, name, where)
            if name in self.categories:
                codes = self._codes(values, self.categories[name], name, where)
                blocks.append(np.eye(len(self.categories[name]), dtype=np.float32)[codes])
                names.extend(f"{name}={v}" for v in self.categories[name])
                continue
            numbers = _numeric(values)
            if numbers is None:
                bad = next(v for v in values if _number(v) is None)
                raise DataError(
                    f"{where}: feature column '{name}' is not numeric (value {str(bad)!r}); "
                    "list it in data.options.categorical to one-hot encode it"
                )
            continuous.append(len(names))
            blocks.append(numbers.astype(np.float32)[:, None])
            names.append(name)
        label_values = _check_present(columns, self.label, where)
        if self.task == "classification":
            y = torch.from_numpy(self._codes(label_values, self.classes, self.label, where))
        else:
            y = torch.from_numpy(_numeric(label_values).astype(np.float32))
        groups = {g: torch.from_numpy(self._codes(_check_present(columns, g, where), self.group_categories[g], g, where))
                  for g in [*self.groups, *([self.client] if self.client in columns else [])]}
        info = {"feature_names": names, "group_categories": dict(self.group_categories)}
        if self.classes:
            info["classes"] = list(self.classes)
        x = torch.from_numpy(np.hstack(blocks)) if blocks else torch.zeros(len(y), 0)
        return ArrayDataset(x, y, groups, info), tuple(continuous)

    @staticmethod
    def _codes(values: list[Any], categories: list[str], name: str, where: str) -> np.ndarray:
        index = {c: i for i, c in enumerate(categories)}
        keys = [_key(v) for v in values]
        unknown = next((k for k in keys if k not in index), None)
        if unknown is not None:
            raise DataError(f"{where}: column '{name}' has value '{unknown}', outside its categories {', '.join(categories)}")
        return np.array([index[k] for k in keys], dtype=np.int64)


def _class_order(name: str) -> tuple[int, float, str]:
    number = _number(name)
    return (0, number, "") if number is not None else (1, 0.0, name)


def _concat(tables: list[Columns], files: list[Path]) -> Columns:
    names = list(tables[0])
    for table, file in zip(tables[1:], files[1:]):
        if list(table) != names:
            raise DataError(f"'{file.name}' has columns {', '.join(table)}, not those of '{files[0].name}' ({', '.join(names)})")
    return {name: [v for table in tables for v in table[name]] for name in names}


def encode_table(
    columns: Columns, where: str, *, label: str | None = None, features: list[str] | None = None,
    categorical: list[str] = (), groups: list[str] = (), task: str = "auto",
    categories: dict[str, list] | None = None, classes: list | None = None,
) -> DataSource:
    """One table's columns, already read (``fedveil.data.table_files.read_table``), encoded by
    the same options as :func:`load_table` (a deployed silo's own file, read once)."""
    if not next(iter(columns.values()), []):
        raise DataError(f"{where} has no rows")
    schema = _Schema(columns, where, label, features, list(categorical), list(groups), None, task, categories, classes)
    train, continuous = schema.encode(columns, where)
    return DataSource(train=train, test=None, task=schema.task, num_classes=len(schema.classes), continuous=continuous)


@DATASETS.register("table", "your own table: a CSV or Parquet file, or a folder of them (one per client)")
def load_table(
    root: str | os.PathLike | None = None,
    *,
    download: bool = True,
    path: str | None = None,
    label: str | None = None,
    features: list[str] | None = None,
    categorical: list[str] = (),
    groups: list[str] = (),
    client: str | None = None,
    task: str = "auto",
    test_path: str | None = None,
    categories: dict[str, list] | None = None,
    classes: list | None = None,
) -> DataSource:
    """Read and encode the table(s) (module docstring); ``download`` is accepted and unused
    (your data has no canonical source)."""
    if path is None:
        raise DataError("data.options.path: give the CSV or Parquet file, or a folder with one file per client")
    base = Path(root).expanduser() if root is not None else Path.cwd()
    source = base / Path(path).expanduser()
    files = table_files(source)
    tables = [read_table(f) for f in files]
    for file, table in zip(files, tables):
        if not next(iter(table.values()), []):
            raise DataError(f"client file '{file.name}' has no rows")
    per_file = source.is_dir()
    if per_file and client is not None:
        raise DataError("data.options.client: a folder already gives one client per file; drop client or give one file")
    columns = _concat(tables, files)
    where = f"'{source.name}'"
    schema = _Schema(columns, where, label, features, list(categorical), list(groups), client, task, categories, classes)
    train, continuous = schema.encode(columns, where)
    natural = client
    if per_file:
        sizes = [len(next(iter(t.values()))) for t in tables]
        train.groups[CLIENT_GROUP] = torch.from_numpy(np.repeat(np.arange(len(files)), sizes))
        train.info["group_categories"][CLIENT_GROUP] = [f.name for f in files]
        natural = CLIENT_GROUP
    test = None
    if test_path is not None:
        test_file = base / Path(test_path).expanduser()
        test, _ = schema.encode(read_table(test_file), f"'{test_file.name}'")
        test.groups = {k: v for k, v in test.groups.items() if k != CLIENT_GROUP}
    return DataSource(
        train=train, test=test, task=schema.task, num_classes=len(schema.classes), natural_groups=natural,
        continuous=continuous,
    )
