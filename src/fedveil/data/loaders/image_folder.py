"""Your own images: a folder with one subfolder per class (``[data] name = "image_folder"``;
docs/your-model-and-data.md).

``path/<class>/<image>`` (PNG, JPEG, BMP, GIF: anything Pillow opens), classes in name
order; with ``client_folders = true`` one more level first, ``path/<client>/<class>/``,
each client folder a natural client (the group ``client``; partition with
``{ name = "natural", key = "client" }``). Options: ``size`` ([height, width]: every image
resized to it; without it all images must share one size), ``grayscale`` (one channel;
default three), ``normalize`` (``"none"``: pixels in [0, 1]; ``"per_channel"``: each channel
standardised by the mean and standard deviation of the training images, preprocessing
that epsilon does not cover, like ``data.standardize = "pooled"`` for tables),
``test_path`` (a held-out folder of the same layout, without client folders).
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import torch

from ..arrays import ArrayDataset
from ..errors import DataError
from ..source import DATASETS, DataSource

SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")
CLIENT_GROUP = "client"


def _subfolders(path: Path, what: str) -> list[Path]:
    folders = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise DataError(f"'{path}' has no {what} subfolder (layout: path/<class>/<image>)")
    return folders


def _read_image(file: Path, size: tuple[int, int] | None, grayscale: bool) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(file) as image:
            image = image.convert("L" if grayscale else "RGB")
            if size is not None:
                image = image.resize((size[1], size[0]), Image.BILINEAR)
            pixels = np.asarray(image, dtype=np.float32) / 255.0
    except (UnidentifiedImageError, OSError) as err:
        raise DataError(f"'{file}' is not an image Pillow can read ({type(err).__name__})") from None
    return pixels[None] if grayscale else pixels.transpose(2, 0, 1)


def _read_classes(folder: Path, classes: list[str] | None, size, grayscale: bool) -> tuple[list[np.ndarray], list[int], list[str]]:
    found = [p.name for p in _subfolders(folder, "class")]
    names = found if classes is None else classes
    unknown = sorted(set(found) - set(names))
    if unknown:
        raise DataError(f"'{folder}': class folder '{unknown[0]}' is not one of the training classes {', '.join(names)}")
    images, labels = [], []
    for label, name in enumerate(names):
        files = sorted(p for p in (folder / name).iterdir() if p.suffix.lower() in SUFFIXES) if (folder / name).is_dir() else []
        for file in files:
            images.append(_read_image(file, size, grayscale))
            labels.append(label)
    if not images:
        raise DataError(f"'{folder}' holds no image files ({', '.join(SUFFIXES)})")
    return images, labels, names


def _stack(images: list[np.ndarray], where: Path) -> torch.Tensor:
    shapes = {im.shape for im in images}
    if len(shapes) > 1:
        raise DataError(f"'{where}': images of {len(shapes)} different sizes ({sorted(shapes)[:3]}...); set data.options.size = [height, width]")
    return torch.from_numpy(np.stack(images))


@DATASETS.register("image_folder", "your own images: one subfolder per class (optionally per client first)")
def load_image_folder(
    root: str | os.PathLike | None = None,
    *,
    download: bool = True,
    path: str | None = None,
    size: list[int] | None = None,
    grayscale: bool = False,
    normalize: str = "none",
    client_folders: bool = False,
    test_path: str | None = None,
) -> DataSource:
    """Read the folder(s) (module docstring); ``download`` is accepted and unused."""
    if path is None:
        raise DataError("data.options.path: give the folder of class subfolders")
    if normalize not in ("none", "per_channel"):
        raise DataError(f"data.options.normalize: '{normalize}' is not none or per_channel")
    if size is not None and (len(size) != 2 or not all(isinstance(d, int) and d > 0 for d in size)):
        raise DataError(f"data.options.size: {size!r} is not [height, width] in pixels")
    shape = None if size is None else (int(size[0]), int(size[1]))
    base = Path(root).expanduser() if root is not None else Path.cwd()
    folder = base / Path(path).expanduser()
    if not folder.is_dir():
        raise DataError(f"image folder '{folder}' does not exist")
    groups = {}
    if client_folders:
        clients = _subfolders(folder, "client")
        classes = sorted({p.name for c in clients for p in _subfolders(c, "class")})
        images, labels, sizes = [], [], []
        for client in clients:
            im, lab, _ = _read_classes(client, classes, shape, grayscale)
            images += im
            labels += lab
            sizes.append(len(im))
        groups[CLIENT_GROUP] = torch.from_numpy(np.repeat(np.arange(len(clients)), sizes))
    else:
        images, labels, classes = _read_classes(folder, None, shape, grayscale)
    x = _stack(images, folder)
    info = {"classes": list(classes), "group_categories": {CLIENT_GROUP: [c.name for c in clients]} if client_folders else {}}
    train = ArrayDataset(x, torch.tensor(labels, dtype=torch.int64), groups, info)
    test = None
    if test_path is not None:
        test_folder = base / Path(test_path).expanduser()
        images, labels, _ = _read_classes(test_folder, list(classes), shape, grayscale)
        test = ArrayDataset(_stack(images, test_folder), torch.tensor(labels, dtype=torch.int64))
        if test.x.shape[1:] != train.x.shape[1:]:
            raise DataError(f"'{test_folder}': images of shape {tuple(test.x.shape[1:])}, the training images' are {tuple(train.x.shape[1:])}")
    if normalize == "per_channel":
        dims = (0, 2, 3)
        mean, std = train.x.mean(dim=dims, keepdim=True), train.x.std(dim=dims, keepdim=True).clamp_min(1e-6)
        train = dataclasses.replace(train, x=(train.x - mean) / std)
        if test is not None:
            test = dataclasses.replace(test, x=(test.x - mean) / std)
    return DataSource(train=train, test=test, task="classification", num_classes=len(classes),
                      natural_groups=CLIENT_GROUP if client_folders else None)
