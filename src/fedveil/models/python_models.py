"""Your own PyTorch module as a run's model, without touching fedveil's zoo.

A config names it ``model.name = "python:package.module:ClassName"`` (any importable class
or factory function); from Python, ``fedveil.run(config, out, model=MyNet)`` does the same
for a class or function object, also one defined in a script or a notebook. The callable
is called with the keyword arguments it declares among ``input_shape`` and
``num_classes`` (0 for regression: one output), plus ``model.options``; the rest of its
keyword parameters are its options (``fedveil config show`` lists them like the zoo's).

For a model every config of a project uses, register a builder in the zoo instead:
``@MODELS.register("mynet", "one line")`` on a function ``(input_shape, num_classes,
**options) -> nn.Module`` (docs/your-model-and-data.md).
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable

from torch import nn

PREFIX = "python:"
_GIVEN: dict[str, Callable[..., nn.Module]] = {}  # name -> object handed to run(model=...) in this process


def is_python_model(name: str) -> bool:
    """Whether model name ``name`` is a ``python:module:attribute`` name rather than a zoo name."""
    return name.startswith(PREFIX)


def python_model_name(spec: Callable[..., nn.Module]) -> str:
    """The ``python:`` name of ``spec``, remembered in this process (so a class defined in a
    script or a function body works here; another process imports the name)."""
    if not callable(spec):
        raise ValueError(f"model must be an nn.Module class or a function returning one, got {spec!r}")
    name = f"{PREFIX}{spec.__module__}:{spec.__qualname__}"
    _GIVEN[name] = spec
    return name


def resolve(name: str) -> Callable[..., nn.Module]:
    """The callable a ``python:module:attribute`` name stands for."""
    if name in _GIVEN:
        return _GIVEN[name]
    path = name[len(PREFIX):]
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"model '{name}': write python:package.module:ClassName")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"model '{name}' cannot be imported ({err}); is its package on PYTHONPATH?") from None
    if not callable(target):
        raise ValueError(f"model '{name}' is not a class or a function")
    return target


def build_python_model(name: str, input_shape: tuple[int, ...], num_classes: int, **options: Any) -> nn.Module:
    """Calls the callable ``name`` stands for with the data arguments
    it declares and ``options``; it must return an ``nn.Module``."""
    spec = resolve(name)
    params = inspect.signature(spec).parameters
    data_args = {"input_shape": tuple(input_shape), "num_classes": num_classes}
    model = spec(**{k: v for k, v in data_args.items() if k in params}, **options)
    if not isinstance(model, nn.Module):
        raise ValueError(f"model '{name}' returned a {type(model).__name__}, not an nn.Module")
    return model
