"""The configuration of one ECOS job (``fedveil ecos CONFIG.toml``): a TOML file, validated
before any work, with one-line errors that name the dotted key (spec 000 part 2, PART B).

An ECOS job is not a federated round loop, so it has its own small config (not
:mod:`fedveil.config`'s ``RunConfig``)::

    seed = 1                      # model, pool clustering, noise, selection, training
    [data]                        # the data set, the client's domain and the cloud split (B.8)
    name = "digit_domains_synthetic"
    root = "../../shared/data/mnist-10k"   # relative: against this file's folder
    options = { rows_per_domain = 1600, test_rows_per_domain = 400, size = 16 }
    client_domain = "svhn_like"   # or its index, 1
    cloud = "ID+OoD"              # "OoD", "ID+OoD" or "ID"
    [ecos]                        # ECOSSettings' fields, the method and the budget B
    method = "ecos"
    budget = 1000
    [labels]                      # who labels the selection: "true" (case 1) or "private_knn" (case 3)
    source = "true"
    [cloud]                       # the cloud's model and CloudSGD's fields
    model = "lenet"
    [cloud.fixmatch]              # FixMatchSettings' fields (trainer = "fixmatch")

Every section and key is optional; the defaults follow the ECOS paper's Digits setting
(spec 005): ``hog_color`` features on 4x4 cells, R = 100,
sigma 25, gamma 0.8, s = 1, cluster-size cap, PLD at delta 1e-5, LeNet of width 0.5 and
:class:`~fedveil.ecos.cloud_training.CloudSGD`'s defaults.  :meth:`ECOSJobConfig.to_dict`
holds every value, defaults filled in (the job's ``config.json``).

Decisions: ``labels.per_class = "all"`` stands for ``None`` (every query's label; TOML has no
null); ``data.split_seed`` defaults to ``seed``; ``data.options`` defaults, for
``digit_domains_synthetic``, to ``ecos_digits``' CPU-scale data (:data:`DEFAULT_OPTIONS`);
a relative ``data.root`` in a file is read against the file's folder, one given as an
override against the working directory; without a root the loader looks under
``$FEDVEIL_DATA``.  The KNN and FixMatch fields are validated and recorded even when the
labels are true or the trainer supervised.
"""
from __future__ import annotations

import dataclasses
import difflib
import inspect
import numbers
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..data import DATASETS
from ..config_file import read_config_file
from ..errors import ConfigError
from ..models import MODELS
from ..models.zoo import model_options
from ..registry import UnknownNameError
from .cloud_training import CloudSGD
from .features import EXTRACTORS
from .fixmatch import FixMatchSettings
from .pipeline import METHODS, ECOSSettings
from .private_knn import KNNSettings
from .splits import SPLITS

__all__ = [
    "CloudSection", "DEFAULT_OPTIONS", "DataSection", "ECOSJobConfig", "ECOSSection", "LABEL_SOURCES", "LabelsSection",
    "TRAINERS", "ecos_config_from_dict", "load_ecos_config",
]

#: Who labels the selection: a third party with the true labels (B.6 Case 1) or the client by private kNN (Case 3).
LABEL_SOURCES = ("true", "private_knn")
#: How the cloud trains on the labelled selection.
TRAINERS = ("supervised", "fixmatch")
#: ``data.options`` when not given, per data set: ecos_digits' CPU-scale Digits.
DEFAULT_OPTIONS: dict[str, dict[str, Any]] = {
    "digit_domains_synthetic": {"rows_per_domain": 1600, "test_rows_per_domain": 400, "size": 16, "seed": 0},
}
HOG_OPTIONS = {"cells": 4, "bins": 9, "block": 1}
ALL_LABELS = "all"  # labels.per_class: every query's label (None)
_LOADER_FIXED = ("root", "download")  # loader arguments set by [data] itself, not by its options


# ------------------------------------------------------------------------------ sections


@dataclasses.dataclass(frozen=True)
class DataSection:
    """``[data]``: data set ``name`` (its train split needs a per-row ``"domain"`` group),
    its ``root`` (None: the loader's default under ``$FEDVEIL_DATA``), ``download``, loader
    ``options``, the client's domain (index or name), the ``cloud`` split and its seed."""

    name: str = "digit_domains_synthetic"
    root: str | None = None
    download: bool = True
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    client_domain: int | str = 1
    cloud: str = "OoD"
    split_seed: int = 0


