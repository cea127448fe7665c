"""The partitioner contract: rows of a data set -> one index array per client."""
from __future__ import annotations

from typing import ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from ..registry import Registry
from .arrays import ArrayDataset


class PartitionParams(BaseModel):
    """Hyper-parameters of a partitioner; subclasses add typed, validated fields."""

    model_config = ConfigDict(extra="forbid")


class Partitioner:
    """Splits the rows of an :class:`ArrayDataset` among ``num_clients`` clients.

    Subclasses set ``Params`` and implement :meth:`split`. ``split`` must be a pure
    function of its arguments and the generator, so one seed fixes the partition.
    """

    Params: ClassVar[type[PartitionParams]] = PartitionParams

    def __init__(self, params: PartitionParams | None = None) -> None:
        self.params = params if params is not None else self.Params()

    def split(self, data: ArrayDataset, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        """One sorted int64 array of row indices per client, drawn from ``rng``; disjoint, none empty."""
        raise NotImplementedError


PARTITIONERS: Registry[type[Partitioner]] = Registry("partition")
