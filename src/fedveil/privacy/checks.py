"""Argument checks shared by the privacy and theory code.

Each check returns the value in canonical form (a float, an int, a float array) or
raises ``ValueError`` naming the argument and showing what it got, so a bad epsilon,
delta or noise multiplier fails at the call that received it (DESIGN idea 8).
"""
from __future__ import annotations

import math
import numbers
import reprlib
from collections.abc import Collection
from typing import Any

import numpy as np

__all__ = ["real", "positive", "integer", "fraction", "one_of", "positive_vector", "shown"]

_SHOW = reprlib.Repr()
_SHOW.maxlist = _SHOW.maxtuple = 8
_SHOW.maxstring = _SHOW.maxother = 80


def shown(value: Any) -> str:
    """A short repr of ``value`` for an error message (long sequences are cut)."""
    return _SHOW.repr(value)


def real(name: str, value: Any) -> float:
    """``value`` (a real number or a 0-d numeric array) as a float; bools, strings and other
    non-numbers are refused (NaN and inf pass)."""
    scalar_array = isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iuf"
    if isinstance(value, bool) or not (isinstance(value, numbers.Real) or scalar_array):
        raise ValueError(f"{name} must be a real number; got {shown(value)}.")
    return float(value)


def positive(name: str, value: Any, *, allow_zero: bool = False, allow_inf: bool = False) -> float:
    """A number ``> 0`` (``>= 0`` with ``allow_zero``), finite unless ``allow_inf``."""
    v = real(name, value)
    in_range = v >= 0.0 if allow_zero else v > 0.0
    if math.isnan(v) or not in_range or (math.isinf(v) and not allow_inf):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a {'' if allow_inf else 'finite '}number {bound}; got {shown(value)}.")
    return v


def integer(name: str, value: Any, *, minimum: int = 0) -> int:
    """An integer ``>= minimum``; a float with an integral value (``3.0``) counts as one."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if not (isinstance(value, numbers.Real) and not isinstance(value, bool) and float(value).is_integer()):
            raise ValueError(f"{name} must be an integer >= {minimum}; got {shown(value)}.")
    out = int(value)
    if out < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {shown(value)}.")
    return out


def fraction(name: str, value: Any, *, zero: bool = False, one: bool = False, hint: str = "") -> float:
    """A number in the open unit interval (0, 1); ``zero`` / ``one`` close it at that end.

    ``hint`` (e.g. ``" (batch size / population size)"``) follows the interval in the message.
    """
    v = real(name, value)
    if not ((v >= 0.0 if zero else v > 0.0) and (v <= 1.0 if one else v < 1.0)):
        interval = ("[" if zero else "(") + "0, 1" + ("]" if one else ")")
        raise ValueError(f"{name} must lie in {interval}{hint}; got {shown(value)}.")
    return v


def one_of(name: str, value: Any, choices: Collection) -> Any:
    """``value`` itself if it is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}; got {shown(value)}.")
    return value


def positive_vector(name: str, values: Any, *, allow_zero: bool = False) -> np.ndarray:
    """A non-empty 1-d float64 array of finite numbers ``> 0`` (``>= 0`` with ``allow_zero``)."""
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        arr = None
    ok = arr is not None and arr.ndim == 1 and arr.size > 0 and bool(np.all(np.isfinite(arr)))
    if ok:
        ok = bool(np.all(arr >= 0)) if allow_zero else bool(np.all(arr > 0))
    if not ok:
        kind = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{name} must be a non-empty 1-d sequence of {kind} finite numbers; got {shown(values)}.")
    return arr