@dataclasses.dataclass(frozen=True)
class ECOSSection:
    """``[ecos]``: selection ``method`` (:data:`~fedveil.ecos.pipeline.METHODS`), ``budget``
    B and the :class:`~fedveil.ecos.pipeline.ECOSSettings` (its fields flat in the section)."""

    method: str
    budget: int
    settings: ECOSSettings


@dataclasses.dataclass(frozen=True)
class LabelsSection:
    """``[labels]``: ``source`` (:data:`LABEL_SOURCES`) and, flat in the section, the
    :class:`~fedveil.ecos.private_knn.KNNSettings` of ``"private_knn"``."""

    source: str
    knn: KNNSettings


@dataclasses.dataclass(frozen=True)
class CloudSection:
    """``[cloud]``: zoo ``model`` and ``model_options``, ``trainer`` (:data:`TRAINERS`), the
    :class:`~fedveil.ecos.cloud_training.CloudSGD` fields flat in the section and
    ``[cloud.fixmatch]``'s :class:`~fedveil.ecos.fixmatch.FixMatchSettings`."""

    model: str
    model_options: dict[str, Any]
    trainer: str
    sgd: CloudSGD
    fixmatch: FixMatchSettings


@dataclasses.dataclass(frozen=True)
class ECOSJobConfig:
    """One validated ECOS job (see the module docstring)."""

    seed: int
    data: DataSection
    ecos: ECOSSection
    labels: LabelsSection
    cloud: CloudSection

    @property
    def private_labels(self) -> bool:
        return self.labels.source == "private_knn"

    def to_dict(self) -> dict[str, Any]:
        """Every value, defaults filled in, in the TOML file's shape (JSON-compatible)."""
        settings = dataclasses.asdict(self.ecos.settings)
        knn = dataclasses.asdict(self.labels.knn)
        if knn["per_class"] is None:
            knn["per_class"] = ALL_LABELS
        cloud = {"model": self.cloud.model, "model_options": dict(self.cloud.model_options),
                 "trainer": self.cloud.trainer, **dataclasses.asdict(self.cloud.sgd),
                 "fixmatch": dataclasses.asdict(self.cloud.fixmatch)}
        return {
            "seed": self.seed,
            "data": dataclasses.asdict(self.data),
            "ecos": {"method": self.ecos.method, "budget": self.ecos.budget, **settings},
            "labels": {"source": self.labels.source, **knn},
            "cloud": cloud,
        }


# ------------------------------------------------------------------------------ checks


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _unknown(where: str, key: str, known: list[str]) -> ConfigError:
    """An unknown key with a did-you-mean from ``known`` (the real names)."""
    dotted = f"{where}.{key}" if where else key
    hint = difflib.get_close_matches(key, known, n=1)
    prefix = f"{where}." if where else ""
    did_you_mean = f"; did you mean {prefix}{hint[0]}?" if hint else ""
    choices = ", ".join(known) if known else "none"
    return ConfigError(f"{dotted}: unknown key{did_you_mean} (known: {choices})")


