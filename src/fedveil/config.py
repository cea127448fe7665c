"""The single typed run configuration (TOML on disk, ``key=value`` overrides on the CLI).

Every section is validated before any work starts. Sections whose fields depend on a
chosen component (``[data.partition]``, ``[algorithm]``) are validated against that
component's own ``Params`` model, so a misspelt or out-of-range hyper-parameter is
reported with its full dotted name.
"""
from __future__ import annotations

import difflib
import re
import warnings
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_serializer, model_validator

from .config_file import read_config_file
from .errors import ConfigError, fields_by_path, format_validation_error


DEVICE_NAMES = r"auto|cpu|cuda(:\d+)?"  # the spellings of ``device`` (resolved by fedveil.runtime.device)


class Section(BaseModel):
    """A config section: its keys are checked, and an unknown key is an error."""

    model_config = ConfigDict(extra="forbid")


class _NamedComponent(BaseModel):
    """``name`` plus that component's hyper-parameters, checked against its ``Params``."""

    model_config = ConfigDict(extra="allow")
    name: str

    def params_dict(self) -> dict[str, Any]:
        return dict(self.model_extra or {})

    def typed_params(self) -> BaseModel:
        return self._params_class()(**self.params_dict())

    def _params_class(self) -> type[BaseModel]:
        raise NotImplementedError

    @model_serializer(mode="wrap")
    def _with_defaults(self, handler) -> dict[str, Any]:
        """``name`` and every parameter of the component, defaults filled in (config.json
        then shows what the run used, not only what was given)."""
        given = handler(self)
        if type(self)._params_class is _NamedComponent._params_class:
            return given
        params = self.typed_params().model_dump(mode="json")
        return {"name": given["name"], **params, **{k: v for k, v in given.items() if k not in params and k != "name"}}

    @model_validator(mode="after")
    def _check_params(self) -> "_NamedComponent":
        from .registry import UnknownNameError

        try:
            self.typed_params()
        except UnknownNameError as err:
            raise ValueError(str(err)) from None
        except ValidationError as err:
            raise ValueError(format_validation_error(err, joiner=", ", model=self._params_class())) from None
        return self


class PartitionConfig(_NamedComponent):
    """``[data.partition]``: how the rows are split over the clients, and the partitioner's options."""

    name: str = Field("iid", description="partitioner (`fedveil partitions`); its options go in the same section")

    def _params_class(self) -> type[BaseModel]:
        from .data import PARTITIONERS

        return PARTITIONERS.get(self.name).Params


class AlgorithmConfig(_NamedComponent):
    """``[algorithm]``: the federated algorithm and its hyper-parameters."""

    name: str = Field("fedavg", description="algorithm (`fedveil algorithms`); its hyper-parameters go in the same section")

    def _params_class(self) -> type[BaseModel]:
        from .algorithms import ALGORITHMS

        return ALGORITHMS.get(self.name).Params


class DataConfig(Section):
    """``[data]``: the data set, its clients and their train/test split."""

    name: str = Field("digits", description="data set (`fedveil datasets`)")
    root: str | None = Field(None, description="data directory; default $FEDVEIL_DATA/<name> or ~/.cache/fedveil/<name>")
    download: bool = Field(True, description="download from the canonical source when files are missing")
    num_clients: int = Field(10, ge=1, description="clients to split the data over (natural partitions fix it)")
    partition: PartitionConfig = Field(default_factory=PartitionConfig)
    val_fraction: float = Field(0.0, ge=0.0, lt=1.0, description="share of each client's rows held out for validation")
    test_fraction: float = Field(0.2, ge=0.0, lt=1.0, description="share of each client's rows held out for testing")
    options: dict[str, Any] = Field(default_factory=dict, description="loader-specific options")
    standardize: Literal["pooled", "per_client", "none"] = Field(
        "pooled", description="continuous columns (adult, compas): pooled = statistics of the whole training file, "
        "preprocessing on all silos' data that epsilon does not account for; per_client = each client's own "
        "training rows (local; the pooled test set is then the union of the clients' test splits); none = raw"
    )

    @model_validator(mode="after")
    def _known_dataset(self) -> "DataConfig":
        from .data import DATASETS
        from .registry import UnknownNameError

        try:
            DATASETS.entry(self.name)
        except UnknownNameError as err:
            raise ValueError(str(err)) from None
        if self.val_fraction + self.test_fraction >= 1.0:
            raise ValueError("val_fraction + test_fraction must be < 1 (clients need training rows)")
        if self.standardize == "per_client" and self.test_fraction == 0:
            raise ValueError("standardize='per_client' needs test_fraction > 0 (the pooled test set is the clients' test splits)")
        return self


