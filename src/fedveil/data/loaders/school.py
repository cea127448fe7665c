"""The ILEA "School" multi-task regression benchmark: exam scores of 15,362 students in
139 London schools, each school a natural silo (as in the MR-MTL cross-silo FL paper).

``school.mat`` (MATLAB v5) holds cell arrays ``X`` (1x139, school k an n_k x 28 matrix of
student features, one of them a constant) and ``Y`` (1x139, n_k x 1 exam scores).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import scipy.io
import torch

from ..arrays import ArrayDataset
from ..download import RemoteFile, ensure_files
from ..errors import DataError
from ..source import DATASETS, DataSource, resolve_data_dir

NUM_FEATURES = 28
SCORE_MIN, SCORE_MAX = 1.0, 70.0  # exam scores range over 1..70
# The copy in the MIT-licensed code of Liu et al. 2022 (MR-MTL); no checksum is published
# for it, so it is not checked.
FILE = RemoteFile(
    "school.mat",
    "https://raw.githubusercontent.com/kenziyuliu/private-cross-silo-fl/HEAD/data/school/school.mat",
    None,
)


def _cells(mat: dict, key: str, path: Path) -> list[np.ndarray]:
    """The matrices of cell array ``key`` (any 1 x K or K x 1 shape), in order."""
    if key not in mat:
        found = ", ".join(k for k in mat if not k.startswith("__")) or "nothing"
        raise DataError(
            f"{path.name} ({path}) has no variable '{key}' (found: {found}); "
            "expected cell arrays X and Y as in the School benchmark file"
        )
    cells = mat[key]
    if cells.dtype != object:
        raise DataError(
            f"{path.name} ({path}): '{key}' is a {cells.dtype} matrix, expected a cell array "
            "with one matrix per school"
        )
    return [np.asarray(c) for c in cells.ravel()]


@DATASETS.register("school", "ILEA School exam scores, 139 schools as natural silos (regression)")
def load_school(
    root: str | os.PathLike | None = None, *, download: bool = True, normalize_target: bool = False,
    scale_features: bool = False, standardize_features: bool = False,
) -> DataSource:
    """All students as one train split: x (N, 28) float32, y (N,) float32 exam scores,
    ``groups["school"]`` the school index 0..138 (int64), the natural client id.

    ``normalize_target`` maps the scores 1..70 to (y - 1) / 69 in [0, 1], the scale on
    which MR-MTL reports test MSE (spec 002 §5, [C1] ``read_school_data``).
    ``scale_features`` divides every column by its largest absolute value, so that the two
    integer-valued columns (up to 91 and 43; the others are 0/1) are on the same [0, 1]
    scale. Without it, isotropic DP-SGD noise on those weights is multiplied by ~90 in
    every prediction and small silos' private models are useless.
    ``standardize_features`` declares all 28 columns continuous, so that ``data.standardize``
    standardises them; with ``data.standardize = "per_client"`` that is the reference code's
    per-silo StandardScaler fitted on the silo's training rows ([C1], reference_code_notes
    §4.6; the constant last column becomes 0, the model's bias takes its place)."""
    path = ensure_files("school", resolve_data_dir("school", root), [FILE], download) / FILE.name
    try:
        mat = scipy.io.loadmat(path)
    except Exception as err:  # scipy raises many types for a bad file; all mean the same
        raise DataError(
            f"cannot read {path.name} ({path}) as a MATLAB file: {err}; "
            "replace it with the original school.mat"
        ) from err
    xs, ys = _cells(mat, "X", path), _cells(mat, "Y", path)
    if not xs:
        raise DataError(f"{path.name} ({path}): X holds no schools; replace the file")
    if len(xs) != len(ys):
        raise DataError(f"{path.name}: X has {len(xs)} schools but Y has {len(ys)}")
    for k, (x, y) in enumerate(zip(xs, ys)):
        if x.ndim != 2 or x.shape[1] != NUM_FEATURES:
            raise DataError(
                f"{path.name}: X{{{k + 1}}} has shape {x.shape}, expected (students, "
                f"{NUM_FEATURES})"
            )
        if y.size != len(x):
            raise DataError(
                f"{path.name}: school {k + 1} has {len(x)} rows in X but {y.size} scores in Y"
            )
    school = np.repeat(np.arange(len(xs)), [len(x) for x in xs])
    scores = np.concatenate([y.ravel() for y in ys]).astype(np.float64)
    if normalize_target:
        scores = (scores - SCORE_MIN) / (SCORE_MAX - SCORE_MIN)
    features = np.concatenate(xs).astype(np.float64)
    if scale_features:
        features = features / np.maximum(np.abs(features).max(axis=0), 1e-12)
    train = ArrayDataset(
        torch.from_numpy(features.astype(np.float32)),
        torch.from_numpy(scores.astype(np.float32)),
        {"school": torch.from_numpy(school.astype(np.int64))},
        {"num_schools": len(xs)},
    )
    continuous = tuple(range(NUM_FEATURES)) if standardize_features else ()
    return DataSource(train, None, "regression", 0, natural_groups="school", continuous=continuous)
