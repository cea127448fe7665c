"""CIFAR-10 and CIFAR-100 from the official "python version" archives.

The archives hold Python pickles of dicts (bytes keys, as written by Python 2): ``data``
is an (N, 3072) uint8 array of 32x32 images, red then green then blue planes, and the
labels a list of ints. Unpickling runs code named in the file, so only the few numpy
constructors a plain array needs are allowed: a tampered file fails instead of running.
"""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import torch

from ..arrays import ArrayDataset
from ..download import RemoteFile, ensure_files, extract_tar
from ..errors import DataError
from ..source import DATASETS, DataSource, resolve_data_dir

URL = "https://www.cs.toronto.edu/~kriz/"
CIFAR10_ARCHIVE = RemoteFile(
    "cifar-10-python.tar.gz", URL + "cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a"
)
CIFAR100_ARCHIVE = RemoteFile(
    "cifar-100-python.tar.gz", URL + "cifar-100-python.tar.gz", "eb9058c3a382ffc7106e4002c42a8d85"
)
SHAPE = (3, 32, 32)
_ARRAY_GLOBALS = {
    ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
}


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles dicts, lists, strings, numbers and numpy arrays, and nothing else."""

    def find_class(self, module: str, name: str):
        if (module, name) not in _ARRAY_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}: not a plain array")
        return super().find_class(module, name)


def read_pickle(path: Path) -> dict:
    """The dict pickled in ``path``, keys decoded to ``str``; a :class:`DataError` if the
    file is missing, corrupt, or holds anything but plain data."""
    try:
        with open(path, "rb") as f:
            obj = _ArrayUnpickler(f, encoding="bytes").load()
    except FileNotFoundError:
        raise DataError(
            f"{path.name} is missing from {path.parent}; extract the complete official "
            "archive there (or delete the folder to have it downloaded again)"
        ) from None
    except Exception as err:  # unpickling can fail in many ways; all mean a bad file
        raise DataError(
            f"cannot read {path.name} ({path}): {err}; the file is corrupt or not a CIFAR "
            "batch, replace it with the one from the official archive"
        ) from err
    if not isinstance(obj, dict):
        raise DataError(f"{path.name} ({path}) holds a {type(obj).__name__}, expected a dict")
    return {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in obj.items()}


def _field(batch: dict, key: str, path: Path):
    if key not in batch:
        raise DataError(
            f"{path.name} ({path}) has no '{key}' entry (found: {', '.join(map(str, batch))}); "
            "is it a batch of the right CIFAR version?"
        )
    return batch[key]


def _images(batch: dict, path: Path) -> torch.Tensor:
    """``batch['data']`` as (N, 3, 32, 32) float32 in [0, 1]."""
    data = np.asarray(_field(batch, "data", path))
    width = int(np.prod(SHAPE))
    if data.ndim != 2 or data.shape[1] != width or data.dtype != np.uint8:
        raise DataError(
            f"{path.name} ({path}): 'data' is {data.dtype} of shape {data.shape}, expected "
            f"uint8 of shape (N, {width}) (N images of 3x32x32)"
        )
    return torch.from_numpy(data.reshape(-1, *SHAPE).astype(np.float32) / 255.0)


def _labels(batch: dict, key: str, n: int, num_classes: int, path: Path) -> torch.Tensor:
    """``batch[key]`` as (n,) int64, each in 0..num_classes-1."""
    labels = np.asarray(_field(batch, key, path))
    if labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(
            f"{path.name} ({path}): '{key}' has shape {labels.shape} ({labels.dtype}), "
            f"expected {n} integer labels, one per image"
        )
    if n and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataError(
            f"{path.name} ({path}): '{key}' has values {labels.min()}..{labels.max()}, "
            f"expected 0..{num_classes - 1}"
        )
    return torch.from_numpy(labels.astype(np.int64))


def _label_names(path: Path, *keys: str) -> list[list[str]]:
    """The class-name lists ``keys`` of the meta file ``path``."""
    meta = read_pickle(path)
    return [
        [n.decode("utf-8") if isinstance(n, bytes) else str(n) for n in _field(meta, key, path)]
        for key in keys
    ]


def _folder(
    name: str, root: str | os.PathLike | None, download: bool,
    archive: RemoteFile, folder: str, probe: str,
) -> Path:
    """The extracted folder: ``root`` itself if it holds ``probe``, else ``root/folder``,
    fetching and extracting ``archive`` first when neither is there."""
    data_dir = resolve_data_dir(name, root)
    if (data_dir / probe).is_file():
        return data_dir
    if not (data_dir / folder).is_dir():
        ensure_files(
            name, data_dir, [archive], download,
            note=f"The extracted folder {folder}/ is accepted too, in {data_dir} or as root",
        )
        extract_tar(data_dir / archive.name, data_dir)
    return data_dir / folder


@DATASETS.register("cifar10", "CIFAR-10 colour images, 32x32, 10 classes (python pickles)")
def load_cifar10(root: str | os.PathLike | None = None, *, download: bool = True) -> DataSource:
    """CIFAR-10 train (data_batch_1..5, 50k) and test (test_batch, 10k) splits."""
    folder = _folder(
        "cifar10", root, download, CIFAR10_ARCHIVE, "cifar-10-batches-py", "data_batch_1"
    )
    [classes] = _label_names(folder / "batches.meta", "label_names")

    def split(files: list[str]) -> ArrayDataset:
        xs, ys = [], []
        for file in files:
            batch = read_pickle(folder / file)
            xs.append(_images(batch, folder / file))
            ys.append(_labels(batch, "labels", len(xs[-1]), 10, folder / file))
        return ArrayDataset(torch.cat(xs), torch.cat(ys), info={"classes": list(classes)})

    train = split([f"data_batch_{i}" for i in range(1, 6)])
    return DataSource(train, split(["test_batch"]), "classification", 10)


@DATASETS.register("cifar100", "CIFAR-100 colour images, 32x32, 100 classes in 20 superclasses")
def load_cifar100(root: str | os.PathLike | None = None, *, download: bool = True) -> DataSource:
    """CIFAR-100 train (50k) and test (10k): y the 100 fine labels, ``groups["coarse"]``
    the 20 superclass labels; names in ``info["classes"]`` and ``info["coarse_classes"]``."""
    folder = _folder("cifar100", root, download, CIFAR100_ARCHIVE, "cifar-100-python", "train")
    fine_names, coarse_names = _label_names(
        folder / "meta", "fine_label_names", "coarse_label_names"
    )

    def split(file: str) -> ArrayDataset:
        path = folder / file
        batch = read_pickle(path)
        x = _images(batch, path)
        fine = _labels(batch, "fine_labels", len(x), 100, path)
        coarse = _labels(batch, "coarse_labels", len(x), 20, path)
        info = {"classes": list(fine_names), "coarse_classes": list(coarse_names)}
        return ArrayDataset(x, fine, {"coarse": coarse}, info)

    return DataSource(split("train"), split("test"), "classification", 100)
