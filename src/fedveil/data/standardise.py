"""Standardisation of a data set's continuous feature columns (``data.standardize``).

A loader leaves its continuous columns raw and lists their indices in
``DataSource.continuous`` (Adult: 6 columns, COMPAS: 5); the builder standardises them
to mean 0 and standard deviation 1 in one of three ways:

- ``pooled`` (default): with the statistics of the source's whole training split, before
  it is partitioned, applied to its test split too. These statistics are preprocessing
  computed on every silo's records, and no privacy ledger accounts for them: the
  reported epsilon covers training only (and a real deployment would have to pool the
  data to compute them).
- ``per_client``: every client with the statistics of its own training rows, applied to
  its train, validation and test rows. That is local preprocessing, which releases
  nothing. See :func:`~fedveil.data.federated.build_federated` for the pooled test set.
- ``none``: raw values.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from .arrays import ArrayDataset
from .source import DataSource

Stats = tuple[np.ndarray, np.ndarray]  # column means, column standard deviations


def fit_standardiser(values: np.ndarray) -> Stats:
    """Column means and population standard deviations of ``values`` (n, d); a constant
    column gets std 1 so that standardising it gives zeros instead of NaN."""
    mean = values.mean(axis=0)
    std = values.std(axis=0)
    std[std == 0] = 1.0
    return mean, std


def fit_columns(data: ArrayDataset, columns: Sequence[int]) -> Stats:
    """:func:`fit_standardiser` of the ``columns`` of ``data.x``, in float64."""
    return fit_standardiser(data.x[:, list(columns)].double().numpy())


def standardise_columns(data: ArrayDataset, columns: Sequence[int], stats: Stats) -> ArrayDataset:
    """``data`` with the ``columns`` of x replaced by (x - mean) / std, computed in float64."""
    x, columns = data.x.clone(), list(columns)
    x[:, columns] = torch.from_numpy((x[:, columns].double().numpy() - stats[0]) / stats[1]).to(x.dtype)
    return replace(data, x=x)


def standardise_pooled(source: DataSource) -> DataSource:
    """``source`` with its continuous columns standardised by the statistics of its whole
    training split (the ``pooled`` mode), its test split (if any) by the same ones."""
    columns = source.continuous
    stats = fit_columns(source.train, columns)
    test = None if source.test is None else standardise_columns(source.test, columns, stats)
    return replace(source, train=standardise_columns(source.train, columns, stats), test=test)
