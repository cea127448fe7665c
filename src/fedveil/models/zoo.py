"""The model registry, ``build_model`` and the small helpers every builder shares."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

from torch import nn

from ..options import check_options, keyword_options
from ..registry import Registry
from .python_models import build_python_model, is_python_model, resolve

ModelBuilder = Callable[..., nn.Module]
MODELS: Registry[ModelBuilder] = Registry("model")

_POSITIONAL = ("input_shape", "num_classes")


def model_options(name: str) -> dict[str, Any]:
    """The keyword options of model ``name`` with their defaults."""
    return keyword_options(*_builder(name))


def check_model_options(name: str, options: Mapping[str, Any]) -> None:
    """Raise ValueError, in one line, for an option model ``name`` does not take or a value
    its builder's annotation refuses."""
    builder, exclude = _builder(name)
    check_options(builder, options, f"model '{name}'", exclude)


def _builder(name: str) -> tuple[Callable[..., Any], tuple[str, ...]]:
    """Model ``name``'s builder and the parameters the data fills in (not options)."""
    return (resolve(name) if is_python_model(name) else MODELS.get(name)), _POSITIONAL


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, **options: Any) -> nn.Module:
    """Build model ``name`` for examples of shape ``input_shape`` and ``num_classes`` classes."""
    check_model_options(name, options)
    shape = tuple(input_shape)
    if not shape or not all(isinstance(d, int) and d > 0 for d in shape):
        raise ValueError(f"input_shape must be a non-empty tuple of positive ints, got {input_shape!r}")
    if not isinstance(num_classes, int) or num_classes < 0:
        raise ValueError(f"num_classes must be an int >= 0 (0 means regression), got {num_classes!r}")
    if is_python_model(name):
        return build_python_model(name, shape, num_classes, **options)
    return MODELS.get(name)(shape, num_classes, **options)


def num_outputs(num_classes: int) -> int:
    """Width of the output layer: one unit for regression (``num_classes == 0``)."""
    return num_classes if num_classes > 0 else 1


def scaled(channels: int, width: float) -> int:
    """``channels`` times the ``width`` multiplier, rounded, at least 1."""
    if isinstance(width, bool) or not isinstance(width, (int, float)) or width <= 0:
        raise ValueError(f"width must be a number > 0, got {width!r}")
    return max(1, round(channels * width))


def image_input(input_shape: tuple[int, ...], model: str) -> tuple[nn.Module, tuple[int, int, int]]:
    """A module viewing a batch of images as ``(N, C, H, W)``, and that ``(C, H, W)``.

    ``input_shape`` is ``(C, H, W)`` or ``(H, W)`` (one channel, added on the fly).
    """
    if len(input_shape) == 3:
        return nn.Identity(), tuple(input_shape)
    if len(input_shape) == 2:
        h, w = input_shape
        return nn.Unflatten(1, (1, h)), (1, h, w)
    raise ValueError(f"model '{model}' needs images of shape (C, H, W) or (H, W), got {input_shape}")

