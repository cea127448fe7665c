"""Analytic model complexity: parameter and multiply-accumulate counts (spec 000 part 2, A.9).

Table 4.1 of Split-Mix reports #Params exactly as :func:`count_params` counts them (BN
weight and bias included, running statistics not). Its "MACs" column is about
:func:`count_macs` / 10 (spec A.9 [X]: e.g. Digits CNN x1 47.8M -> 4.8M, PreResNet18 x1
555.4M -> 55.7M; the paper's thop profiler also counts BN, ReLU and pooling, so the table is
slightly above the exact tenth). Compare methods by ratios, or divide by 10 to match the table.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.modules.conv import _ConvNd

_BATCH = 2  # batch-statistics BN cannot normalise a single row


def count_params(model: nn.Module) -> int:
    """Number of parameters (trainable tensors; buffers such as BN running statistics excluded)."""
    return sum(p.numel() for p in model.parameters())


def _layer_macs(module: nn.Module, output: torch.Tensor) -> int:
    if isinstance(module, _ConvNd):
        per_output = module.in_channels // module.groups * math.prod(module.kernel_size)
        return output.numel() * per_output
    return output.numel() * module.in_features  # nn.Linear


def count_macs(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Multiply-accumulates of every convolution and linear layer for ONE example of shape
    ``input_shape`` (conv: output elements x in_channels/groups x kernel size; linear:
    in x out features; biases, BN, activations and pooling not counted).

    Measured with forward hooks on a batch of 2 in eval mode (batch-average BN needs more
    than one row), divided by 2; the input is made on the device of the model's parameters.
    """
    first = next(model.parameters(), None)
    device, dtype = (None, None) if first is None else (first.device, first.dtype)
    return macs_per_example(model, torch.zeros(_BATCH, *input_shape, device=device, dtype=dtype))


def macs_per_example(model: nn.Module, rows: torch.Tensor) -> int:
    """:func:`count_macs`'s count measured on the examples ``rows`` (a batch on the model's
    device, e.g. token ids, which zeros of the parameters' dtype cannot stand for), per example."""
    total = 0

    def hook(module: nn.Module, _inputs: tuple, output: torch.Tensor) -> None:
        nonlocal total
        total += _layer_macs(module, output)

    layers = [m for m in model.modules() if isinstance(m, (_ConvNd, nn.Linear))]
    handles = [m.register_forward_hook(hook) for m in layers]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(rows)
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    return total // len(rows)