class ModelConfig(Section):
    """``[model]``: the network every client trains, and where its first weights come from."""

    name: str = Field("auto", description="model (`fedveil models`); auto: LeNet for images of at least 16x16, an MLP for smaller images (8x8 digits), char-LSTM for text, MLP/linear for tables")
    options: dict[str, Any] = Field(default_factory=dict, description="model options, e.g. { width = 0.5 }")
    init_from: str | None = Field(
        None, description="start from a trained model: a finished run directory (its model.pt) or a .pt file of "
        "name -> tensor; its privacy cost is that run's, not counted in this run's epsilon"
    )
    init_skip: list[str] = Field(
        default_factory=list, description="parameter-name prefixes that keep their fresh initialisation with "
        "init_from, e.g. [\"disc.\"] to re-initialise FADE's discriminator"
    )


class ClientConfig(Section):
    """Local training: SGD with momentum / weight decay, epochs or a fixed step count."""

    epochs: int = Field(1, ge=1)
    steps: int | None = Field(None, ge=1, description="fixed local steps; overrides epochs")
    batch_size: int = Field(32, ge=0, description="0 = full batch")
    lr: float = Field(0.05, gt=0.0)
    momentum: float = Field(0.0, ge=0.0, lt=1.0)
    weight_decay: float = Field(0.0, ge=0.0)
    lr_schedule: Literal["constant", "step", "exponential", "cosine", "dann"] = Field(
        "constant", description="learning rate per round: constant, step decay, exponential decay, cosine to 0, "
        "dann = lr (1 + 10 round / rounds)^-0.75 (DANN / FADE)"
    )
    lr_decay: float = Field(0.1, gt=0.0, le=1.0, description="factor for step / per-round factor for exponential")
    lr_step_rounds: int = Field(50, ge=1, description="rounds between decays of the step schedule")
    loss: Literal["auto", "cross_entropy", "masked_cross_entropy", "hinge", "mse", "half_mse"] = Field(
        "auto", description="training loss: auto = cross_entropy for classification, mse for regression; "
        "masked_cross_entropy zeroes the logits of classes absent from the batch (HeteroFL, class non-IID clients); "
        "hinge = multi-class SVM hinge; half_mse = (y_hat - y)^2 / 2 as in the MR-MTL paper"
    )


class FederationConfig(Section):
    """``[federation]``: rounds, cohorts and how clients are drawn."""

    rounds: int = Field(20, ge=1, description="communication rounds")
    clients_per_round: int = Field(10, ge=1, description="cohort size (fixed) or expected size (poisson)")
    sampling: Literal["fixed", "poisson"] = Field(
        "fixed", description="fixed-size cohorts without replacement, or each client independently (Poisson)"
    )
    client_probabilities: list[float] | None = Field(
        None, description="per-client selection weights for fixed-size cohorts (normalised; 0 = never drawn), "
        "e.g. [0.95, 0.05] for FADE's imbalanced source/target users; None = uniform"
    )
    client_state: Literal["memory", "disk"] = Field(
        "memory", description="where per-client state (SCAFFOLD controls, local models) is kept: all in memory, "
        "or one file per client under RUN_DIR/client_states so memory grows with the cohort, not the population"
    )
    aggregation: Literal["mean", "median", "trimmed_mean"] = Field(
        "mean", description="how the server combines the cohort's updates: the algorithm's (weighted) mean, or "
        "robust to a few hostile clients: the coordinate-wise median or trimmed mean (weights ignored)"
    )
    trim_fraction: float = Field(
        0.2, ge=0.0, lt=0.5, description="trimmed_mean: share of the cohort dropped at each end, per coordinate"
    )
    update_norm_bound: float | None = Field(
        None, gt=0.0, description="scale every client's update to L2 norm <= this before aggregating (None: off)"
    )


