"""The options a component takes as keyword parameters of its builder (a model of the zoo or
your own, a data loader, a feature extractor), read from the builder's signature and checked
in one place before anything is built.

An unknown option is one line naming the nearest option and the accepted ones; a value that
does not fit the parameter's annotation is one line naming the option, checked by pydantic
(lax: ``1`` fits a ``float``). The value given is the value passed on: checking never
converts it.
"""
from __future__ import annotations

import difflib
import inspect
import typing
from collections.abc import Callable, Collection, Mapping
from typing import Any

from pydantic import TypeAdapter, ValidationError

_KEYWORD_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def keyword_options(fn: Callable[..., Any], exclude: Collection[str] = (), skip_first: int = 0) -> dict[str, Any]:
    """``fn``'s keyword parameters after its first ``skip_first`` ones and besides ``exclude``,
    with their defaults (None for a parameter without one)."""
    params = list(inspect.signature(fn).parameters.values())[skip_first:]
    return {
        p.name: None if p.default is inspect.Parameter.empty else p.default
        for p in params if p.kind in _KEYWORD_KINDS and p.name not in exclude
    }


def check_options(
    fn: Callable[..., Any], options: Mapping[str, Any], what: str, exclude: Collection[str] = (), skip_first: int = 0,
) -> None:
    """Raise ValueError, in one line, for an option ``fn`` does not take or a value its
    annotation refuses; ``what`` names the component in the message (e.g. ``model 'mlp'``)."""
    accepted = keyword_options(fn, exclude, skip_first)
    for option in options:
        if option not in accepted:
            hint = difflib.get_close_matches(option, list(accepted), n=1)
            did_you_mean = f" (did you mean '{hint[0]}'?)" if hint else ""
            choices = ", ".join(f"{k}={v!r}" for k, v in accepted.items()) or "none"
            raise ValueError(f"{what} has no option '{option}'{did_you_mean}; accepted: {choices}")
    hints = _annotations(fn)
    for option, value in options.items():
        if option in hints:
            try:
                TypeAdapter(hints[option]).validate_python(value)
            except ValidationError as err:
                reason = err.errors()[0]["msg"]
                raise ValueError(f"{what}: option '{option}': {reason} (got {value!r})") from None


def _annotations(fn: Callable[..., Any]) -> dict[str, Any]:
    """``fn``'s parameter annotations that resolve to types (a class's are its ``__init__``'s);
    one that does not resolve is not checked."""
    target = fn.__init__ if inspect.isclass(fn) else fn
    try:
        hints = typing.get_type_hints(target)
    except Exception:  # noqa: BLE001 - an annotation naming what its module does not import: left unchecked
        return {}
    hints.pop("return", None)
    return {name: hint for name, hint in hints.items() if hint is not Any}
