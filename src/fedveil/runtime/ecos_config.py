"""The configuration of one ECOS job (``fedveil ecos CONFIG.toml [section.key=value ...]``): a
TOML file, validated before any work, with one-line errors that name the dotted key (spec 000
part 2, PART B).

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
``$FEDVEIL_DATA``.  A bare override key (``budget=50``) sets the one setting of that name.
The KNN and FixMatch fields are validated and recorded even when the labels are true or the
trainer supervised.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from ..config import Section, apply_dotted_overrides
from ..config_file import read_config_file
from ..data import DATASETS
from ..ecos.cloud_training import LR_SCHEDULES, CloudSGD
from ..ecos.features import EXTRACTORS
from ..ecos.fixmatch import FixMatchSettings
from ..ecos.pipeline import METHODS, ECOSSettings
from ..ecos.private_knn import KNNSettings
from ..ecos.selection import CAPS
from ..ecos.splits import SPLITS
from ..errors import ConfigError, format_validation_error
from ..models import MODELS
from ..models.zoo import check_model_options
from ..options import check_options
from ..privacy.composition import ACCOUNTANTS
from ..registry import Registry, UnknownNameError
from .dataset import check_loader_options

__all__ = [
    "DEFAULT_OPTIONS", "ECOSCloud", "ECOSData", "ECOSFixMatch", "ECOSJobConfig", "ECOSLabels", "ECOSMethod",
    "LABEL_SOURCES", "TRAINERS", "load_ecos_config",
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
_ECOS, _KNN, _SGD, _FIXMATCH = ECOSSettings(), KNNSettings(), CloudSGD(), FixMatchSettings()  # their defaults


def _settings(cls: type, section: Section, **values: Any) -> Any:
    """``cls`` (a settings dataclass) from the section's fields of the same names, or ``values``."""
    return cls(**{**{name: getattr(section, name) for name in cls.__dataclass_fields__}, **values})


class _Finite(Section):
    """A section whose numbers are finite, as the ECOS settings dataclasses require."""

    model_config = ConfigDict(allow_inf_nan=False)


