"""Model state as plain data, and thread-safe functional forward passes.

A model's *state* is one dict: its parameters (trained by SGD) and its buffers (BatchNorm
running statistics, updated by the forward in training mode). Client and server states,
checkpoints and aggregation all handle this one dict; :func:`parameter_names` and
:func:`buffer_names` tell the two parts apart.

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


def parameter_names(model: nn.Module) -> list[str]:
    return [name for name, _ in model.named_parameters()]


def buffer_names(model: nn.Module) -> list[str]:
    return [name for name, _ in model.named_buffers()]


def model_state(model: nn.Module) -> Params:
    """A detached copy of ``model``'s parameters and buffers: the initial state of a run."""
    return {name: t.detach().clone() for name, t in (*model.named_parameters(), *model.named_buffers())}


def forward(model: nn.Module, state: Params, x: torch.Tensor, *, train: bool = False) -> torch.Tensor:
    """``model`` applied to ``x`` with the parameters and buffers in ``state``, safe to call
    from several threads. ``train`` picks the mode of mode-dependent layers (BatchNorm uses
    batch statistics and updates the running statistics in ``state`` in place); a buffer
    missing from ``state`` in training mode is an error, so a shared module is never changed."""
    if train:
        missing = [n for n in buffer_names(model) if n not in state]
        if missing:
            raise ValueError(f"training needs the model's buffers in the state; missing: {', '.join(missing)}")
    with _lock_of(model):
        was_training = model.training
        model.train(train)
        try:
            return functional_call(model, state, (x,))
        finally:
            model.train(was_training)


def submodule_forward(model: nn.Module, name: str, state: Params, x: torch.Tensor) -> torch.Tensor:
    """Submodule ``name`` of ``model`` (e.g. FADE's ``encoder``) applied to ``x`` in eval mode,
    with its entries of ``state``; holds ``model``'s own lock, so it is safe beside
    :func:`forward` calls on the whole model from other threads."""
    prefix = f"{name}."
    sub = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    module = model.get_submodule(name)
    with _lock_of(model):
        was_training = module.training
        module.eval()
        try:
            return functional_call(module, sub, (x,))
        finally:
            module.train(was_training)
