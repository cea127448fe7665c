"""Errors every layer may raise, and the one formatter of validation problems.

This module sits at the bottom of the package (it imports nothing from fedveil), so
that privacy, algorithms and data can reject bad input without importing ``config``.
"""
from __future__ import annotations

import difflib
import inspect

from pydantic import BaseModel, ValidationError


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the field and the fix."""


def format_validation_error(err: ValidationError, joiner: str = "; ", model: type[BaseModel] | None = None) -> str:
    """Problems as ``data.partition: alpha: Input should be greater than 0 (got -1)``; with the
    ``model`` that was validated, an unknown key also gets a did-you-mean from the real names."""
    lines = []
    for problem in err.errors():
        where = ".".join(str(p) for p in problem["loc"]) or "config"
        msg = problem["msg"].removeprefix("Value error, ")
        shows_input = problem["type"] not in ("missing", "value_error") and not isinstance(problem.get("input"), dict)
        got = f" (got {problem['input']!r})" if shows_input else ""
        hint = did_you_mean(model, problem["loc"]) if model is not None and problem["type"] == "extra_forbidden" else ""
        lines.append(f"{where}: {msg}{got}{hint}")
    return joiner.join(lines)


def _section(model: type[BaseModel], field: str) -> type[BaseModel] | None:
    annotation = model.model_fields[field].annotation
    return annotation if inspect.isclass(annotation) and issubclass(annotation, BaseModel) else None


def fields_by_path(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], list[str]]:
    """Every (sub)section's path and its field names."""
    out = {prefix: list(model.model_fields)}
    for name in model.model_fields:
        section = _section(model, name)
        if section is not None:
            out.update(fields_by_path(section, prefix + (name,)))
    return out


def did_you_mean(model: type[BaseModel], loc: tuple) -> str:
    """`` (did you mean 'federation.rounds'?)`` for the unknown key at ``loc``: the closest name
    in its own section, else the section that has a setting of that name, else nothing."""
    *parents, key = (str(p) for p in loc)
    sections = fields_by_path(model)
    here = sections.get(tuple(parents))
    if here is None:
        return ""
    close = difflib.get_close_matches(key, here, n=1, cutoff=0.6)
    if close:
        return f" (did you mean '{'.'.join([*parents, close[0]])}'?)"
    owners = [".".join(path + (key,)) for path, names in sections.items() if key in names and path != tuple(parents)]
    if owners:
        return f" (did you mean '{owners[0]}'?)" if len(owners) == 1 else f" (it is a setting of: {', '.join(owners)})"
    return f"; accepted: {', '.join(here)}" if here else "; it takes no parameters"


__all__ = ["ConfigError", "did_you_mean", "fields_by_path", "format_validation_error"]
