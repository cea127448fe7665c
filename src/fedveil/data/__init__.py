"""Data layer: real loaders, synthetic generators, partitioners, the federated view."""
from .arrays import ArrayDataset
from .errors import DataError
from .federated import ClientData, FederatedDataset
from .partition_base import PARTITIONERS, Partitioner, PartitionParams
from .source import DATASETS, DataSource
from . import loaders, partition, synthetic, synthetic_images  # noqa: F401  (register components)

__all__ = [
    "ArrayDataset", "ClientData", "DATASETS", "DataError", "DataSource",
    "FederatedDataset", "PARTITIONERS", "PartitionParams", "Partitioner",
]
