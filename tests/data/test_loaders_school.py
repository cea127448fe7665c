"""School loader on tiny MATLAB v5 files with the benchmark's cell-array layout."""
from __future__ import annotations

import os

import numpy as np
import pytest
import scipy.io
import torch

from fedveil.data import DATASETS, DataError
from fedveil.data.loaders import school
from fedveil.data.loaders.school import load_school

SIZES = (3, 1, 2)


def cells(matrices) -> np.ndarray:
    """A 1 x K object array: what savemat writes as a MATLAB cell array."""
    out = np.empty((1, len(matrices)), dtype=object)
    for k, m in enumerate(matrices):
        out[0, k] = m
    return out


def school_data(sizes=SIZES, features=28):
    rng = np.random.default_rng(0)
    xs = [rng.integers(0, 50, (n, features)).astype(np.uint8) for n in sizes]
    ys = [rng.integers(1, 71, (n, 1)).astype(np.uint8) for n in sizes]
    return xs, ys


def write_mat(directory, **variables):
    directory.mkdir(parents=True, exist_ok=True)
    scipy.io.savemat(directory / "school.mat", {k: cells(v) for k, v in variables.items()})
    return directory


def test_school_rows_targets_and_groups(tmp_path):
    xs, ys = school_data()
    source = load_school(write_mat(tmp_path, X=xs, Y=ys), download=False)
    train = source.train
    assert train.x.dtype == torch.float32 and train.x.shape == (6, 28)
    assert torch.equal(train.x, torch.from_numpy(np.concatenate(xs).astype(np.float32)))
    assert train.y.dtype == torch.float32 and train.y.shape == (6,)
    assert train.y.tolist() == [float(v) for y in ys for v in y.ravel()]
    assert train.groups["school"].dtype == torch.int64
    assert train.groups["school"].tolist() == [0, 0, 0, 1, 2, 2]
    assert (source.task, source.num_classes, source.natural_groups) == ("regression", 0, "school")
    assert source.test is None


def test_school_registered():
    assert DATASETS.get("school") is load_school


@pytest.mark.parametrize(
    "variables, match",
    [
        ({"X": school_data()[0]}, "no variable 'Y'"),
        ({"X": school_data()[0], "Y": school_data()[1][:2]}, "3 schools but Y has 2"),
        ({"X": school_data(features=27)[0], "Y": school_data()[1]}, r"\(3, 27\), expected \(students, 28\)"),
        ({"X": school_data()[0], "Y": school_data(sizes=(3, 2, 2))[1]}, "school 2 has 1 rows in X but 2"),
    ],
)
def test_school_rejects_wrong_layout(tmp_path, variables, match):
    write_mat(tmp_path, **variables)
    with pytest.raises(DataError, match=match) as err:
        load_school(tmp_path, download=False)
    assert "school.mat" in str(err.value)


def test_school_plain_matrix_is_not_cells(tmp_path):
    scipy.io.savemat(tmp_path / "school.mat", {"X": np.zeros((3, 28)), "Y": np.zeros((3, 1))})
    with pytest.raises(DataError, match="'X' is a float64 matrix, expected a cell array"):
        load_school(tmp_path, download=False)


def test_school_corrupt_file(tmp_path):
    (tmp_path / "school.mat").write_bytes(b"MATLAB 5.0 MAT-file, but then garbage" * 5)
    with pytest.raises(DataError, match="school.mat"):
        load_school(tmp_path, download=False)


def test_school_missing_directory(tmp_path):
    missing = tmp_path / "nothing"
    with pytest.raises(DataError) as err:
        load_school(missing, download=False)
    message = str(err.value)
    assert str(missing) in message and "school.mat" in message
    assert "raw.githubusercontent.com/kenziyuliu/private-cross-silo-fl" in message


def test_school_download(tmp_path, monkeypatch):
    xs, ys = school_data()
    server = write_mat(tmp_path / "server", X=xs, Y=ys)
    url = (server / "school.mat").as_uri()
    monkeypatch.setattr(school, "FILE", school.RemoteFile("school.mat", url, None))
    source = load_school(tmp_path / "cache", download=True)
    assert len(source.train) == sum(SIZES)
    assert os.listdir(tmp_path / "cache") == ["school.mat"]


def test_school_normalised_scores(tmp_path):
    xs, ys = school_data()
    ys = [np.array([[1.0], [70.0], [35.5]]), np.array([[24.0]]), np.array([[47.0], [2.0]])]
    source = load_school(write_mat(tmp_path, X=xs, Y=ys), download=False, normalize_target=True)
    want = [0.0, 1.0, 0.5, 23 / 69, 46 / 69, 1 / 69]
    np.testing.assert_allclose(source.train.y.numpy(), want, rtol=1e-6)


def test_school_scaled_features(tmp_path):
    xs, ys = school_data()
    source = load_school(write_mat(tmp_path, X=xs, Y=ys), download=False, scale_features=True)
    raw = np.concatenate(xs)
    want = raw / np.maximum(np.abs(raw).max(0), 1e-12)
    np.testing.assert_allclose(source.train.x.numpy(), want, rtol=1e-6)
    assert np.abs(source.train.x.numpy()).max() <= 1.0
