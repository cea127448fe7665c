"""Errors every layer may raise, and the one formatter of validation problems.

This module sits at the bottom of the package (it imports nothing from fedveil), so
that privacy, algorithms and data can reject bad input without importing ``config``.
"""
from __future__ import annotations

from pydantic import ValidationError


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the field and the fix."""


def format_validation_error(err: ValidationError, joiner: str = "; ") -> str:
    """Problems as ``data.partition: alpha: Input should be greater than 0 (got -1)``."""
    lines = []
    for problem in err.errors():
        where = ".".join(str(p) for p in problem["loc"]) or "config"
        msg = problem["msg"].removeprefix("Value error, ")
        shows_input = problem["type"] not in ("missing", "value_error") and not isinstance(problem.get("input"), dict)
        got = f" (got {problem['input']!r})" if shows_input else ""
        lines.append(f"{where}: {msg}{got}")
    return joiner.join(lines)


__all__ = ["ConfigError", "format_validation_error"]