def _table(where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be a table of keys, e.g. [{where}]; got {value!r}")
    return dict(value)


def _check_keys(where: str, table: Mapping[str, Any], known: list[str]) -> None:
    for key in table:
        if key not in known:
            raise _unknown(where, key, known)


def _bad(dotted: str, err: Exception) -> ConfigError:
    """``dotted``'s value error, the field name not repeated (``ecos.R must be ...``)."""
    message = _one_line(err)
    field = dotted.rsplit(".", 1)[-1]
    if message.startswith(f"{field} "):
        return ConfigError(f"{dotted} {message[len(field) + 1:]}")
    return ConfigError(f"{dotted}: {message}")


def _build(cls: type, where: str, values: dict[str, Any], base: dict[str, Any]) -> Any:
    """``cls(**base, **values)``, each value first tried alone on ``base`` so that an error
    names its key."""
    for key, value in values.items():
        try:
            cls(**{**base, key: value})
        except (ValueError, TypeError) as err:
            raise _bad(f"{where}.{key}", err) from None
    try:
        return cls(**{**base, **values})
    except (ValueError, TypeError) as err:
        raise ConfigError(f"{where}: {_one_line(err)}") from None


def _string(dotted: str, value: Any, choices: tuple[str, ...] | None = None) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{dotted} must be a string; got {value!r}")
    if choices is not None and value not in choices:
        hint = difflib.get_close_matches(value, choices, n=1)
        did_you_mean = f" (did you mean '{hint[0]}'?)" if hint else ""
        raise ConfigError(f"{dotted} must be one of {', '.join(choices)}; got {value!r}{did_you_mean}")
    return value


def _integer(dotted: str, value: Any, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{dotted} must be an integer; got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{dotted} must be an integer >= {minimum}; got {value!r}")
    return int(value)


def _options(dotted: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{dotted} must be a table, e.g. {{ width = 0.5 }}; got {value!r}")
    return dict(value)


def _field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _keyword_names(fn: Any, skip: int) -> list[str]:
    """The keyword parameters of ``fn`` after its first ``skip`` positional ones."""
    params = list(inspect.signature(fn).parameters.values())[skip:]
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


# ------------------------------------------------------------------------------ sections


def _data(raw: dict[str, Any], seed: int, base_dir: Path | None) -> DataSection:
    known = _field_names(DataSection)
    _check_keys("data", raw, known)
    defaults = DataSection()
    name = _string("data.name", raw.get("name", defaults.name))
    try:
        loader = DATASETS.get(name)
    except UnknownNameError as err:
        raise ConfigError(f"data.name: {err}") from None
    root = raw.get("root")
    if root is not None:
        root = _string("data.root", root)
        path = Path(root).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        root = str(path.resolve()) if base_dir is not None else str(path)
    download = raw.get("download", defaults.download)
    if not isinstance(download, bool):
        raise ConfigError(f"data.download must be true or false; got {download!r}")
    options = _options("data.options", raw["options"]) if "options" in raw else dict(DEFAULT_OPTIONS.get(name, {}))
    accepted = [k for k in _keyword_names(loader, 1) if k not in _LOADER_FIXED]
    for key in options:
        if key in _LOADER_FIXED:
            raise ConfigError(f"data.options.{key}: set it as data.{key}, not as a loader option")
        if key not in accepted:
            raise _unknown("data.options", key, accepted)
    client = raw.get("client_domain", defaults.client_domain)
    if isinstance(client, str):
        if not client:
            raise ConfigError("data.client_domain must be a domain index or a non-empty domain name")
    else:
        client = _integer("data.client_domain", client, minimum=0)
    cloud = _string("data.cloud", raw.get("cloud", defaults.cloud), SPLITS)
    split_seed = _integer("data.split_seed", raw.get("split_seed", seed))
    return DataSection(name, root, download, options, client, cloud, split_seed)


def _ecos(raw: dict[str, Any]) -> ECOSSection:
    fields = _field_names(ECOSSettings)
    known = ["method", "budget", *fields]
    _check_keys("ecos", raw, known)
    method = _string("ecos.method", raw.get("method", "ecos"), METHODS)
    budget = _integer("ecos.budget", raw.get("budget", 1000), minimum=1)
    for key in ("extractor", "cap", "accountant"):
        if key in raw:
            _string(f"ecos.{key}", raw[key])
    values = {k: v for k, v in raw.items() if k in fields}
    if "extractor_options" in values:
        values["extractor_options"] = _options("ecos.extractor_options", values["extractor_options"])
    if values.get("epsilon_budget") is not None and isinstance(values["epsilon_budget"], str):
        raise ConfigError(f"ecos.epsilon_budget must be a number > 0; got {values['epsilon_budget']!r}")
    base = {"extractor": "hog_color", "extractor_options": dict(HOG_OPTIONS), "cap": "cluster_size"}
    if "extractor" in values and values["extractor"] != base["extractor"] and "extractor_options" not in values:
        base["extractor_options"] = {}  # another phi: its own defaults, not HOG's options
    settings = _build(ECOSSettings, "ecos", values, base)
    accepted = _keyword_names(EXTRACTORS[settings.extractor], 1)
    for key in settings.extractor_options:
        if key not in accepted:
            raise _unknown("ecos.extractor_options", key, accepted)
    return ECOSSection(method, budget, settings)


def _labels(raw: dict[str, Any]) -> LabelsSection:
    fields = _field_names(KNNSettings)
    _check_keys("labels", raw, ["source", *fields])
    source = _string("labels.source", raw.get("source", "true"), LABEL_SOURCES)
    values = {k: v for k, v in raw.items() if k in fields}
    if values.get("per_class") == ALL_LABELS:
        values["per_class"] = None
    elif isinstance(values.get("per_class"), str):
        raise ConfigError(f"labels.per_class must be an integer >= 1 or \"{ALL_LABELS}\"; got {values['per_class']!r}")
    return LabelsSection(source, _build(KNNSettings, "labels", values, {}))


def _cloud(raw: dict[str, Any]) -> CloudSection:
    sgd_fields, fix_fields = _field_names(CloudSGD), _field_names(FixMatchSettings)
    _check_keys("cloud", raw, ["model", "model_options", "trainer", *sgd_fields, "fixmatch"])
    model = _string("cloud.model", raw.get("model", "lenet"))
    try:
        MODELS.entry(model)
    except UnknownNameError as err:
        raise ConfigError(f"cloud.model: {err}") from None
    options = _options("cloud.model_options", raw.get("model_options", {"width": 0.5} if model == "lenet" else {}))
    accepted = list(model_options(model))
    for key in options:
        if key not in accepted:
            raise _unknown("cloud.model_options", key, accepted)
    trainer = _string("cloud.trainer", raw.get("trainer", "supervised"), TRAINERS)
    if "lr_schedule" in raw:
        _string("cloud.lr_schedule", raw["lr_schedule"])
    sgd = _build(CloudSGD, "cloud", {k: v for k, v in raw.items() if k in sgd_fields}, {})
    fixmatch = _table("cloud.fixmatch", raw.get("fixmatch", {}))
    _check_keys("cloud.fixmatch", fixmatch, fix_fields)
    return CloudSection(model, options, trainer, sgd, _build(FixMatchSettings, "cloud.fixmatch", fixmatch, {}))


SECTIONS = ("data", "ecos", "labels", "cloud")


def ecos_config_from_dict(raw: Mapping[str, Any], base_dir: str | Path | None = None) -> ECOSJobConfig:
    """Validate a raw config (a parsed TOML file, or :meth:`ECOSJobConfig.to_dict`'s output)
    into an :class:`ECOSJobConfig`, or raise a one-line :class:`~fedveil.errors.ConfigError`.
    ``base_dir``: the folder a relative ``data.root`` is read against (None: as given)."""
    raw = _table("config", raw)
    _check_keys("", raw, ["seed", *SECTIONS])
    seed = _integer("seed", raw.get("seed", 0))
    tables = {name: _table(name, raw.get(name, {})) for name in SECTIONS}
    return ECOSJobConfig(
        seed=seed,
        data=_data(tables["data"], seed, Path(base_dir) if base_dir is not None else None),
        ecos=_ecos(tables["ecos"]),
        labels=_labels(tables["labels"]),
        cloud=_cloud(tables["cloud"]),
    )


# ------------------------------------------------------------------------------ loading


def _parse_value(text: str) -> Any:
    """A CLI value as TOML (numbers, booleans, tables, quoted strings), else a bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _known_paths() -> list[tuple[str, ...]]:
    """Every settable key, as a path (``("ecos", "R")``)."""
    paths = [("seed",)]
    paths += [("data", f) for f in _field_names(DataSection)]
    paths += [("ecos", f) for f in ("method", "budget", *_field_names(ECOSSettings))]
    paths += [("labels", f) for f in ("source", *_field_names(KNNSettings))]
    paths += [("cloud", f) for f in ("model", "model_options", "trainer", *_field_names(CloudSGD))]
    paths += [("cloud", "fixmatch", f) for f in _field_names(FixMatchSettings)]
    return paths


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``raw`` with ``key=value`` overrides applied: dotted keys (``ecos.R=50``) as written, a
    bare key (``budget=50``) at the one setting of that name (ambiguous ones are refused)."""
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in raw.items()}
    if isinstance(out.get("cloud"), dict) and isinstance(out["cloud"].get("fixmatch"), Mapping):
        out["cloud"]["fixmatch"] = dict(out["cloud"]["fixmatch"])
    paths = _known_paths()
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"override '{item}' is not of the form key=value")
        path = tuple(key.split("."))
        if len(path) == 1 and path[0] != "seed":
            matches = [p for p in paths if p[-1] == path[0]]
            if len(matches) > 1:
                raise ConfigError(f"'{key}' is ambiguous: write one of {', '.join('.'.join(p) for p in matches)}")
            if not matches:
                raise _unknown("", key, sorted({".".join(p) for p in paths}))
            path = matches[0]
        node = out
        for i, part in enumerate(path[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"cannot set '{key}': '{'.'.join(path[: i + 1])}' is not a section")
            node = child
        node[path[-1]] = _parse_value(text)
    return out


def load_ecos_config(path: str | Path, overrides: list[str] | None = None) -> ECOSJobConfig:
    """Read an ECOS job's TOML file, apply ``key=value`` overrides and validate.  A relative
    ``data.root`` written in the file is read against the file's folder; one given as an
    override, against the working directory."""
    raw = read_config_file(path)
    return ecos_config_from_dict(apply_overrides(raw, list(overrides or [])), base_dir=Path.cwd())
