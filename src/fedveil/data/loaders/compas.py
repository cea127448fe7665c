"""ProPublica COMPAS: predict two-year recidivism; the standard fairness benchmark on race.

Reads ProPublica's ``compas-scores-two-years.csv`` and applies the filters of their
analysis (charge within 30 days of the screening, a known recidivism outcome, no
ordinary traffic offences, a valid score), which leaves 6,172 of the 7,214 rows.
Categories are one-hot encoded in sorted order; ``sex`` and ``race`` stay available as
groups even when ``drop_sensitive`` removes them from x. Age and the four counts are left
raw and declared in ``DataSource.continuous``: the builder standardises them as
``data.standardize`` says. The default, ``pooled``, uses the statistics of all rows, i.e.
preprocessing on all silos' records that the privacy ledger does not account for;
``per_client`` standardises every client with its own training rows instead
(:mod:`fedveil.data.standardise`).
"""
from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np
import torch

from ..arrays import ArrayDataset
from ..download import RemoteFile, ensure_files
from ..errors import DataError
from ..source import DATASETS, DataSource, resolve_data_dir
from .adult import one_hot

FILE = RemoteFile(
    "compas-scores-two-years.csv",
    "https://raw.githubusercontent.com/propublica/compas-analysis/master/compas-scores-two-years.csv",
    "9165d40c400bba93a8cffece2b74622b",
)
NUMERIC = ("age", "priors_count", "juv_fel_count", "juv_misd_count", "juv_other_count")
CATEGORICAL = ("c_charge_degree", "age_cat", "sex", "race")
FILTER = ("days_b_screening_arrest", "is_recid", "score_text")
TARGET = "two_year_recid"
REQUIRED = NUMERIC + CATEGORICAL + FILTER + (TARGET,)
CLASS_NAMES = ("no recidivism in two years", "recidivism in two years")
Rows = list[tuple[int, dict[str, str]]]  # (line number, required fields) of each kept row


def _number(path: Path, line: int, column: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise DataError(
            f"{path}, line {line}, column '{column}': '{text}' is not a number"
        ) from None


def _keep(path: Path, line: int, row: dict[str, str]) -> bool:
    """ProPublica's row filter; a blank ``days_b_screening_arrest`` fails it, as in their R code."""
    days = row["days_b_screening_arrest"]
    if days == "" or not -30 <= _number(path, line, "days_b_screening_arrest", days) <= 30:
        return False
    return (
        _number(path, line, "is_recid", row["is_recid"]) != -1
        and row["c_charge_degree"] != "O"
        and row["score_text"] != "N/A"
    )


def _read(path: Path) -> Rows:
    """(line number, required fields) of every row that passes the filter."""
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise DataError(f"{path} is empty; download compas-scores-two-years.csv again")
        position: dict[str, int] = {}
        for j, name in enumerate(header):
            position.setdefault(name, j)  # the file repeats some columns; use the first
        missing = [c for c in REQUIRED if c not in position]
        if missing:
            raise DataError(
                f"{path}, line 1: header lacks column(s) {', '.join(missing)}; "
                "use ProPublica's original compas-scores-two-years.csv"
            )
        rows = []
        for fields in reader:
            line = reader.line_num
            if not fields:
                continue
            if len(fields) != len(header):
                raise DataError(
                    f"{path}, line {line}: expected {len(header)} fields like the header, "
                    f"found {len(fields)}"
                )
            row = {c: fields[position[c]].strip() for c in REQUIRED}
            if _keep(path, line, row):
                rows.append((line, row))
    if not rows:
        raise DataError(f"{path}: no row passes ProPublica's filters; is it the COMPAS file?")
    return rows


def _encode_column(rows: Rows, column: str) -> tuple[np.ndarray, list[str]]:
    """``sex`` as one 0/1 column (1 = Male); any other column one-hot in sorted order."""
    values = [r[column] for _, r in rows]
    if column == "sex":
        return np.array([[v == "Male"] for v in values], dtype=np.float32), ["sex=Male"]
    categories = sorted(set(values))
    return one_hot(values, categories), [f"{column}={v}" for v in categories]


@DATASETS.register("compas", "ProPublica COMPAS two-year recidivism, sensitive groups race and sex")
def load_compas(
    root: str | os.PathLike | None = None, *, download: bool = True, drop_sensitive: bool = False
) -> DataSource:
    """COMPAS rows after ProPublica's filters; train only (the source has no test split).

    x: age, priors_count and the three juvenile counts (raw, ``DataSource.continuous``),
    then one-hot c_charge_degree and age_cat, ``sex=Male`` (0/1) and one-hot race; the
    last two are left out with ``drop_sensitive``. y = two_year_recid. ``groups["race"]``
    is 1 for African-American, ``groups["sex"]`` 1 for Male.
    """
    data_dir = ensure_files("compas", resolve_data_dir("compas", root), [FILE], download)
    path = data_dir / FILE.name
    rows = _read(path)
    numbers = np.array([[_number(path, n, c, r[c]) for c in NUMERIC] for n, r in rows])
    blocks, names = [numbers.astype(np.float32)], list(NUMERIC)
    for column in ("c_charge_degree", "age_cat") + (() if drop_sensitive else ("sex", "race")):
        block, block_names = _encode_column(rows, column)
        blocks.append(block)
        names.extend(block_names)
    y = []
    for n, r in rows:
        if r[TARGET] not in ("0", "1"):
            raise DataError(
                f"{path}, line {n}, column '{TARGET}': expected 0 or 1, found '{r[TARGET]}'"
            )
        y.append(int(r[TARGET]))
    groups = {
        "race": torch.tensor([r["race"] == "African-American" for _, r in rows], dtype=torch.int64),
        "sex": torch.tensor([r["sex"] == "Male" for _, r in rows], dtype=torch.int64),
    }
    info = {"feature_names": names, "classes": list(CLASS_NAMES)}
    train = ArrayDataset(
        torch.from_numpy(np.hstack(blocks)), torch.tensor(y, dtype=torch.int64), groups, info
    )
    return DataSource(
        train=train, test=None, task="classification", num_classes=2,
        continuous=tuple(range(len(NUMERIC))),
    )