class EvalConfig(Section):
    """``[eval]``: when and what is evaluated."""

    every: int = Field(1, ge=1, description="rounds between evaluations (the last round is always evaluated)")
    batch_size: int = Field(1024, ge=1, description="evaluation batch size (memory only; scores do not depend on it)")
    personal: bool = Field(True, description="also score personal models where the algorithm has them")
    metrics: list[str] = Field(
        default_factory=list, description="metrics reported besides the task's loss and score (accuracy or mse), "
        "e.g. [\"equalized_odds_gap\", \"auprc\"]; names and keys in docs/evaluation.md"
    )
    group: str | None = Field(
        None, description="group key of the data read by the group metrics (e.g. \"sex\" or \"race\" of adult, compas)"
    )

    @model_validator(mode="after")
    def _check_metrics(self) -> "EvalConfig":
        from .metrics import metric_class
        from .registry import UnknownNameError

        for name in self.metrics:
            try:
                cls = metric_class(name)
            except UnknownNameError as err:
                raise ValueError(str(err)) from None
            if cls.needs_groups and self.group is None:
                raise ValueError(
                    f"metric '{name}' needs eval.group, the data's group key (e.g. group = \"sex\" for adult or compas)"
                )
        return self


class CheckpointConfig(Section):
    """``[checkpoint]``: how often a run saves what it needs to resume."""

    every: int = Field(5, ge=0, description="rounds between checkpoints; 0 = only at the end")


class NoiseScheduleConfig(_NamedComponent):
    """How the noise multiplier changes over rounds (chapter-2 schedules, spec 000 §1.7).

    The schedule gives only the shape; the run scales it so that the accountant spends
    ``epsilon`` exactly by the last round (see docs/privacy.md). Its options go in the
    same section, e.g. ``gamma`` for ``dynamic``, ``k`` for ``exp_decay``; ``R`` and
    ``T`` are set by the run.
    """

    name: str = Field(
        "constant", description="constant, or a noise schedule (uniform, dynamic, momentum_dynamic, *_decay, predefined); "
        "its options go in the same section"
    )

    @model_validator(mode="after")
    def _check_params(self) -> "NoiseScheduleConfig":
        self.shape(2 if self.name != "predefined" else len(self.params_dict().get("sigmas") or [0]))
        return self

    def shape(self, rounds: int):
        """The schedule's sigma shape over ``rounds`` rounds (ValueError on bad options)."""
        from .privacy.schedules import round_shape
        from .registry import UnknownNameError

        try:
            return round_shape(self.name, rounds, **self.params_dict())
        except UnknownNameError as err:
            raise ValueError(f"{err}, or constant") from None


