"""The federated view of a data set: per-client train/val/test tensors plus a pooled test set."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .arrays import ArrayDataset, packed_rows
from .errors import DataError
from .standardise import fit_columns, standardise_columns


@dataclass
class ClientData:
    """One client's own rows, split into train, optional validation, and test."""

    train: ArrayDataset
    val: ArrayDataset | None
    test: ArrayDataset

    @property
    def num_train(self) -> int:
        """The client's number of training rows."""
        return len(self.train)


@dataclass
class FederatedDataset:
    """Per-client data and the pooled test set used to score the global model.

    ``task`` is ``"classification"`` (integer labels, ``num_classes`` > 0) or
    ``"regression"`` (float targets, ``num_classes`` == 0). ``input_shape`` is the
    shape of one example, so a model can be built without looking at the data.
    """

    name: str
    clients: list[ClientData]
    test: ArrayDataset
    task: str
    num_classes: int
    input_shape: tuple[int, ...]

    @property
    def num_clients(self) -> int:
        """The number of clients."""
        return len(self.clients)

    def train_sizes(self) -> np.ndarray:
        """Each client's number of training rows, in client order."""
        return np.array([c.num_train for c in self.clients])

    def label_counts(self) -> np.ndarray:
        """(num_clients, num_classes) matrix of training-label counts."""
        if self.task != "classification":
            raise DataError(f"label counts need a classification task, '{self.name}' is {self.task}")
        counts = np.zeros((self.num_clients, self.num_classes), dtype=np.int64)
        for i, c in enumerate(self.clients):
            counts[i] = np.bincount(c.train.y.numpy(), minlength=self.num_classes)[: self.num_classes]
        return counts


def split_rows(
    n: int, val_fraction: float, test_fraction: float, rng: np.random.Generator
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Shuffle one client's ``n`` rows and cut them into train / val / test row indices
    (at least one train row; val ``None`` when ``val_fraction`` is 0)."""
    order = torch.from_numpy(rng.permutation(n))
    n_test = int(round(test_fraction * n))
    n_val = int(round(val_fraction * n))
    if n - n_test - n_val < 1:
        raise DataError(
            f"a client with {n} rows has no training rows left after val_fraction={val_fraction} "
            f"and test_fraction={test_fraction}; use fewer clients or smaller fractions"
        )
    val = order[n_test : n_test + n_val] if val_fraction > 0 else None
    return order[n_test + n_val :], val, order[:n_test]


def split_client_rows(
    data: ArrayDataset, val_fraction: float, test_fraction: float, rng: np.random.Generator
) -> ClientData:
    """Shuffle one client's rows and cut them into train / val / test (at least one train row)."""
    train, val, test = split_rows(len(data), val_fraction, test_fraction, rng)
    return ClientData(train=data.subset(train), val=None if val is None else data.subset(val), test=data.subset(test))


def standardise_client(client: ClientData, columns: Sequence[int]) -> ClientData:
    """``client`` with the ``columns`` of its train, val and test rows standardised by the
    mean and standard deviation of its own training rows (local preprocessing)."""
    stats = fit_columns(client.train, columns)
    train, val, test = (
        None if split is None else standardise_columns(split, columns, stats)
        for split in (client.train, client.val, client.test)
    )
    return ClientData(train=train, val=val, test=test)


def build_federated(
    name: str,
    train: ArrayDataset,
    parts: list[np.ndarray],
    *,
    task: str,
    num_classes: int,
    pooled_test: ArrayDataset | None,
    val_fraction: float,
    test_fraction: float,
    seed: int,
    per_client_columns: Sequence[int] = (),
) -> FederatedDataset:
    """Assemble a :class:`FederatedDataset` from a partition of ``train``'s rows.

    Every client's rows are split into train/val/test; with ``per_client_columns``, every
    client then standardises those columns of x by its own training rows
    (:func:`standardise_client`). The pooled test set is ``pooled_test`` when the source
    has a separate test set, else the union of the clients' test rows (so it follows the
    clients' joint distribution). A separate test set belongs to no client, so with
    ``per_client_columns`` it is left out and the union is used, each row scaled by its
    own client.
    """
    rng = np.random.default_rng(seed)
    splits = []
    for idx in parts:
        rows = torch.as_tensor(idx, dtype=torch.long)
        own, val, test = split_rows(len(rows), val_fraction, test_fraction, rng)
        splits.append((rows[own], None if val is None else rows[val], rows[test]))
    # every client's training rows copied once, end to end (a stacked step gathers them in one go)
    trains = packed_rows(train, [own for own, _, _ in splits])
    clients = [
        ClientData(train=own, val=None if val is None else train.subset(val), test=train.subset(test))
        for own, (_, val, test) in zip(trains, splits)
    ]
    if per_client_columns:
        clients = [standardise_client(c, per_client_columns) for c in clients]
        pooled_test = None
    if pooled_test is None:
        if test_fraction <= 0:
            raise DataError(
                f"the pooled test set of '{name}' is the union of the clients' test splits, "
                "so test_fraction must be > 0"
            )
        pooled_test = ArrayDataset.concat([c.test for c in clients])
    return FederatedDataset(
        name=name,
        clients=clients,
        test=pooled_test,
        task=task,
        num_classes=num_classes,
        input_shape=tuple(train.x.shape[1:]),
    )
