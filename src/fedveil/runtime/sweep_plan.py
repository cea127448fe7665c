"""What a sweep runs: a base config, fixed overrides and axes (config keys with several
values), expanded into one run per point of their grid (or, zipped, one per position).

An axis comes from the command line as ``key=v1,v2,v3`` (commas inside ``[...]``,
``{...}`` or quotes do not split: ``model.options.hidden=[32],[64,64]`` is two values)
or from the config file's ``[sweep]`` table, whose leaves are lists of values::

    [sweep]
    seed = [0, 1, 2]
    privacy.epsilon = [1, 4, 8]      # a dotted TOML key, i.e. [sweep.privacy] epsilon = [...]
    mode = "grid"                    # or "zip": the i-th values of every axis together
"""
from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import RunConfig, apply_overrides, validate
from ..config_file import read_config_file
from ..errors import ConfigError

SWEEP_TABLE = "sweep"
MODES = ("grid", "zip")


@dataclass(frozen=True)
class Axis:
    """One swept config key and its values, each as the TOML text an override takes."""

    key: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class SweepPoint:
    """One run of a sweep: its folder name, a short label and the overrides that make it."""

    name: str
    label: str
    overrides: tuple[str, ...]


@dataclass(frozen=True)
class SweepPlan:
    """A base config (the raw TOML table, without ``[sweep]``), overrides every run gets,
    the axes and how they combine."""

    base: dict[str, Any]
    fixed: tuple[str, ...]
    axes: tuple[Axis, ...]
    mode: str = "grid"

    def points(self) -> list[SweepPoint]:
        """Every run, in order: the last axis varies fastest (grid) or all move together (zip)."""
        if self.mode == "zip":
            combos = list(zip(*(a.values for a in self.axes)))
        else:
            combos = list(itertools.product(*(a.values for a in self.axes)))
        shorts = short_keys([a.key for a in self.axes])
        width = len(str(len(combos) - 1))
        points = []
        for i, combo in enumerate(combos):
            label = " ".join(f"{s}={v}" for s, v in zip(shorts, combo))
            name = f"{i:0{width}d}_" + "_".join(f"{s}={_safe(v)}" for s, v in zip(shorts, combo))
            overrides = self.fixed + tuple(f"{a.key}={v}" for a, v in zip(self.axes, combo))
            points.append(SweepPoint(name, label, overrides))
        return points

    def configs(self) -> list[RunConfig]:
        """Every run's validated config, in the order of :meth:`points`; a bad value in any
        run is a ConfigError naming that run, before anything runs."""
        out = []
        for point in self.points():
            try:
                out.append(validate(apply_overrides(self.base, list(point.overrides))))
            except ConfigError as err:
                raise ConfigError(f"sweep run {point.label}: {err}") from None
        return out

    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready data (what ``sweep.json`` holds): base, fixed, axes as ``[key, values]``, mode."""
        return {"base": self.base, "fixed": list(self.fixed), "axes": [[a.key, list(a.values)] for a in self.axes],
                "mode": self.mode}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SweepPlan":
        """The plan that :meth:`to_dict` wrote."""
        axes = tuple(Axis(key, tuple(values)) for key, values in data["axes"])
        return cls(data["base"], tuple(data["fixed"]), axes, data["mode"])


def plan_sweep(path: str | Path | None, overrides: list[str], mode: str | None = None) -> SweepPlan:
    """The sweep of config file ``path`` (its ``[sweep]`` table) and the command line's
    overrides: an override with several comma-separated values is an axis (it takes the
    place of a ``[sweep]`` axis of the same key), any other is fixed. ``mode`` overrides the table's."""
    base, table_axes, table_mode = _read_config(path)
    fixed, cli_axes = [], []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key=value")
        key, text = (part.strip() for part in item.split("=", 1))
        values = split_values(text)
        if len(values) > 1:
            cli_axes.append(Axis(key, tuple(values)))
        else:
            fixed.append(f"{key}={text}")
    given = {a.key: a for a in cli_axes}
    axes = [given.pop(a.key, a) for a in table_axes] + list(given.values())
    mode = mode or table_mode
    if mode not in MODES:
        raise ConfigError(f"sweep mode '{mode}' is not one of {', '.join(MODES)}")
    if not axes:
        raise ConfigError("nothing to sweep: give a key with several values (e.g. seed=0,1,2) or a [sweep] table")
    for axis in axes:
        if len(set(axis.values)) < len(axis.values):
            raise ConfigError(f"sweep axis '{axis.key}' repeats a value: {','.join(axis.values)}")
    if mode == "zip" and len({len(a.values) for a in axes}) > 1:
        sizes = ", ".join(f"{a.key} has {len(a.values)}" for a in axes)
        raise ConfigError(f"a zipped sweep needs axes of one length: {sizes}")
    return SweepPlan(base, tuple(fixed), tuple(axes), mode)


def split_values(text: str) -> list[str]:
    """``1,4,8`` -> ``['1', '4', '8']``; commas inside brackets, braces or quotes do not split."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    if len(parts) > 1 and not all(parts):
        raise ConfigError(f"sweep values '{text}' have an empty entry")
    return parts


def short_keys(keys: list[str]) -> list[str]:
    """Each key's last component (``privacy.epsilon`` -> ``epsilon``), or the whole key
    where two keys would share it."""
    lasts = [k.rsplit(".", 1)[-1] for k in keys]
    return [last if lasts.count(last) == 1 else key for key, last in zip(keys, lasts)]


def toml_literal(value: Any) -> str:
    """``value`` (from a parsed TOML table) as the TOML text an override takes."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (int, float, str)):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_literal(v)}" for k, v in value.items()) + " }"
    raise ConfigError(f"sweep value {value!r} has no TOML form")


def _read_config(path: str | Path | None) -> tuple[dict[str, Any], list[Axis], str]:
    if path is None:
        return {}, [], "grid"
    raw = read_config_file(path)
    table = raw.pop(SWEEP_TABLE, {})
    if not isinstance(table, dict):
        raise ConfigError(f"[{SWEEP_TABLE}] in '{path}' must be a table of key = [values]")
    mode = table.pop("mode", "grid")
    return raw, [Axis(key, tuple(toml_literal(v) for v in values)) for key, values in _axes(table)], mode


def _axes(table: dict[str, Any], prefix: str = "") -> list[tuple[str, list[Any]]]:
    out = []
    for key, value in table.items():
        if isinstance(value, dict):
            out += _axes(value, f"{prefix}{key}.")
        elif isinstance(value, list) and value:
            out.append((prefix + key, value))
        else:
            raise ConfigError(f"[{SWEEP_TABLE}] {prefix}{key} must be a non-empty list of values, got {value!r}")
    return out


def _safe(text: str) -> str:
    """A value as a file-name fragment."""
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", text).strip("_") or "_"
