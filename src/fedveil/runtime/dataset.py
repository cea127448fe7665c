"""From a ``[data]`` config section to a :class:`FederatedDataset`: load, partition, split."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..config import DataConfig
from ..seeding import derive_seed, numpy_generator
from ..data.errors import DataError
from ..data.federated import FederatedDataset, build_federated
from ..data.partition_base import PARTITIONERS
from ..data.source import DATASETS, DataSource
from ..data.standardise import standardise_pooled
from ..options import check_options, keyword_options

_COMMON_ARGS = ("root", "download")


def loader_options(name: str) -> dict[str, Any]:
    """The data-set-specific keyword options of loader ``name`` with their defaults."""
    return keyword_options(DATASETS.get(name), exclude=_COMMON_ARGS)


def check_loader_options(name: str, options: Mapping[str, Any]) -> None:
    """Reject, in one line, an option the loader does not take (naming the accepted ones) or
    a value its annotation refuses."""
    try:
        check_options(DATASETS.get(name), options, f"data.options: data set '{name}'", exclude=_COMMON_ARGS)
    except ValueError as err:
        raise DataError(str(err)) from None


def load_source(cfg: DataConfig, seed: int) -> DataSource:
    """Run the loader of ``cfg.name``; synthetic generators get a seed derived from the run seed."""
    check_loader_options(cfg.name, cfg.options)
    options = dict(cfg.options)
    if "seed" in loader_options(cfg.name) and "seed" not in options:
        options["seed"] = derive_seed(seed, "data", cfg.name) % (2**31)
    return DATASETS.get(cfg.name)(cfg.root, download=cfg.download, **options)


def standardise_source(cfg: DataConfig, source: DataSource) -> DataSource:
    """``source`` with its continuous columns standardised over its training split when
    ``cfg.standardize`` is ``pooled``; a mode other than the default needs such columns."""
    if not source.continuous and cfg.standardize != "pooled":
        raise DataError(
            f"data.standardize='{cfg.standardize}': data set '{cfg.name}' declares no continuous "
            "feature columns to standardise; leave the default 'pooled'"
        )
    return standardise_pooled(source) if source.continuous and cfg.standardize == "pooled" else source


def build_dataset(cfg: DataConfig, seed: int) -> FederatedDataset:
    """Load the data set, standardise its continuous columns as ``cfg.standardize`` says
    (:mod:`.standardise`), partition its training rows over ``cfg.num_clients`` clients
    with the configured partitioner, and split every client's rows into train/val/test."""
    source = standardise_source(cfg, load_source(cfg, seed))
    partitioner_cls = PARTITIONERS.get(cfg.partition.name)
    partitioner = partitioner_cls(cfg.partition.typed_params())
    parts = partitioner.split(source.train, cfg.num_clients, numpy_generator(seed, "partition"))
    return build_federated(
        cfg.name,
        source.train,
        parts,
        task=source.task,
        num_classes=source.num_classes,
        pooled_test=source.test,
        val_fraction=cfg.val_fraction,
        test_fraction=cfg.test_fraction,
        seed=derive_seed(seed, "client-splits"),
        per_client_columns=source.continuous if cfg.standardize == "per_client" else (),
    )
