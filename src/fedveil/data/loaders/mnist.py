"""MNIST and Fashion-MNIST from their original IDX files (gzipped or not).

A data directory holds either the four official files (train + t10k test split) or one
``images-idx3-ubyte`` / ``labels-idx1-ubyte`` pair, e.g. a subset, which becomes the
train split alone. Every file is checked against the IDX format (magic number, dims,
exact length) so a truncated or mislabelled file fails loudly instead of training on junk.
"""
from __future__ import annotations

import gzip
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import torch

from ..arrays import ArrayDataset
from ..download import RemoteFile, ensure_files
from ..errors import DataError
from ..source import DATASETS, DataSource, resolve_data_dir

IDX_UBYTE = 0x08
SIDE = 28
NUM_CLASSES = 10
SPLITS = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
SUBSET = ("images-idx3-ubyte", "labels-idx1-ubyte")

# The mirror torchvision uses (yann.lecun.com often refuses downloads); md5s as published.
MNIST_URL = "https://ossci-datasets.s3.amazonaws.com/mnist/"
MNIST_MD5 = {
    "train-images-idx3-ubyte": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte": "ec29112dd5afa0611ce80d1b7f02629c",
}
MNIST_CLASSES = [str(d) for d in range(NUM_CLASSES)]

FASHION_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
FASHION_MD5 = {
    "train-images-idx3-ubyte": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte": "bb300cfdad3c16e7a12a480ee83cd310",
}
FASHION_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]


def _read_bytes(path: Path) -> bytes:
    """The file's content, gunzipped when it starts with the gzip magic bytes."""
    try:
        raw = path.read_bytes()
        return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    except (OSError, EOFError, zlib.error) as err:
        raise DataError(
            f"cannot read {path}: {err}; the file is corrupt or truncated, "
            "replace it with the original"
        ) from err


def read_idx(path: str | os.PathLike, ndim: int | None = None) -> np.ndarray:
    """The unsigned-byte array stored in IDX file ``path`` (plain or .gz).

    Checks the magic number (0x0000 08 <ndim>; 0x00000803 for images, 0x00000801 for
    labels), that the dimension count is ``ndim`` when given, and that the payload is
    exactly the product of the dims in bytes; any mismatch is a :class:`DataError`.
    """
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] != IDX_UBYTE:
        found = f"magic number 0x{data[:4].hex()}" if len(data) >= 4 else f"{len(data)} bytes"
        raise DataError(
            f"{path.name} ({path}) is not an IDX file of unsigned bytes: found {found}, "
            "expected magic number 0x00000803 (images) or 0x00000801 (labels); "
            "replace it with the original file"
        )
    dims_found = data[3]
    if ndim is not None and dims_found != ndim:
        raise DataError(
            f"{path.name} ({path}) has magic number 0x{data[:4].hex()} ({dims_found} dims), "
            f"expected 0x{0x800 + ndim:08x} ({ndim} dims); are the image and label files "
            "swapped or renamed?"
        )
    header = 4 + 4 * dims_found
    if len(data) < header:
        raise DataError(f"{path.name} ({path}) is truncated inside its header; replace it")
    dims = struct.unpack(f">{dims_found}I", data[4:header])
    expected = int(np.prod(dims, dtype=np.int64))
    if len(data) - header != expected:
        raise DataError(
            f"{path.name} ({path}) declares dims {dims} = {expected} bytes of data but holds "
            f"{len(data) - header}; the file is truncated or corrupt, replace it"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


def _read_split(images_path: Path, labels_path: Path, classes: list[str]) -> ArrayDataset:
    """One split as x (N, 1, 28, 28) float32 in [0, 1] and y (N,) int64."""
    images = read_idx(images_path, ndim=3)
    labels = read_idx(labels_path, ndim=1)
    if images.shape[1:] != (SIDE, SIDE):
        raise DataError(
            f"{images_path.name} ({images_path}) holds {images.shape[1]}x{images.shape[2]} "
            f"images, expected {SIDE}x{SIDE}"
        )
    if len(images) != len(labels):
        raise DataError(
            f"{images_path.name} has {len(images)} images but {labels_path.name} has "
            f"{len(labels)} labels; the two files must come from the same split"
        )
    if labels.size and labels.max() >= NUM_CLASSES:
        raise DataError(
            f"{labels_path.name} ({labels_path}) has label {labels.max()}, expected 0..9"
        )
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    y = torch.from_numpy(labels.astype(np.int64))
    return ArrayDataset(x, y, info={"classes": list(classes)})


def _find(data_dir: Path, stem: str) -> Path | None:
    """``stem.gz`` or ``stem`` in ``data_dir``, whichever exists (gzipped first)."""
    for path in (data_dir / f"{stem}.gz", data_dir / stem):
        if path.is_file():
            return path
    return None


def _official(data_dir: Path) -> dict[str, list[Path]] | None:
    """The official four files by split, or ``None`` unless all four are there."""
    paths = {split: [_find(data_dir, s) for s in stems] for split, stems in SPLITS.items()}
    return paths if all(p for pair in paths.values() for p in pair) else None


def _load(
    name: str, root: str | os.PathLike | None, download: bool,
    url: str, md5: dict[str, str], classes: list[str],
) -> DataSource:
    data_dir = resolve_data_dir(name, root)
    official = _official(data_dir)
    subset = [_find(data_dir, s) for s in SUBSET]
    if official is None and all(subset):
        return DataSource(_read_split(*subset, classes), None, "classification", NUM_CLASSES)
    if official is None:
        files = [RemoteFile(f"{s}.gz", f"{url}{s}.gz", md5[s]) for s in md5]
        ensure_files(
            name, data_dir, files, download,
            note="A pair images-idx3-ubyte.gz + labels-idx1-ubyte.gz (a train-only subset) "
            "is accepted too, as are the same files uncompressed",
        )
        official = _official(data_dir)
    return DataSource(
        train=_read_split(*official["train"], classes),
        test=_read_split(*official["test"], classes),
        task="classification",
        num_classes=NUM_CLASSES,
    )


@DATASETS.register("mnist", "MNIST handwritten digits, 28x28 grey, 10 classes (IDX files)")
def load_mnist(root: str | os.PathLike | None = None, *, download: bool = True) -> DataSource:
    """MNIST train (60k) and test (10k) splits, or a train-only subset pair (see module)."""
    return _load("mnist", root, download, MNIST_URL, MNIST_MD5, MNIST_CLASSES)


@DATASETS.register("fashion_mnist", "Fashion-MNIST clothing images, 28x28 grey, 10 classes")
def load_fashion_mnist(
    root: str | os.PathLike | None = None, *, download: bool = True
) -> DataSource:
    """Fashion-MNIST train (60k) and test (10k) splits, in the same IDX layout as MNIST."""
    return _load("fashion_mnist", root, download, FASHION_URL, FASHION_MD5, FASHION_CLASSES)
