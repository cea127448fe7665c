"""A Hugging Face data set (``[data] name = "huggingface"``; ``pip install 'fedveil[hf]'``;
docs/your-model-and-data.md).

``path`` is a folder a data set was saved to (``Dataset.save_to_disk``; a ``DatasetDict``
folder has one subfolder per split), else a hub name read through the local cache, or
from the hub when a network exists (``datasets.load_dataset``). ``split`` (default
``train``) is trained on and ``test_split`` (optional) is the pooled test set. The
example is either the ``image`` column (Pillow images or nested lists of pixels, scaled
to [0, 1] from 8-bit) or the numeric ``features`` columns; ``label`` is an integer class
(a ``ClassLabel`` column keeps its names) or a number with ``task = "regression"``;
``client`` names a column with each row's client (as FEMNIST's ``writer_id`` or
Shakespeare's ``character``), for the ``natural`` partitioner. Any other fedveil
partitioner works on it as on the built-in data sets.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..arrays import ArrayDataset
from ..errors import DataError
from ..source import DATASETS, DataSource


def _datasets():
    try:
        import datasets
    except ImportError:
        raise DataError("the huggingface data set needs the datasets package: pip install 'fedveil[hf]'") from None
    return datasets


def _split(name_or_path: str, base: Path, split: str):
    datasets = _datasets()
    local = base / Path(name_or_path).expanduser()
    try:
        if local.exists():
            loaded = datasets.load_from_disk(str(local))
            if isinstance(loaded, datasets.DatasetDict):
                if split not in loaded:
                    raise DataError(f"'{local}' has splits {', '.join(loaded)}, not '{split}'")
                return loaded[split]
            return loaded
        return datasets.load_dataset(name_or_path, split=split)
    except DataError:
        raise
    except Exception as err:  # datasets raises many kinds: no network, unknown name, bad split
        raise DataError(f"data set '{name_or_path}' split '{split}': {str(err).splitlines()[0][:300]}") from None


def _column(table, name: str, role: str) -> list[Any]:
    if name not in table.column_names:
        raise DataError(f"data.options.{role}: no column '{name}'; the data set has {', '.join(table.column_names)}")
    return table[name]


def _images(values: list[Any]) -> torch.Tensor:
    arrays = []
    for value in values:
        if hasattr(value, "convert"):  # a Pillow image: grey and RGB as they are, other modes as RGB
            value = value if value.mode in ("L", "RGB") else value.convert("RGB")
        array = np.asarray(value, dtype=np.float32)
        if array.ndim == 2:
            array = array[None]
        elif array.ndim == 3 and array.shape[-1] in (1, 3, 4) and array.shape[0] not in (1, 3):
            array = array.transpose(2, 0, 1)
        arrays.append(array / 255.0)
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise DataError(f"images of {len(shapes)} different shapes: resize them before (a map over the data set)")
    return torch.from_numpy(np.stack(arrays))


def _encode(table, image: str | None, features: list[str] | None, label: str, client: str | None, task: str):
    if (image is None) == (features is None):
        raise DataError("data.options: give either image (an image column) or features (numeric columns)")
    if image is not None:
        x = _images(_column(table, image, "image"))
    else:
        cols = []
        for name in features:
            values = _column(table, name, "features")
            try:
                cols.append(np.asarray(values, dtype=np.float32).reshape(len(values), -1))
            except (TypeError, ValueError):
                raise DataError(f"data.options.features: column '{name}' is not numeric") from None
        x = torch.from_numpy(np.hstack(cols))
    values = _column(table, label, "label")
    try:
        y = torch.tensor(values, dtype=torch.int64 if task == "classification" else torch.float32)
    except (TypeError, ValueError):
        raise DataError(f"data.options.label: column '{label}' is not a number per row (encode text labels first)") from None
    groups, names = {}, None
    if client is not None:
        raw = [str(v) for v in _column(table, client, "client")]
        names = sorted(set(raw))
        index = {n: i for i, n in enumerate(names)}
        groups[client] = torch.tensor([index[v] for v in raw], dtype=torch.int64)
    return x, y, groups, names


@DATASETS.register("huggingface", "a Hugging Face data set saved on disk, in the local cache or on the hub (pip install 'fedveil[hf]')")
def load_huggingface(
    root: str | os.PathLike | None = None,
    *,
    download: bool = True,
    path: str | None = None,
    split: str = "train",
    test_split: str | None = None,
    image: str | None = None,
    features: list[str] | None = None,
    label: str = "label",
    client: str | None = None,
    task: str = "classification",
) -> DataSource:
    """Read the split(s) (module docstring); ``download`` is accepted: ``datasets`` decides
    from its cache and the network."""
    if path is None:
        raise DataError("data.options.path: give a folder saved with save_to_disk or a hub name")
    if task not in ("classification", "regression"):
        raise DataError(f"data.options.task: '{task}' is not classification or regression")
    base = Path(root).expanduser() if root is not None else Path.cwd()
    table = _split(path, base, split)
    x, y, groups, clients = _encode(table, image, features, label, client, task)
    classes: list[str] = []
    if task == "classification":
        if int(y.min()) < 0:
            raise DataError(f"data.options.label: column '{label}' holds negative classes")
        feature = table.features.get(label)
        classes = list(feature.names) if hasattr(feature, "names") else [str(c) for c in range(int(y.max()) + 1)]
    info = {"classes": classes} if task == "classification" else {}
    if client is not None:
        info["group_categories"] = {client: clients}
    train = ArrayDataset(x, y, groups, info)
    test = None
    if test_split is not None:
        tx, ty, _, _ = _encode(_split(path, base, test_split), image, features, label, None, task)
        test = ArrayDataset(tx, ty)
    num_classes = len(classes) if task == "classification" else 0
    return DataSource(train=train, test=test, task=task, num_classes=num_classes, natural_groups=client)
