"""The algorithm contract (DESIGN idea 2): typed hyper-parameters plus a few hooks.

Client and server halves of a method live in one module. State is plain data
(dicts of tensors), so the runtime can checkpoint it, stack it or ship it elsewhere.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from ..data.federated import ClientData
from ..models.functional import forward
from ..params import Params
from ..privacy.events import Release
from ..privacy.dp_sgd import ExampleDP
from ..privacy.randomness import NoiseSource
from ..registry import Registry
from ..training.local import LocalStats, LocalTrainer

State = dict[str, Any]


class AlgorithmParams(BaseModel):
    """Hyper-parameters of an algorithm; subclasses add typed, validated fields."""

    model_config = ConfigDict(extra="forbid")


@dataclass
class RunContext:
    """What an algorithm may know about the whole run: its shape, not its data (a
    deployment server has no clients' rows), plus the tools it calls.

    ``model_factory(device=None, **options)`` returns a fresh model, initialised identically
    every call (on the CPU with the run's init seed, then moved to ``device``, default the
    run's device): the architecture an algorithm may instantiate, e.g. for its own forward
    passes; ``options`` override the model's builder options (HeteroFL's narrower widths).
    """

    num_clients: int
    task: str  # "classification" | "regression"
    num_classes: int  # 0 for regression
    input_shape: tuple[int, ...]  # of one example
    rounds: int
    seed: int
    model_factory: Callable[..., nn.Module]
    trainer: LocalTrainer
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    noise: NoiseSource = field(default_factory=NoiseSource)  # the run's DP randomness: every mechanism's stream
    private: bool = False  # the run is under DP (any level): send nothing un-noised computed from the rows
    data: dict[str, Any] = field(default_factory=dict)  # the config's data section, as config.json records it


@dataclass
class ClientTask:
    """One client's job in one round: its data, its private random stream, the trainer."""

    client_id: int
    round: int
    data: ClientData
    generator: torch.Generator
    trainer: LocalTrainer
    dp: ExampleDP | None = None  # DP-SGD settings when privacy.level = "example"; pass to trainer.train
    privacy_budget: float | None = None  # the client's epsilon target under example-level DP, if one is set


@dataclass
class ClientResult:
    """``message`` goes to the server; ``state`` stays with the client; ``stats`` are logged."""

    message: dict[str, Any]
    state: State | None = None
    stats: LocalStats | None = None
    extra_metrics: dict[str, float] = field(default_factory=dict)
    # noisy releases about the client's data other than DP-SGD steps (e.g. IFCA's private
    # cluster choice); the runtime records them in the client's privacy ledger
    releases: list[Release] = field(default_factory=list)
    # DP-SGD steps of each local training under ``task.dp``, in order; filled by the executor
    # once ``client_update`` has returned (algorithms leave it alone), accounted by the runtime
    dp_trainings: list[int] = field(default_factory=list)


@dataclass
class SetupResult:
    """A client's one-off contribution before round 0 (:meth:`Algorithm.client_setup`):
    ``contribution`` goes to the server's :meth:`Algorithm.finish_setup`; ``releases`` are the
    noisy releases about the client's data it took, recorded in the client's privacy ledger."""

    contribution: Any
    releases: list[Release] = field(default_factory=list)


class Algorithm:
    """Base class: FedAvg-style defaults that subclasses override piecemeal."""

    Params: ClassVar[type[AlgorithmParams]] = AlgorithmParams
    has_personal_models: ClassVar[bool] = False
    has_global_model: ClassVar[bool] = True  # False: no shared model, so no global metrics are reported
    # Example-level DP: every local training passes ``task.dp`` to the trainer, so all
    # access to training data is private and accounted.
    supports_example_dp: ClassVar[bool] = True
    # Client-level DP: the message is only a model delta the server may clip, average
    # uniformly and noise (FedAvg family); control variates or step counts would leak.
    supports_client_dp: ClassVar[bool] = False
    # Full local trainings (``trainer.train`` calls with ``task.dp``) per round; the privacy
    # plan accounts this many DP-SGD schedules per participation (Ditto: 2).
    trainings_per_round: ClassVar[int] = 1
    # A setup phase before round 0: every client runs ``client_setup`` once and the server
    # gathers the contributions in ``finish_setup`` (FedFed's shared features).
    has_setup: ClassVar[bool] = False
    # Secure aggregation: the server's ``aggregate`` needs only the weighted mean of the
    # messages' ``delta`` (by ``weights``), so the sum of masked updates suffices (FedAvg family).
    secure_summable: ClassVar[bool] = False
    # Robust aggregation (federation.aggregation, update_norm_bound) bounds and combines each
    # message's ``delta``; algorithms whose messages carry none (sub-networks, compressed
    # updates, personal models only) set this False and a run asking for it is refused.
    delta_messages: ClassVar[bool] = True
    # Extra client metrics that are no function of the client's rows (hyper-parameters, its
    # budget's width, sizes fixed by the config) or only of its DP releases: a DP run keeps
    # these and withholds every other ``extra_metrics`` key (privacy.keep_unnoised keeps all).
    public_metrics: ClassVar[tuple[str, ...]] = ()
    # Labels of the method's own metrics (``extra_metrics`` keys) where a researcher reads
    # them: the console summary, the learning curves, ``fedveil compare`` (runtime.signals).
    signal_labels: ClassVar[dict[str, str]] = {}
    # Messages carry parameter slices narrower than the model's (sub-models: HeteroFL, ADDS,
    # FedDrop): a deployed server then checks a tensor named like a parameter for a shape no
    # larger than it, instead of the exact shape.
    submodel_messages: ClassVar[bool] = False

    def is_public_metric(self, name: str) -> bool:
        """Whether extra client metric ``name`` may be written by a DP run (:attr:`public_metrics`)."""
        return name in self.public_metrics

    def __init__(self, params: AlgorithmParams, ctx: RunContext) -> None:
        self.hp = params
        self.ctx = ctx

    def init_server(self, initial: Params) -> State:
        """The server state of round 0 from the initial model ``initial``; default ``{"params": initial}``."""
        return {"params": initial}

    def init_client(self, client_id: int, server_state: State) -> State | None:
        """Persistent per-client state, or None for stateless clients."""
        return None

    def client_setup(self, client_id: int, data: ClientData, generator: torch.Generator) -> SetupResult:
        """Client ``client_id``'s one-off contribution before round 0 (only if ``has_setup``),
        drawn from ``generator``, its own setup stream."""
        raise NotImplementedError

    def planned_setup_releases(self, client_id: int, num_train: int) -> list[Release]:
        """The ``releases`` of client ``client_id``'s :meth:`client_setup`, known before the run
        (the privacy plan leaves room for them and the ledger check expects them)."""
        return []

    def finish_setup(self, server_state: State, contributions: list[tuple[int, Any]]) -> State:
        """The server state of round 0 given every client's setup ``contributions`` (client
        order); default: unchanged."""
        return server_state

    def configure_round(self, server_state: State, cohort: list[int], round_idx: int) -> State:
        """The server's plan for round ``round_idx`` before any client trains (Flower's
        ``configure_fit``): the state every client of ``cohort`` (in this order) receives and
        ``aggregate`` starts from, e.g. Split-Mix's choice of base models per client. It must
        depend only on its arguments, so a resumed run plans the same; default: unchanged."""
        return server_state

    def silo_view(self, server_state: State) -> State:
        """What of a server state a deployed server sends the silos (the state ``configure_round``
        planned, in a train request; the state after a round, in an evaluate request); the
        server keeps the full state for ``aggregate`` and its checkpoints. Default: all of it.
        An algorithm whose server state holds facts about individual silos that no client hook
        reads (MR-MTL's per-silo weights, i.e. row counts) leaves them out here, so no silo
        learns them; ``init_client``, ``client_update`` and ``personal_params`` must give the
        same on the view as on the full state (the simulation passes the full state)."""
        return server_state

    def client_update(self, server_state: State, client_state: State | None, task: ClientTask) -> ClientResult:
        """Client ``task.client_id``'s work in round ``task.round``: its message for the server, new state and stats."""
        raise NotImplementedError

    def aggregate(self, server_state: State, results: list[tuple[int, dict[str, Any]]], round_idx: int) -> State:
        """The server state after round ``round_idx`` from the ``(client_id, message)`` pairs of its cohort."""
        raise NotImplementedError

    def planned_releases(
        self, client_id: int, num_train: int, budget: float | None, rounds: list[int]
    ) -> dict[int, list[Release]]:
        """The ``releases`` client ``client_id`` will return in each round if it takes part in
        ``rounds`` (round -> releases), so that DP-SGD noise is calibrated to leave room for
        them and the ledger check knows when to expect them."""
        return {}

    def global_params(self, server_state: State) -> Params:
        """The shared model of ``server_state`` that global metrics evaluate (default its ``params``)."""
        return server_state["params"]

    def personal_params(self, server_state: State, client_state: State | None, task: ClientTask) -> Params:
        """The model client ``task.client_id`` would use itself (only if ``has_personal_models``)."""
        raise NotImplementedError

    def predict(self, model: nn.Module, state: Params, x: torch.Tensor) -> torch.Tensor:
        """Outputs (logits or predictions) of the model ``state`` (from ``global_params`` or
        ``personal_params``) on ``x``. Every evaluation metric is computed from these, so an
        ensemble, a chosen width or a personal head overrides this; the default is the
        model's forward in eval mode (thread-safe :func:`~fedveil.models.functional.forward`)."""
        return forward(model, state, x)


ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm")
