"""``model.name = "auto"`` picks a model that suits the data's shape."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fedveil.runtime.simulation import auto_model_name


def data(shape, task="classification", tokens=False):
    x = torch.zeros(2, *shape, dtype=torch.long if tokens else torch.float32)
    return SimpleNamespace(input_shape=shape, task=task, test=SimpleNamespace(x=x))


@pytest.mark.parametrize(("shape", "task", "tokens", "expected"), [
    ((1, 8, 8), "classification", False, "mlp"),  # scikit-learn's 8x8 digits
    ((1, 16, 16), "classification", False, "lenet"),
    ((1, 28, 28), "classification", False, "lenet"),
    ((3, 32, 32), "classification", False, "lenet"),
    ((80,), "classification", True, "char_lstm"),
    ((14,), "classification", False, "mlp"),
    ((27,), "regression", False, "linear"),
])
def test_auto_model(shape, task, tokens, expected):
    assert auto_model_name(data(shape, task, tokens)) == expected
