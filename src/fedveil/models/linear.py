"""Linear model on the flattened input: logistic (softmax) or linear regression."""
from __future__ import annotations

import math
from collections import OrderedDict

from torch import nn

from .zoo import MODELS, num_outputs


@MODELS.register("linear", "linear layer on the flattened input (logistic / linear regression)")
def linear(input_shape: tuple, num_classes: int, zero_init: bool = False) -> nn.Module:
    """``Flatten -> Linear(prod(input_shape), num_classes or 1)``; ``zero_init`` starts from
    all-zero weights and bias, as the MR-MTL code does for its linear models (spec 002 §2.1)."""
    model = nn.Sequential(
        OrderedDict(
            flatten=nn.Flatten(),
            fc=nn.Linear(math.prod(input_shape), num_outputs(num_classes)),
        )
    )
    if zero_init:
        nn.init.zeros_(model.fc.weight)
        nn.init.zeros_(model.fc.bias)
    return model
