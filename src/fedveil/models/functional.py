"""Thread-safe functional forward passes.

``torch.func.functional_call`` swaps a module's parameters in place for the call, so two
threads must not run it on the same module at once. The vectorized executor runs each
client's ``client_update`` in its own thread; algorithm code that evaluates the model
there (IFCA's cluster scores) goes through :func:`forward`, which holds a per-module lock.
"""
from __future__ import annotations

import threading
import weakref

import torch
from torch import nn
from torch.func import functional_call

from ..params import Params

_LOCKS: "weakref.WeakKeyDictionary[nn.Module, threading.Lock]" = weakref.WeakKeyDictionary()
_GUARD = threading.Lock()


def _lock_of(model: nn.Module) -> threading.Lock:
    with _GUARD:
        lock = _LOCKS.get(model)
        if lock is None:
            lock = _LOCKS[model] = threading.Lock()
        return lock


def forward(model: nn.Module, params: Params, x: torch.Tensor) -> torch.Tensor:
    """``model`` applied to ``x`` with parameters ``params``, safe to call from several threads."""
    with _lock_of(model):
        return functional_call(model, params, (x,))
