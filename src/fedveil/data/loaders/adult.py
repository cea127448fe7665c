"""UCI Adult (Census Income): predict whether income exceeds $50K from 14 census attributes.

Reads the original ``adult.data`` and ``adult.test`` files. Rows with a missing value
("?") are dropped; the 8 categorical attributes are one-hot encoded with the categories
of the train file, so the test split is encoded exactly as the model saw the train
split. The 6 continuous ones are left raw and declared in ``DataSource.continuous``: the
builder standardises them as ``data.standardize`` says. The default, ``pooled``, uses
the statistics of the whole train file, i.e. preprocessing on all silos' records that
the privacy ledger does not account for; ``per_client`` standardises every client with
its own training rows instead (:mod:`fedveil.data.standardise`). ``sex`` and ``race``
stay available as groups for fairness metrics even when ``drop_sensitive`` removes them
from x.

Every categorical attribute is also a group of category codes, so the ``natural``
partitioner can cut Adult into silos by an attribute (one client per race, workclass,
region of birth...): ``[data.partition] name = "natural"``, ``key = "race_code"``.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from ..arrays import ArrayDataset
from ..download import RemoteFile, ensure_files
from ..errors import DataError
from ..source import DATASETS, DataSource, resolve_data_dir

URL = "https://archive.ics.uci.edu/ml/machine-learning-databases/adult/"
FILES = [
    RemoteFile("adult.data", URL + "adult.data", "5d7c39d7b8804f071cdd1f2a7c460872"),
    RemoteFile("adult.test", URL + "adult.test", "35238206dfdf7f1fe215bbb874adecdc"),
]
COLUMNS = (
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status",
    "occupation", "relationship", "race", "sex", "capital-gain", "capital-loss",
    "hours-per-week", "native-country",
)
CONTINUOUS = ("age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week")
CATEGORICAL = tuple(c for c in COLUMNS if c not in CONTINUOUS)
SENSITIVE = ("race", "sex")
CLASS_NAMES = ("<=50K", ">50K")
# native-country grouped into world regions; "Other" holds Canada, the US outlying
# territories and any country missing from this list.
REGIONS = {
    "United-States": ("United-States",),
    "Latin-America": (
        "Mexico", "Puerto-Rico", "Cuba", "Jamaica", "Dominican-Republic", "Haiti", "Trinadad&Tobago",
        "Honduras", "Guatemala", "Nicaragua", "El-Salvador", "Columbia", "Ecuador", "Peru",
    ),
    "Europe": (
        "England", "Scotland", "Ireland", "Germany", "France", "Holand-Netherlands", "Italy",
        "Portugal", "Greece", "Poland", "Hungary", "Yugoslavia",
    ),
    "Asia": (  # "South" is South Korea, "Hong" Hong Kong
        "Cambodia", "India", "Japan", "South", "China", "Iran", "Philippines", "Vietnam", "Laos",
        "Taiwan", "Thailand", "Hong",
    ),
    "Other": (),
}
REGION_OF = {country: region for region, countries in REGIONS.items() for country in countries}


def one_hot(values: list[str], categories: list[str]) -> np.ndarray:
    """(n, len(categories)) 0/1 matrix; a value outside ``categories`` gives an all-zero row."""
    index = {c: j for j, c in enumerate(categories)}
    out = np.zeros((len(values), len(categories)), dtype=np.float32)
    for i, v in enumerate(values):
        if v in index:
            out[i, index[v]] = 1.0
    return out


def category_codes(values: list[str], categories: list[str]) -> torch.Tensor:
    """int64 index of each value in ``categories``; -1 for a value outside them (a test
    category the train file lacks)."""
    index = {c: j for j, c in enumerate(categories)}
    return torch.tensor([index.get(v, -1) for v in values], dtype=torch.int64)


def silo_groups(
    categorical: dict[str, list[str]], categories: dict[str, list[str]]
) -> tuple[dict[str, torch.Tensor], dict[str, list[str]]]:
    """Natural silo keys: ``<column>_code`` for every categorical column (codes index the
    sorted train categories) and ``region_code`` (native-country grouped by ``REGIONS``),
    with the category names of each key."""
    names = {f"{c}_code": categories[c] for c in CATEGORICAL}
    names["region_code"] = list(REGIONS)
    groups = {f"{c}_code": category_codes(categorical[c], categories[c]) for c in CATEGORICAL}
    regions = [REGION_OF.get(country, "Other") for country in categorical["native-country"]]
    groups["region_code"] = category_codes(regions, names["region_code"])
    return groups, names


def _read(path: Path) -> tuple[dict[str, list[str]], np.ndarray, np.ndarray]:
    """Complete rows of one Adult file: categorical columns, continuous matrix, labels."""
    categorical: dict[str, list[str]] = {c: [] for c in CATEGORICAL}
    continuous: list[list[float]] = []
    labels: list[int] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, start=1):
            line = line.strip()
            if not line or line.startswith("|"):  # blank line or adult.test's comment line
                continue
            fields = [v.strip() for v in line.split(",")]
            if len(fields) != len(COLUMNS) + 1:
                raise DataError(
                    f"{path}, line {n}: expected {len(COLUMNS) + 1} comma-separated fields "
                    f"(14 attributes and the income label), found {len(fields)}; "
                    "replace the file with the original UCI Adult file"
                )
            if "?" in fields:
                continue
            row = dict(zip(COLUMNS, fields))
            numbers = []
            for c in CONTINUOUS:
                try:
                    numbers.append(float(row[c]))
                except ValueError:
                    raise DataError(
                        f"{path}, line {n}, column '{c}': '{row[c]}' is not a number"
                    ) from None
            label = fields[-1].rstrip(".")  # adult.test writes '>50K.'
            if label not in CLASS_NAMES:
                raise DataError(
                    f"{path}, line {n}, column 'income': expected '<=50K' or '>50K' "
                    f"(a trailing dot is allowed), found '{fields[-1]}'"
                )
            for c in categorical:
                categorical[c].append(row[c])
            continuous.append(numbers)
            labels.append(CLASS_NAMES.index(label))
    if not labels:
        raise DataError(f"{path} has no complete rows; is it the UCI Adult file?")
    return categorical, np.array(continuous, dtype=np.float64), np.array(labels, dtype=np.int64)


def _encode(
    path: Path, categories: dict[str, list[str]] | None, drop_sensitive: bool
) -> tuple[ArrayDataset, dict[str, list[str]]]:
    """Encode one file, continuous columns raw; ``categories`` are fitted here when ``None``
    (train)."""
    categorical, continuous, y = _read(path)
    if categories is None:
        categories = {c: sorted(set(v)) for c, v in categorical.items()}
    blocks, names = [], []
    for c in COLUMNS:
        if c in CONTINUOUS:
            blocks.append(continuous[:, [CONTINUOUS.index(c)]].astype(np.float32))
            names.append(c)
        elif not (drop_sensitive and c in SENSITIVE):
            blocks.append(one_hot(categorical[c], categories[c]))
            names.extend(f"{c}={v}" for v in categories[c])
    codes, group_categories = silo_groups(categorical, categories)
    groups = {
        "sex": torch.tensor([v == "Male" for v in categorical["sex"]], dtype=torch.int64),
        "race": torch.tensor([v == "White" for v in categorical["race"]], dtype=torch.int64),
        **codes,
    }
    info = {"feature_names": names, "classes": list(CLASS_NAMES), "group_categories": group_categories}
    data = ArrayDataset(torch.from_numpy(np.hstack(blocks)), torch.from_numpy(y), groups, info)
    return data, categories


@DATASETS.register("adult", "UCI Adult census income (>50K), sensitive groups sex and race")
def load_adult(
    root: str | os.PathLike | None = None,
    *,
    download: bool = True,
    drop_sensitive: bool = False,
    natural_groups: str | None = None,
) -> DataSource:
    """Adult train (``adult.data``) and test (``adult.test``) splits, encoded as above,
    the 6 continuous columns raw (``DataSource.continuous``; see the module docstring).

    ``groups["sex"]`` is 1 for Male, ``groups["race"]`` 1 for White; ``drop_sensitive``
    removes the sex and race one-hot columns from ``x`` (the groups stay). The silo keys
    of :func:`silo_groups` (``race_code``: 5 races, ``workclass_code``, ``education_code``,
    ``marital-status_code``, ``occupation_code``, ``relationship_code``, ``sex_code``,
    ``native-country_code``, ``region_code``) are groups too, their category names in
    ``info["group_categories"]``. ``natural_groups`` declares one of them the natural
    client id of the source; the ``natural`` partitioner's ``key`` picks the split.
    """
    data_dir = ensure_files("adult", resolve_data_dir("adult", root), FILES, download)
    train, categories = _encode(data_dir / "adult.data", None, drop_sensitive)
    silo_keys = list(train.info["group_categories"])
    if natural_groups is not None and natural_groups not in silo_keys:
        raise DataError(
            f"adult: natural_groups='{natural_groups}' is not a silo key; choose one of "
            + ", ".join(silo_keys)
        )
    test, _ = _encode(data_dir / "adult.test", categories, drop_sensitive)
    names = train.info["feature_names"]
    return DataSource(
        train=train, test=test, task="classification", num_classes=2, natural_groups=natural_groups,
        continuous=tuple(names.index(c) for c in CONTINUOUS),
    )
