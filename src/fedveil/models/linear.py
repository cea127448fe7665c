"""Linear model on the flattened input: logistic (softmax) or linear regression."""
from __future__ import annotations

import math
from collections import OrderedDict

from torch import nn

from . import MODELS, num_outputs


@MODELS.register("linear", "linear layer on the flattened input (logistic / linear regression)")
def linear(input_shape: tuple, num_classes: int) -> nn.Module:
    """``Flatten -> Linear(prod(input_shape), num_classes or 1)``."""
    return nn.Sequential(
        OrderedDict(
            flatten=nn.Flatten(),
            fc=nn.Linear(math.prod(input_shape), num_outputs(num_classes)),
        )
    )
