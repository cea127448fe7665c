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
from typing import Any, Iterable

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
    """Names of ``model``'s parameters (the entries of its state that SGD trains)."""
    return [name for name, _ in model.named_parameters()]


def buffer_names(model: nn.Module) -> list[str]:
    """Names of ``model``'s buffers (e.g. BatchNorm running statistics) in its state."""
    return [name for name, _ in model.named_buffers()]


def model_state(model: nn.Module) -> Params:
    """A detached copy of ``model``'s parameters and buffers: the initial state of a run."""
    return {name: t.detach().clone() for name, t in (*model.named_parameters(), *model.named_buffers())}


def forward(
    model: nn.Module, state: Params, x: torch.Tensor, *, train: bool = False, groups: dict[str, torch.Tensor] | None = None
) -> torch.Tensor:
    """``model`` applied to ``x`` with the parameters and buffers in ``state``, safe to call
    from several threads. ``train`` picks the mode of mode-dependent layers (BatchNorm uses
    batch statistics and updates the running statistics in ``state`` in place); a buffer
    missing from ``state`` in training mode is an error, so a shared module is never changed.
    A model with ``takes_groups = True`` also gets the batch's per-row ``groups`` (ADDS's
    unit masks and sampling draws); other models never see them."""
    if train:
        missing = [n for n in buffer_names(model) if n not in state]
        if missing:
            raise ValueError(f"training needs the model's buffers in the state; missing: {', '.join(missing)}")
    with _lock_of(model):
        was_training = model.training
        model.train(train)
        try:
            if getattr(model, "takes_groups", False):
                return functional_call(model, state, (x,), {"groups": groups})
            return functional_call(model, state, (x,))
        finally:
            model.train(was_training)


class _Method(nn.Module):
    """Calls ``module.<name>`` as its forward, so ``functional_call`` can run any method."""

    def __init__(self, module: nn.Module, name: str) -> None:
        super().__init__()
        self.module, self.name = module, name

    def forward(self, *args: Any) -> Any:
        return getattr(self.module, self.name)(*args)


def method_call(model: nn.Module, state: Params, name: str, *args: Any, train: bool = False) -> Any:
    """``model.<name>(*args)`` with the parameters and buffers in ``state`` (thread-safe,
    eval mode unless ``train``), e.g. a supernet's unit importances."""
    with _lock_of(model):
        was_training = model.training
        model.train(train)
        try:
            return functional_call(_Method(model, name), {f"module.{k}": v for k, v in state.items()}, args)
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


@torch.no_grad()
def refresh_batch_norm(model: nn.Module, state: Params, batches: Iterable[torch.Tensor]) -> Params:
    """``state`` with every tracked BatchNorm's running statistics re-estimated from scratch
    on ``batches`` (Split-Mix's "post average", HeteroFL's static BN): reset, then each batch's
    statistics averaged cumulatively (BN momentum None), other entries kept. The network runs
    as at test time (eval mode: Scalers off, as the reference code turns them off) except its
    BatchNorms, which take batch statistics."""
    layers = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    if not layers:
        raise ValueError("the model has no BatchNorm with running statistics to refresh (use a *_tracked norm)")
    fresh = {k: v.clone() for k, v in state.items()}
    for name, module in model.named_modules():
        if module in layers:
            prefix = f"{name}." if name else ""
            fresh[prefix + "running_mean"].zero_()
            fresh[prefix + "running_var"].fill_(1.0)
            fresh[prefix + "num_batches_tracked"].zero_()
    with _lock_of(model):
        was_training, momenta = model.training, [m.momentum for m in layers]
        model.eval()
        for m in layers:
            m.train()
            m.momentum = None  # cumulative moving average over the refresh batches
        try:
            for x in batches:
                functional_call(model, fresh, (x,))
        finally:
            model.train(was_training)
            for m, momentum in zip(layers, momenta):
                m.momentum = momentum
    return fresh
