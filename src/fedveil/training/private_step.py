"""One client's DP-SGD gradient by the stacked book-keeping rules with a single client.

:meth:`LocalTrainer.run <fedveil.training.local.LocalTrainer.run>` (the serial, threads and
Ray executors; a deployed silo) takes each private step's clipped sum from the rules of
:mod:`fedveil.training.private_stacked` with ``K = 1`` where the model allows it: the same
gradient as :func:`fedveil.privacy.dp_sgd.private_gradient` (spec 002 §1.2; equal to float
rounding, the same noise from the same generator in the same order) without materialising
every per-example gradient by ``vmap``. :func:`private_gradient` keeps a plain stack of
Linear layers (its closed form), models the stacked engine cannot run, and empty Poisson
batches.
"""
from __future__ import annotations

import threading
import weakref

import torch
from torch import nn

from ..engine.stacked import StackedModel, UnsupportedModelError
from ..params import Params
from ..privacy.dp_sgd import ExampleDP, ExtraGrad, PrivateGradient, closed_form_layers, private_gradient
from ..privacy.randomness import RandomSource
from .private_stacked import check_private_stacking, private_stacked_gradients
from .request import Batch, Objective

_STACKED: "weakref.WeakKeyDictionary[nn.Module, StackedModel | None]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()  # the threads executor's clients share models


def book_keeping_model(model: nn.Module) -> StackedModel | None:
    """``model`` traced for the stacked private rules, or None where they do not apply (cached)."""
    with _LOCK:
        if model not in _STACKED:
            try:
                stacked = StackedModel(model)
                check_private_stacking(model)
            except UnsupportedModelError:
                stacked = None
            _STACKED[model] = stacked
        return _STACKED[model]


def client_private_gradient(
    model: nn.Module,
    w: Params,
    batch: Batch,
    objective: Objective,
    dp: ExampleDP,
    generator: RandomSource,
    denominator: float,
    private_rows: int,
    extra_grad: ExtraGrad | None,
    buffers: Params,
) -> PrivateGradient:
    """One private step's gradient on ``batch`` (its first ``private_rows`` rows private):
    :func:`~fedveil.privacy.dp_sgd.private_gradient`'s arguments, computed by the stacked
    rules when the model allows (see module doc)."""
    rows = len(batch.x)
    closed_form = closed_form_layers(model, w, batch.x, extra_grad) is not None
    stacked = None if closed_form or rows == 0 else book_keeping_model(model)
    if stacked is None:
        return private_gradient(
            model, w, batch.x, batch, objective.mean, clip=dp.clip, noise_multiplier=dp.noise_multiplier,
            denominator=denominator, generator=generator, extra_grad=extra_grad, private_rows=private_rows,
            buffers=buffers,
        )
    one = {name: value.unsqueeze(0) for name, value in w.items()}
    term = None
    if extra_grad is not None:
        extra = extra_grad(w)
        term = {name: extra[name].unsqueeze(0) if name in extra else torch.zeros_like(v) for name, v in one.items()}
    device = batch.x.device
    private = None if private_rows >= rows else (torch.arange(rows, device=device) < private_rows).float().unsqueeze(0)
    grads, loss_sums = private_stacked_gradients(
        stacked, model, one, batch.x, batch, torch.ones(1, rows, device=device),
        lambda out, b: objective.per_example(out, b), [dp], [generator], term=term, private=private,
        denominators=[denominator], buffers={name: value.unsqueeze(0) for name, value in buffers.items()},
    )
    return PrivateGradient({name: grads[name][0] for name in w}, float(loss_sums[0]), rows)
