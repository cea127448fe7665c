"""Regenerate docs/config.md from the typed config models: `python scripts/gen_config_doc.py`."""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Literal, get_args, get_origin

from pydantic import BaseModel

from fedveil.cli.catalog import markdown_reference
from fedveil.config import RunConfig

HEADER = """# Configuration reference

A run is configured by one TOML file and/or `key=value` overrides on the command line
(`fedveil run CONFIG.toml federation.rounds=50 data.partition.alpha=0.1`). Every field
is validated before any work starts. Component sections (`[data.partition]`,
`[algorithm]`) take the chosen component's own hyper-parameters: list them with
`fedveil partitions` / `fedveil algorithms` and see the modules' docstrings. A misspelt
key is refused with the nearest real name (`federation.roundz` -> `federation.rounds`,
`[dataa]` -> `[data]`, a bare `roundz=` -> `federation.rounds`), and an unknown algorithm or
partitioner parameter lists the accepted ones.

This page is generated from `fedveil/config.py` by `scripts/gen_config_doc.py`.
"""


def _default(field) -> str:
    if field.default_factory is not None:
        return "(section)" if isinstance(field.default_factory(), BaseModel) else repr(field.default_factory())
    return repr(field.default)


_SYMBOLS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


def _limit(meta) -> str:
    for attr, symbol in _SYMBOLS.items():
        if getattr(meta, attr, None) is not None:
            return f"({symbol} {getattr(meta, attr)})"
    return ""


def _type_name(ann) -> str:
    if get_origin(ann) is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(ann))
    return getattr(ann, "__name__", str(ann)).replace("typing.", "").replace(" | ", " or ")


def section(name: str, model: type[BaseModel]) -> list[str]:
    lines = [f"\n## `[{name}]`\n"] if name else ["\n## top level\n"]
    doc = inspect.cleandoc(model.__doc__ or "")
    if doc and not doc.startswith("!"):
        lines.append(doc + "\n")
    lines += ["| field | type | default | meaning |", "|---|---|---|---|"]
    nested = []
    for key, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            nested.append((f"{name}.{key}" if name else key, ann))
            continue
        kind = _type_name(ann)
        meaning = field.description or ""
        limits = [_limit(m) for m in field.metadata if _limit(m)]
        lines.append(f"| `{key}` | `{kind}` | `{_default(field)}` | {meaning} {' '.join(limits)} |")
    for sub_name, sub in nested:
        lines += section(sub_name, sub)
    return lines


DOC_PATH = Path(__file__).resolve().parents[1] / "docs" / "config.md"


COMPONENTS = """
# Components and their parameters

Every algorithm, partitioner, model, data set and noise schedule a config can name, with
its parameters and defaults (`fedveil config show NAME` prints one; `fedveil config show`
prints the complete default config as TOML). A run's `config.json` holds the chosen
algorithm's and partitioner's parameters with every default filled in.
"""


def render() -> str:
    return HEADER + "\n".join(section("", RunConfig)) + "\n" + COMPONENTS + markdown_reference() + "\n"


if __name__ == "__main__":
    DOC_PATH.write_text(render())
    print(f"wrote {DOC_PATH}")