class PrivacyConfig(Section):
    """Differential privacy of the run (DESIGN idea 3); ``level = "none"`` turns it off.

    ``example``: DP-SGD inside every client's local training; each client (silo) is
    accounted separately under its own budget. ``client``: each client's whole update is
    clipped and the cohort average noised (DP-FedAvg); the population is accounted.
    Give ``epsilon`` (noise is calibrated to spend it exactly by the last round),
    ``noise_multiplier`` (epsilon is reported), or both (the run refuses to start if
    the plan would spend more than ``epsilon``).
    """

    level: Literal["none", "example", "client"] = Field("none", description="unit of privacy: none, each example, each client")
    epsilon: float | None = Field(None, gt=0.0, description="target / budget epsilon (per client for example level)")
    delta: float = Field(1e-5, gt=0.0, lt=1.0, description="delta of the (epsilon, delta) guarantee")
    noise_multiplier: float | None = Field(None, gt=0.0, description="noise std / clip; calibrated from epsilon if unset")
    clip: float = Field(1.0, gt=0.0, description="L2 clip of per-example gradients (example) or of updates (client)")
    accountant: Literal["rdp", "pld"] = Field("rdp", description="dp-accounting backend: Renyi DP or privacy loss distributions")
    batch_sampling: Literal["poisson", "shuffle"] = Field(
        "poisson", description="example level: Poisson batches (rate batch_size/n) or shuffled epochs"
    )
    client_epsilons: list[float] | None = Field(
        None, description="example level: one budget per client (silo-specific DP); overrides epsilon"
    )
    adaptive_clip: bool = Field(False, description="client level: adapt the clip to a quantile (Andrew et al. 2021)")
    target_quantile: float = Field(0.5, gt=0.0, lt=1.0, description="adaptive clip: share of updates left unclipped")
    clip_lr: float = Field(0.2, gt=0.0, description="adaptive clip: geometric step size")
    clip_count_noise: float | None = Field(
        None, gt=0.0, description="adaptive clip: noise std of the clipped-count (default: expected cohort / 20)"
    )
    noise_schedule: NoiseScheduleConfig = Field(
        default_factory=NoiseScheduleConfig, description="noise multiplier over rounds, scaled to spend epsilon"
    )
    secure_rng: bool = Field(
        False, description="draw DP noise and the accounted sampling from the OS's secure generator (not replayable)"
    )
    keep_unnoised: bool = Field(
        False, description="a DP run also writes what it computed from the private rows without noise, which epsilon "
        "does not cover (training loss, client-level cohort sizes, per-client row counts, scores and label counts): "
        "for research only",
    )
    records_per_person: int = Field(
        1, ge=1, description="most records one person may own: also report a person-level epsilon (exact k-record accounting where known)"
    )

    @model_validator(mode="after")
    def _budget_given(self) -> "PrivacyConfig":
        if self.level == "none":
            return self
        if self.epsilon is None and self.noise_multiplier is None and self.client_epsilons is None:
            raise ValueError(f"level '{self.level}' needs epsilon, client_epsilons or noise_multiplier")
        if self.client_epsilons is not None:
            if self.level != "example":
                raise ValueError("client_epsilons (per-client budgets) apply to level 'example' only")
            if any(e <= 0 for e in self.client_epsilons):
                raise ValueError("client_epsilons must all be > 0")
        if self.adaptive_clip and self.level != "client":
            raise ValueError("adaptive_clip applies to level 'client' only")
        if self.noise_schedule.name != "constant" and self.noise_multiplier is not None:
            raise ValueError(
                "noise_schedule scales its shape to spend the budget: give epsilon (or client_epsilons) "
                "and drop noise_multiplier"
            )
        return self


class SecureAggregationConfig(Section):
    """Deployment: the server learns only the sum of the silos' updates (docs/deployment.md,
    "Secure aggregation"); the simulation sums the same quantised updates in the clear."""

    enabled: bool = Field(False, description="mask every update so that the server learns only their sum (FedAvg family)")
    threshold: float = Field(
        0.66, gt=0.5, le=1.0,
        description="share of the cohort that must answer every stage (at least 2 silos); fewer ends the round unchanged; "
        "above half, so that no round can be unmasked over two sets of silos",
    )
    clip_range: float = Field(8.0, gt=0.0, description="each coordinate of weight/weight_scale * update clipped to +-this")
    bits: int = Field(20, ge=1, le=31, description="quantisation bits per coordinate (the 32-bit sum must not overflow)")
    weight_scale: float = Field(
        1000.0, gt=0.0, description="public scale of the FedAvg weights (rows): weight/weight_scale multiplies each update",
    )
    colluders: int = Field(
        0, ge=0, description="distributed DP (privacy.level = client): silos that may collude with the server; their "
        "noise shares are not counted, so every silo adds more",
    )


