"""The device a run computes on (``device = "auto" | "cpu" | "cuda" | "cuda:N"``), and moving
its data and state there.

A run resolves its device once, before any work, and moves the model, the initial state
and every client's data to it once; client and server states then live there. Random
draws (batches, DP noise) keep coming from CPU generators or the secure source and are
moved to the tensors they perturb, so a CPU run's numbers do not depend on whether a GPU
is present. Checkpoints are written as CPU tensors and loaded onto the run's device.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, TypeVar

import torch

from ..config import DEVICE_NAMES
from ..data.arrays import ArrayDataset, packed
from ..data.federated import FederatedDataset
from ..errors import ConfigError

DEVICE_PATTERN = re.compile(DEVICE_NAMES)
CPU = torch.device("cpu")

T = TypeVar("T")


def cuda_available() -> bool:
    """Whether CUDA can be used here (a seam for tests: monkeypatch it to pretend)."""
    return torch.cuda.is_available()


def cuda_count() -> int:
    """The number of CUDA devices visible here."""
    return torch.cuda.device_count()


def resolve_device(spec: str | torch.device = "auto") -> torch.device:
    """The :class:`torch.device` that ``spec`` names on this machine: ``auto`` is CUDA when
    available, else CPU; ``cuda`` is the current CUDA device, with its index. Asking for
    CUDA where there is none (or for a GPU index beyond the last) raises
    :class:`ConfigError` naming the fix, before any work starts."""
    if isinstance(spec, torch.device):
        spec = str(spec)
    spec = spec.strip().lower()
    if not DEVICE_PATTERN.fullmatch(spec):
        raise ConfigError(f"device: '{spec}' is not a device; use auto, cpu, cuda or cuda:N")
    if spec == "cpu" or (spec == "auto" and not cuda_available()):
        return CPU
    if spec == "auto":
        spec = "cuda"
    if not cuda_available():
        raise ConfigError(
            f"device = \"{spec}\" but CUDA is not available here (torch {torch.__version__}, "
            f"{'a CPU-only build' if torch.version.cuda is None else 'no GPU visible'}); "
            "use device = \"auto\" or \"cpu\", or install a CUDA build of torch (make demo TORCH=torch)"
        )
    device = torch.device(spec)
    if device.index is None:  # with its index, so that it compares equal to its tensors' devices
        return torch.device("cuda", torch.cuda.current_device())
    if device.index >= cuda_count():
        raise ConfigError(f"device = \"{spec}\": this machine has {cuda_count()} CUDA device(s), numbered from 0")
    return device


def to_device(value: T, device: torch.device | str) -> T:
    """``value`` with every tensor inside (dicts, lists, tuples) moved to ``device``; a tensor
    already there is returned as it is (no copy)."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return type(value)((k, to_device(v, device)) for k, v in value.items())
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(to_device(v, device) for v in value)
    return value


def to_cpu(value: T) -> T:
    """``value`` with every tensor on the CPU (what a checkpoint holds)."""
    return to_device(value, CPU)


def dataset_to(data: ArrayDataset, device: torch.device) -> ArrayDataset:
    """``data`` with ``x``, ``y`` and its group labels on ``device`` (other fields kept)."""
    groups = {k: v.to(device) for k, v in data.groups.items()}
    return dataclasses.replace(data, x=data.x.to(device), y=data.y.to(device), groups=groups)


def federated_to(data: FederatedDataset, device: torch.device) -> FederatedDataset:
    """Every client's train/val/test rows and the pooled test set on ``device``: done once
    at the start of a run, so that no training step copies data. The clients' training rows
    are :func:`~fedveil.data.arrays.packed` into one tensor per field, so that a stacked
    step gathers the cohort's batches at once."""
    trains = packed([c.train for c in data.clients], device)
    clients = [
        dataclasses.replace(
            c, train=train, val=None if c.val is None else dataset_to(c.val, device), test=dataset_to(c.test, device),
        )
        for c, train in zip(data.clients, trains)
    ]
    return dataclasses.replace(data, clients=clients, test=dataset_to(data.test, device))


def tensors_of(value: Any) -> list[torch.Tensor]:
    """Every tensor inside ``value`` (dicts, lists, tuples, dataclasses such as the data sets)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_of(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_of(v)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [t for f in dataclasses.fields(value) for t in tensors_of(getattr(value, f.name))]
    return []


__all__ = ["CPU", "cuda_available", "dataset_to", "federated_to", "resolve_device", "tensors_of", "to_cpu", "to_device"]
