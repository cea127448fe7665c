"""Fully connected ReLU network on the flattened input."""
from __future__ import annotations

import math
from collections import OrderedDict

from torch import nn

from .zoo import MODELS, num_outputs


@MODELS.register("mlp", "ReLU MLP on the flattened input (FedAvg's 784-200-200-10 by default)")
def mlp(input_shape: tuple, num_classes: int, hidden: tuple[int, ...] = (200, 200)) -> nn.Module:
    """``Flatten -> [Linear -> ReLU] per entry of hidden -> Linear(num_classes or 1)``.

    ``hidden=()`` gives a linear model; the default is the MNIST MLP of the FedAvg paper.
    """
    if not isinstance(hidden, (tuple, list)) or not all(
        isinstance(h, int) and not isinstance(h, bool) and h > 0 for h in hidden
    ):
        raise ValueError(f"hidden must be a sequence of positive ints, got {hidden!r}")
    layers: OrderedDict[str, nn.Module] = OrderedDict(flatten=nn.Flatten())
    fan_in = math.prod(input_shape)
    for i, h in enumerate(hidden, start=1):
        layers[f"fc{i}"] = nn.Linear(fan_in, h)
        layers[f"relu{i}"] = nn.ReLU()
        fan_in = h
    layers["out"] = nn.Linear(fan_in, num_outputs(num_classes))
    return nn.Sequential(layers)