class RayConfig(Section):
    """Where ``executor = "ray"`` runs: a local Ray instance or an existing cluster."""

    address: str | None = Field(None, description="Ray cluster address (e.g. ray://head:10001); none starts Ray locally")
    workers: int = Field(2, ge=1, description="shards per round (one Ray task each); local Ray gets this many CPUs")
    inner: Literal["serial", "threads", "vectorized"] = Field(
        "vectorized", description="how a worker trains its shard (threads: one client per torch thread of the worker)"
    )


class LogConfig(Section):
    """Experiment tracking: every round's metrics row (epsilon included) and the config also go
    to TensorBoard and/or MLflow (docs/outputs.md); needs `pip install 'fedveil[tracking]'`."""

    tensorboard: bool = Field(False, description="write TensorBoard event files under RUN_DIR/tensorboard")
    mlflow_uri: str | None = Field(
        None, min_length=1, description="MLflow tracking URI, e.g. sqlite:///mlflow.db or http://host:5000; None = off"
    )
    mlflow_experiment: str = Field("fedveil", min_length=1, description="MLflow experiment the run is logged to")
    mlflow_run_name: str | None = Field(None, description="MLflow run name; default the run directory's name")


class RunConfig(Section):
    """A whole run: every section above, the seed, the executor and the device (docs/config.md)."""

    seed: int = Field(0, description="fixes partition, client schedule, initialisation and all noise")
    executor: Literal["serial", "threads", "vectorized", "ray", "auto"] = Field(
        "auto", description="how a round's cohort is trained: one client after another, several side by side on "
        "worker threads (one per CPU thread, see threads), stacked (fast), on Ray, or auto: stacked on a GPU; on the "
        "CPU stacked for nets without convolutions, else "
        "threads (serial on one CPU thread) (docs/executors.md#auto); a deployed run equals its simulation bit for "
        "bit with serial"
    )
    device: str = Field(
        "auto", description="where the run computes: auto (CUDA when available, else CPU), cpu, cuda or cuda:N"
    )
    threads: int | None = Field(
        None, ge=1, description="torch CPU threads while the run trains (the threads executor's workers, each on one "
        "thread); None: 1 when a local step computes under 32M multiply-accumulates (MACs an example x batch "
        "size x the stacked cohort's copies: small kernels do not split, and extra threads only contend), else "
        "torch's default"
    )
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    client: ClientConfig = Field(default_factory=ClientConfig)
    federation: FederationConfig = Field(default_factory=FederationConfig)
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    secure_aggregation: SecureAggregationConfig = Field(default_factory=SecureAggregationConfig)
    ray: RayConfig = Field(default_factory=RayConfig)
    log: LogConfig = Field(default_factory=LogConfig)

    @field_validator("device")
    @classmethod
    def _device_name(cls, value: str) -> str:
        # only the spelling here: whether CUDA is present is checked when a run starts
        if not re.fullmatch(DEVICE_NAMES, value):
            raise ValueError(f"'{value}' is not a device; use auto, cpu, cuda or cuda:N")
        return value

    @model_validator(mode="after")
    def _cohort_fits(self) -> "RunConfig":
        if self.federation.clients_per_round > self.data.num_clients:
            raise ValueError(
                f"federation.clients_per_round={self.federation.clients_per_round} exceeds "
                f"data.num_clients={self.data.num_clients}"
            )
        if self.privacy.level != "none":
            try:
                self.privacy.noise_schedule.shape(self.federation.rounds)
            except ValueError as err:
                raise ValueError(f"privacy.noise_schedule: {err}") from None
        if self.privacy.level == "example" and self.client.loss == "masked_cross_entropy":
            raise ValueError(
                "client.loss = masked_cross_entropy couples the examples of a batch (the mask is the batch's labels), "
                "which per-example DP-SGD cannot bound; use cross_entropy with privacy.level = example"
            )
        robust = self.federation.aggregation != "mean" or self.federation.update_norm_bound is not None
        if robust and self.privacy.level == "client":
            raise ValueError(
                "federation.aggregation / update_norm_bound: client-level DP already bounds every update (privacy.clip) "
                "and noises their mean; robust aggregation would change the mechanism that is accounted"
            )
        if self.secure_aggregation.enabled and robust:
            raise ValueError(
                "secure_aggregation: the server sees only the sum of the updates, so it cannot bound or trim each one; "
                "drop federation.aggregation / update_norm_bound"
            )
        cohort_epsilons = self.privacy.client_epsilons
        if cohort_epsilons is not None and len(cohort_epsilons) != self.data.num_clients:
            raise ValueError(
                f"privacy.client_epsilons has {len(cohort_epsilons)} budgets for data.num_clients={self.data.num_clients}"
            )
        return self


