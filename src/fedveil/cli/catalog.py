"""Every component a config can name (algorithms, partitioners, models, data sets, noise
schedules) with its parameters, types and defaults: ``fedveil config show`` and the
component part of docs/config.md."""
from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass
from typing import Any, Callable

from pydantic import BaseModel

from ..errors import ConfigError
from ..registry import Registry


@dataclass(frozen=True)
class Param:
    """One parameter of a component as the tables show it: name, type, default and meaning, all text."""

    name: str
    type: str
    default: str
    meaning: str


@dataclass(frozen=True)
class Kind:
    """One kind of component: its registry, where its parameters go in a config, and how to
    read its parameters."""

    title: str
    registry: Callable[[], Registry]
    section: str
    params: Callable[[Any], list[Param]]


def _pydantic_params(model: type[BaseModel], skip: tuple[str, ...] = ()) -> list[Param]:
    out = []
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        default = repr(field.default_factory()) if field.default_factory is not None else repr(field.default)
        out.append(Param(name, _type_name(field.annotation), "required" if field.is_required() else default,
                         field.description or ""))
    return out


def _signature_params(fn: Callable, skip: tuple[str, ...]) -> list[Param]:
    out = []
    for name, p in inspect.signature(fn).parameters.items():
        if name in skip:
            continue
        default = "required" if p.default is inspect.Parameter.empty else repr(p.default)
        out.append(Param(name, str(p.annotation).strip("'") if p.annotation is not inspect.Parameter.empty else "",
                         default, ""))
    return out


def _model_params(fn: Callable) -> list[Param]:
    """A model builder's options, each with its line from :mod:`fedveil.models.option_notes`."""
    from ..models import MODELS
    from ..models.option_notes import option_note

    name = next(e.name for e in MODELS.entries() if e.obj is fn)
    return [Param(p.name, p.type, p.default, option_note(name, p.name))
            for p in _signature_params(fn, ("input_shape", "num_classes"))]


def _type_name(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if isinstance(annotation, type) else None
    return text or str(annotation).replace("typing.", "")


def _algorithms() -> Registry:
    from ..algorithms import ALGORITHMS

    return ALGORITHMS


def _partitioners() -> Registry:
    from ..data import PARTITIONERS

    return PARTITIONERS


def _models() -> Registry:
    from ..models import MODELS

    return MODELS


def _datasets() -> Registry:
    from ..data import DATASETS

    return DATASETS


def _schedules() -> Registry:
    from ..privacy.schedules import SCHEDULES

    return SCHEDULES


KINDS = (
    Kind("algorithm", _algorithms, "[algorithm] (name = ...)", lambda obj: _pydantic_params(obj.Params)),
    Kind("partitioner", _partitioners, "[data.partition] (name = ...)", lambda obj: _pydantic_params(obj.Params)),
    Kind("model", _models, "[model] options = { ... }", _model_params),
    Kind("data set", _datasets, "[data] options = { ... }", lambda fn: _signature_params(fn, ("root", "download"))),
    Kind("noise schedule", _schedules, "[privacy.noise_schedule] (name = ...; R and T are set by the run)",
         lambda params: _pydantic_params(params, skip=("R", "T"))),
)


def params_table(params: list[Param], markdown: bool = False) -> str:
    """``params`` as aligned text columns, or a markdown table with ``markdown``."""
    if not params:
        return "(no parameters)" if not markdown else "_no parameters_"
    if markdown:
        rows = ["| parameter | type | default | meaning |", "|---|---|---|---|"]
        cell = lambda text: text.replace("|", "\\|")  # noqa: E731  (a type such as `int | None`)
        rows += [f"| `{p.name}` | `{cell(p.type)}` | `{cell(p.default)}` | {cell(p.meaning)} |".replace("``", "")
                 for p in params]
        return "\n".join(rows)
    widths = [max(len(getattr(p, f)) for p in params) for f in ("name", "type", "default")]
    return "\n".join(
        f"  {p.name:<{widths[0]}}  {p.type:<{widths[1]}}  {p.default:<{widths[2]}}  {p.meaning}".rstrip() for p in params
    )


ECOS_JOB = "ecos"


def ecos_job_toml() -> str:
    """``fedveil config show ecos``: the default ECOS job (``fedveil ecos CONFIG``), every key."""
    from ..runtime.ecos_config import ECOSJobConfig

    return ("# ECOS job: fedveil ecos CONFIG.toml [section.key=value ...]; sections and keys in docs/ecos.md\n"
            + to_toml(ECOSJobConfig().to_dict()))


PETS_JOB = "pets"


def pets_job_toml() -> str:
    """``fedveil config show pets``: the default PETs job (``fedveil pets CONFIG``), every key."""
    from ..runtime.pets_job import PetsConfig, PetsData, PetsSynthetic

    config = PetsConfig(data=PetsData(synthetic=PetsSynthetic()))
    return ("# PETs job: fedveil pets CONFIG.toml [section.key=value ...]; data.dir = \"FOLDER\" in place of\n"
            "# data.synthetic reads the challenge's CSV tables; sections and keys in docs/pets.md\n"
            + to_toml(config.model_dump(mode="json", exclude_none=True)))


def show(name: str) -> str:
    """What ``name`` is (every kind that has a component of that name), its description and
    its parameters, or the default job of ``ecos`` or ``pets``; an unknown name is a
    ConfigError with the nearest names."""
    if name == ECOS_JOB:
        return ecos_job_toml()
    if name == PETS_JOB:
        return pets_job_toml()
    parts = []
    known: list[str] = [ECOS_JOB, PETS_JOB]
    for kind in KINDS:
        registry = kind.registry()
        known += registry.names()
        if name in registry:
            entry = registry.entry(name)
            parts.append(f"{name}: {kind.title} — {entry.description}\n  set in {kind.section}\n"
                         f"{params_table(kind.params(entry.obj))}")
    if not parts:
        close = difflib.get_close_matches(name, known, n=3)
        hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
        raise ConfigError(f"no algorithm, partitioner, model, data set, noise schedule or job is called '{name}'{hint}")
    return "\n\n".join(parts)


def markdown_reference() -> str:
    """Every component of every kind with its parameter table (docs/config.md)."""
    lines = []
    for kind in KINDS:
        lines.append(f"\n## Every {kind.title}\n\nSet in `{kind.section}`.\n")
        for entry in kind.registry().entries():
            lines.append(f"### {kind.title} `{entry.name}`\n\n{entry.description}\n\n"
                         f"{params_table(kind.params(entry.obj), markdown=True)}\n")
    return "\n".join(lines)


def default_config_toml() -> str:
    """The complete default config as TOML (every section, every default)."""
    from ..config import RunConfig

    return to_toml(RunConfig().model_dump())


def to_toml(tree: dict[str, Any], prefix: str = "") -> str:
    """``tree`` (nested dicts) as TOML text under the table
    ``prefix``: scalars first, unset keys commented, then sub-tables."""
    from ..runtime.sweep_plan import toml_literal

    scalars = [f"{k} = {toml_literal(v)}" for k, v in tree.items() if v is not None and not _is_table(v)]
    unset = [f"# {k} = (unset)" for k, v in tree.items() if v is None]
    body = "\n".join(scalars + unset)
    out = (f"[{prefix}]\n" if prefix else "") + body + ("\n" if body else "")
    for key, value in tree.items():
        if _is_table(value):
            out += "\n" + to_toml(value, f"{prefix}.{key}" if prefix else key)
    return out


def _is_table(value: Any) -> bool:
    return isinstance(value, dict) and bool(value)
