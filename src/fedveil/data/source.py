"""Data-set sources: what a loader hands to the federated builder, and the registry of them."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..registry import Registry
from .arrays import ArrayDataset

DATA_ENV_VAR = "FEDVEIL_DATA"


@dataclass
class DataSource:
    """A loaded data set before partitioning.

    ``test`` is the source's own held-out split when it has one (MNIST's t10k, Adult's
    ``adult.test``), else ``None``. ``natural_groups`` names the ``train.groups`` key
    that holds a natural client id (school, speaking role, domain), if any.
    ``continuous`` lists the columns of ``x`` that hold raw continuous values; the builder
    standardises them as ``data.standardize`` says (:mod:`fedveil.data.standardise`).
    """

    train: ArrayDataset
    test: ArrayDataset | None
    task: str
    num_classes: int
    natural_groups: str | None = None
    synthetic: bool = False
    continuous: tuple[int, ...] = ()


Loader = Callable[..., DataSource]
DATASETS: Registry[Loader] = Registry("dataset")


def resolve_data_dir(name: str, root: str | os.PathLike | None) -> Path:
    """Where data set ``name`` lives: ``root`` if given, else ``$FEDVEIL_DATA/<name>``,
    else ``~/.cache/fedveil/<name>``."""
    if root is not None:
        return Path(root).expanduser()
    base = os.environ.get(DATA_ENV_VAR)
    if base:
        return Path(base).expanduser() / name
    return Path.home() / ".cache" / "fedveil" / name


# data paths a config file may give; relative ones are read from the file's own folder
FILE_RELATIVE_PATHS = (("data", "root"), ("data", "options", "base_root"))


def file_relative_paths(raw: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``raw`` (a config file's table) with its data paths made absolute: ``~`` and
    ``$VARS`` (e.g. ``$FEDVEIL_DATA/mnist-10k``) expanded, then a relative path joined to
    ``folder``, so an example config runs from any working directory."""
    for keys in FILE_RELATIVE_PATHS:
        node = raw
        for key in keys[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict) or not isinstance(node.get(keys[-1]), str):
            continue
        value = Path(os.path.expandvars(node[keys[-1]])).expanduser()
        node[keys[-1]] = str(value if value.is_absolute() else (folder.resolve() / value).resolve())
    return raw