# ---------------------------------------------------------------- loading and overrides


def parse_value(text: str) -> Any:
    """A CLI value as TOML (numbers, booleans, lists, quoted strings), else a bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _leaf_paths(tree: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = []
    for key, value in tree.items():
        if isinstance(value, dict) and key != "options":
            paths += _leaf_paths(value, prefix + (key,))
        else:
            paths.append(prefix + (key,))
    return paths


def _set_path(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        node = tree.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"cannot set '{'.'.join(path)}': '{key}' is not a section")
        tree = node
    tree[path[-1]] = value


def apply_dotted_overrides(
    raw: dict[str, Any], overrides: list[str], model: type[BaseModel] | None = None
) -> dict[str, Any]:
    """A copy of ``raw`` with ``section.key=value`` overrides set (values read as TOML): the
    override form of configs other than the run config's (``fedveil pets``, ``fedveil ecos``).
    With the ``model`` validated next, a bare key (``budget=50``) is set at the one setting of
    that name in its sections; an ambiguous one is refused, an unknown one left to validation."""
    raw = _deep_copy(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override '{item}' is not of the form section.key=value")
        path = tuple(key.strip().split("."))
        if len(path) == 1 and model is not None:
            path = _setting_path(model, path[0])
        _set_path(raw, path, parse_value(text))
    return raw


def _setting_path(model: type[BaseModel], key: str) -> tuple[str, ...]:
    """The path of ``model``'s one setting called ``key`` (``(key,)`` when there is none)."""
    matches = [path + (key,) for path, names in fields_by_path(model).items() if key in names]
    if len(matches) > 1:
        raise ConfigError(f"'{key}' is ambiguous: write one of {', '.join('.'.join(p) for p in matches)}")
    return matches[0] if matches else (key,)


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key=value`` overrides to a raw config dict.

    Dotted keys (``data.partition.alpha=0.1``) are set as given. A bare key (``alpha=0.1``)
    is resolved to the one setting of that name in the config (defaults included);
    an ambiguous or unknown bare key is an error that lists the candidates.
    """
    file_algorithm = dict(raw.get("algorithm") or {})
    raw = _deep_copy(raw)
    bare: list[tuple[str, Any]] = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override '{item}' is not of the form key=value")
        key, text = item.split("=", 1)
        key = key.strip()
        if not key:
            raise ConfigError(f"override '{item}' has an empty key")
        if "." in key:
            _set_path(raw, tuple(key.split(".")), parse_value(text))
        else:
            bare.append((key, parse_value(text)))
    _drop_other_algorithms_settings(raw, file_algorithm, overrides)
    if bare:
        try:
            resolved, invalid = validate(raw).model_dump(), None
        except ConfigError as err:
            # raw may be invalid only until the bare overrides apply (data.num_clients=3
            # clients_per_round=2): look the bare names up in the defaults overlaid with raw
            resolved, invalid = _overlay(RunConfig().model_dump(), raw), err
        paths = _leaf_paths(resolved)
        for key, value in bare:
            matches = [p for p in paths if p[-1] == key]
            if len(matches) > 1:
                names = ", ".join(".".join(p) for p in matches)
                raise ConfigError(f"'{key}' is ambiguous: write one of {names}")
            if not matches:
                try:
                    path = _new_component_param(resolved, key)
                except (KeyError, TypeError):  # unknown component name / section not a table
                    if invalid is None:
                        raise
                    raise invalid from None
            else:
                path = matches[0]
            _set_path(raw, path, value)
    return raw


def _new_component_param(resolved: dict[str, Any], key: str) -> tuple[str, ...]:
    """A bare key that is a hyper-parameter of the chosen algorithm or partitioner but not yet set."""
    from .algorithms import ALGORITHMS
    from .data import PARTITIONERS

    owners = []
    if key in ALGORITHMS.get(resolved["algorithm"]["name"]).Params.model_fields:
        owners.append(("algorithm", key))
    if key in PARTITIONERS.get(resolved["data"]["partition"]["name"]).Params.model_fields:
        owners.append(("data", "partition", key))
    if len(owners) == 1:
        return owners[0]
    names = {".".join(p) for p in _leaf_paths(resolved)}
    close = difflib.get_close_matches(key, sorted({n.rsplit(".", 1)[-1] for n in names}), n=1, cutoff=0.6)
    hint = ""
    if close:
        hint = " (did you mean " + " or ".join(f"'{n}'" for n in sorted(names) if n.rsplit(".", 1)[-1] == close[0]) + "?)"
    raise ConfigError(f"unknown setting '{key}'{hint}; write it with its section, e.g. federation.rounds=50")


def _drop_other_algorithms_settings(raw: dict[str, Any], file_algorithm: dict[str, Any], overrides: list[str]) -> None:
    """With ``algorithm.name=B`` overriding a file's algorithm A, the file's settings that B
    does not take are dropped, with a warning naming them (``examples/adds_digits.toml
    algorithm.name=feddrop`` then runs); settings given on the command line are kept."""
    new, old = (raw.get("algorithm") or {}).get("name"), file_algorithm.get("name")
    if new is None or old is None or new == old:
        return
    from .algorithms import ALGORITHMS
    from .registry import UnknownNameError

    try:
        accepted = set(ALGORITHMS.get(str(new)).Params.model_fields)
    except UnknownNameError:
        return  # validation reports the unknown name
    given = {item.split("=", 1)[0].strip().removeprefix("algorithm.") for item in overrides}
    dropped = sorted(k for k in file_algorithm if k != "name" and k not in accepted and k not in given)
    for key in dropped:
        del raw["algorithm"][key]
    if dropped:
        warnings.warn(f"algorithm.name={new}: left out the file's {old} settings it does not take: {', '.join(dropped)}",
                      stacklevel=3)


def _deep_copy(tree: dict[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in tree.items()}


def _overlay(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``top``'s entries laid over it, section by section."""
    out = _deep_copy(base)
    for key, value in top.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _overlay(out[key], value) if both else value
    return out


def validate(raw: dict[str, Any]) -> RunConfig:
    """Validate a raw config dict into a :class:`RunConfig`, or raise :class:`ConfigError`."""
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, model=RunConfig)) from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Read a TOML config (or start from defaults), apply overrides, validate. Data paths in
    the file are relative to its folder; those in overrides to the working directory."""
    raw = {} if path is None else read_config_file(path)
    return validate(apply_overrides(raw, overrides or []))
