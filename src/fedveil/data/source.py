"""Data-set sources: what a loader hands to the federated builder, and the registry of them."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

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