class ECOSData(Section):
    """The data set (its train split needs a per-row ``"domain"`` group), the client's domain
    and the cloud split (B.8)."""

    name: str = Field("digit_domains_synthetic", description="data set (`fedveil datasets`) with a 'domain' group")
    root: str | None = Field(None, description="data directory; None: the loader's default under $FEDVEIL_DATA")
    download: bool = Field(True, description="download from the canonical source when files are missing")
    options: dict[str, Any] | None = Field(
        None, validate_default=True, description="loader options; None: ecos_digits' CPU-scale data "
        "for digit_domains_synthetic (DEFAULT_OPTIONS), else the loader's defaults"
    )
    client_domain: int | str = Field(1, description="the client's domain: its index or its name")
    cloud: Literal[SPLITS] = Field("OoD", description="the cloud's rows: OoD (other domains), ID+OoD or ID (B.8)")
    split_seed: int | None = Field(None, description="seed of the client / cloud split; None: the job's seed")

    @field_validator("name")
    @classmethod
    def _known_dataset(cls, name: str) -> str:
        return _registered(DATASETS, name)

    @field_validator("root")
    @classmethod
    def _absolute_root(cls, root: str | None) -> str | None:
        """Against the working directory (a file's own roots are already read against its folder)."""
        return None if root is None else str(Path(root).expanduser().resolve())

    @field_validator("options")
    @classmethod
    def _loader_options(cls, options: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        name = info.data.get("name")
        if name is None:  # refused above
            return options
        if options is None:
            return dict(DEFAULT_OPTIONS.get(name, {}))
        for key in ("root", "download"):
            if key in options:
                raise ValueError(f"set {key} as data.{key}, not as a loader option")
        try:
            check_loader_options(name, options)
        except ValueError as err:
            raise ValueError(str(err).removeprefix("data.options: ")) from None
        return options

    @field_validator("client_domain")
    @classmethod
    def _domain(cls, value: int | str) -> int | str:
        if value == "" or (isinstance(value, int) and value < 0):
            raise ValueError(f"must be a domain index >= 0 or a non-empty domain name; got {value!r}")
        return value


class ECOSMethod(_Finite):
    """``[ecos]``: the selection method, the budget B and
    :class:`~fedveil.ecos.pipeline.ECOSSettings`' fields (B.3-B.4)."""

    method: Literal[METHODS] = Field("ecos", description="ecos (Alg. 5.1), random, k_center or proximity")
    budget: int = Field(1000, ge=1, description="B: cloud rows to select at most")
    extractor: Literal[tuple(EXTRACTORS)] = Field("hog_color", description="phi: the public feature extractor")
    extractor_options: dict[str, Any] | None = Field(
        None, validate_default=True, description="phi's options; None: cells 4, bins 9, block 1 for hog_color, "
        "else the extractor's defaults"
    )
    R: int = Field(_ECOS.R, ge=1, description="cloud centroids")
    sigma: float = Field(_ECOS.sigma, gt=0.0, description="Gaussian noise on each coverage count")
    sample_rate: float = Field(_ECOS.sample_rate, gt=0.0, le=1.0, description="gamma: Poisson rate of the client's rows")
    scale_s: float = Field(_ECOS.scale_s, gt=0.0, description="s: the score scale")
    cap: Literal[CAPS] = Field(_ECOS.cap, description="Alg. 5.1 line 9's cap: cluster_size or pool_share")
    delta: float = Field(_ECOS.delta, gt=0.0, lt=1.0, description="delta the client's epsilon is reported at")
    accountant: Literal[ACCOUNTANTS] = Field(_ECOS.accountant, description="rdp or pld")
    epsilon_budget: float | None = Field(
        _ECOS.epsilon_budget, gt=0.0, description="refuse a job whose releases compose to more; None: no limit"
    )
    secure_rng: bool = Field(_ECOS.secure_rng, description="draw noise and subsamples from the OS's secure generator")

    @field_validator("extractor_options")
    @classmethod
    def _extractor_options(cls, options: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        extractor = info.data.get("extractor")
        if extractor is None:  # refused above
            return options
        if options is None:
            return dict(HOG_OPTIONS) if extractor == "hog_color" else {}
        check_options(EXTRACTORS[extractor], options, f"extractor '{extractor}'", skip_first=1)
        return options

    @property
    def settings(self) -> ECOSSettings:
        """The section as the pipeline's :class:`ECOSSettings`."""
        return _settings(ECOSSettings, self)


class ECOSLabels(_Finite):
    """``[labels]``: who labels the selection, and
    :class:`~fedveil.ecos.private_knn.KNNSettings`' fields for ``private_knn`` (B.5)."""

    source: Literal[LABEL_SOURCES] = Field(
        "true", description="true: a third party's true labels (case 1); private_knn: the client's (case 3)"
    )
    k: int = Field(_KNN.k, ge=1, description="neighbours of each query")
    sigma_votes: float = Field(_KNN.sigma_votes, gt=0.0, description="Gaussian noise on the votes")
    sigma_confidence: float = Field(_KNN.sigma_confidence, gt=0.0, description="Gaussian noise of the confidence check")
    sample_rate: float = Field(_KNN.sample_rate, gt=0.0, le=1.0, description="Poisson rate per query")
    per_class: int | Literal["all"] = Field(
        _KNN.per_class, description='labels released per noisy class (>= 1), or "all": every query\'s label'
    )

    @field_validator("per_class", mode="before")
    @classmethod
    def _count_or_all(cls, value: Any) -> Any:
        if (isinstance(value, str) and value != ALL_LABELS) or (isinstance(value, int | float) and value < 1):
            raise ValueError(f'must be an integer >= 1 or "{ALL_LABELS}"; got {value!r}')
        return value

    @property
    def knn(self) -> KNNSettings:
        """The section as the private kNN's :class:`KNNSettings`."""
        return _settings(KNNSettings, self, per_class=None if self.per_class == ALL_LABELS else self.per_class)


class ECOSFixMatch(_Finite):
    """``[cloud.fixmatch]``: :class:`~fedveil.ecos.fixmatch.FixMatchSettings` (trainer = fixmatch)."""

    unlabeled_weight: float = Field(_FIXMATCH.unlabeled_weight, ge=0.0, description="lambda_u")
    threshold: float = Field(_FIXMATCH.threshold, ge=0.0, le=1.0, description="tau on the pseudo-label's probability")
    unlabeled_ratio: int = Field(_FIXMATCH.unlabeled_ratio, ge=1, description="mu: unlabelled rows per labelled row")

    @property
    def settings(self) -> FixMatchSettings:
        """The section as :class:`FixMatchSettings`."""
        return _settings(FixMatchSettings, self)


class ECOSCloud(_Finite):
    """``[cloud]``: the cloud's zoo model, its trainer and
    :class:`~fedveil.ecos.cloud_training.CloudSGD`'s fields (B.6)."""

    model: str = Field("lenet", description="model (`fedveil models`)")
    model_options: dict[str, Any] | None = Field(
        None, validate_default=True, description="model options; None: { width = 0.5 } for lenet, else none"
    )
    trainer: Literal[TRAINERS] = Field("supervised", description="supervised, or fixmatch ([cloud.fixmatch])")
    epochs: int = Field(_SGD.epochs, ge=1, description="passes over the labelled selection")
    batch_size: int = Field(_SGD.batch_size, ge=0, description="0 = full batch")
    lr: float = Field(_SGD.lr, gt=0.0, description="SGD learning rate")
    momentum: float = Field(_SGD.momentum, ge=0.0, lt=1.0, description="SGD momentum")
    weight_decay: float = Field(_SGD.weight_decay, ge=0.0, description="SGD weight decay")
    steps: int | None = Field(_SGD.steps, ge=1, description="fixed steps; overrides epochs")
    lr_schedule: Literal[LR_SCHEDULES] = Field(
        _SGD.lr_schedule, description="the trainer's per-round schedule (constant, step, exponential, cosine, dann); "
        "the cloud trains in one round"
    )
    lr_decay: float = Field(_SGD.lr_decay, gt=0.0, description="decay factor of the step and exponential schedules")
    lr_step_rounds: int = Field(_SGD.lr_step_rounds, ge=1, description="rounds between decays of the step schedule")
    fixmatch: ECOSFixMatch = Field(default_factory=ECOSFixMatch, description="FixMatch's constants")

    @field_validator("model")
    @classmethod
    def _known_model(cls, model: str) -> str:
        return _registered(MODELS, model)

    @field_validator("model_options")
    @classmethod
    def _model_options(cls, options: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        model = info.data.get("model")
        if model is None:  # refused above
            return options
        if options is None:
            return {"width": 0.5} if model == "lenet" else {}
        check_model_options(model, options)
        return options

    @property
    def sgd(self) -> CloudSGD:
        """The section's training fields as :class:`CloudSGD`."""
        return _settings(CloudSGD, self)


class ECOSJobConfig(Section):
    """One ECOS job (see the module docstring)."""

    seed: int = Field(0, description="seed of the model, the pool's clustering, the noise, the selection and training")
    data: ECOSData = Field(default_factory=ECOSData, description="the data set, the client and the cloud")
    ecos: ECOSMethod = Field(default_factory=ECOSMethod, description="the selection")
    labels: ECOSLabels = Field(default_factory=ECOSLabels, description="who labels the selection")
    cloud: ECOSCloud = Field(default_factory=ECOSCloud, description="the cloud's model and training")

    @model_validator(mode="after")
    def _split_seed(self) -> "ECOSJobConfig":
        if self.data.split_seed is None:
            self.data.split_seed = self.seed
        return self

    @property
    def private_labels(self) -> bool:
        """Whether the client labels the selection itself by private kNN (B.6 Case 3)."""
        return self.labels.source == "private_knn"

    def to_dict(self) -> dict[str, Any]:
        """Every value, defaults filled in, in the TOML file's shape (JSON-compatible)."""
        return self.model_dump(mode="json")


def load_ecos_config(path: str | Path, overrides: list[str] | None = None) -> ECOSJobConfig:
    """An ECOS job's config from its TOML file and ``section.key=value`` overrides, or a one-line
    ConfigError.  A relative ``data.root`` written in the file is read against the file's
    folder; one given as an override, against the working directory."""
    raw = apply_dotted_overrides(read_config_file(path), overrides or [], model=ECOSJobConfig)
    try:
        return ECOSJobConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, model=ECOSJobConfig)) from None


def _registered(registry: Registry, name: str) -> str:
    """``name`` if ``registry`` holds it, else a ValueError listing what it holds."""
    try:
        registry.entry(name)
    except UnknownNameError as err:
        raise ValueError(str(err)) from None
    return name
