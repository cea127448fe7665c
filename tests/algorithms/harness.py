"""A hand-driven round loop for algorithm tests: a tiny regression problem, a linear
model and the algorithm hooks called in order, without the runtime."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from fedveil.algorithms import ALGORITHMS, Algorithm, ClientTask, RunContext
from fedveil.config import ClientConfig
from fedveil.data.arrays import ArrayDataset
from fedveil.data.federated import ClientData, FederatedDataset
from fedveil.params import Params
from fedveil.training.local import LocalTrainer, task_loss
from fedveil.seeding import torch_generator

SEED = 0
DIM = 3
DTYPE = torch.float64


def _rows(n: int, gen: torch.Generator) -> ArrayDataset:
    x = torch.randn(n, DIM, generator=gen, dtype=DTYPE)
    y = x @ torch.tensor([1.0, -2.0, 0.5], dtype=DTYPE) + 0.3 + 0.1 * torch.randn(n, generator=gen, dtype=DTYPE)
    return ArrayDataset(x, y)


def make_dataset(sizes: Sequence[int] = (2, 3, 4), identical: bool = False) -> FederatedDataset:
    """Linear-regression clients with ``sizes`` training rows (all the same rows if ``identical``)."""
    gen = torch.Generator().manual_seed(1)
    shared = _rows(sizes[0], gen) if identical else None
    clients = [ClientData(train=shared if identical else _rows(n, gen), val=None, test=_rows(2, gen)) for n in sizes]
    test = ArrayDataset.concat([c.test for c in clients])
    return FederatedDataset("toy", clients, test, task="regression", num_classes=0, input_shape=(DIM,))


def make_model() -> nn.Linear:
    torch.manual_seed(2)
    return nn.Linear(DIM, 1).to(DTYPE)


def model_factory(device: torch.device | str | None = None) -> nn.Linear:
    """A fresh copy of :func:`make_model`'s model, leaving the global random state alone."""
    with torch.random.fork_rng():
        return make_model().to(device or "cpu")


@dataclass
class ToyContext(RunContext):
    """The run context the algorithms see, plus the toy problem's data and model for the
    tests to check against (algorithms must use only :class:`RunContext`'s fields)."""

    data: FederatedDataset | None = None
    model: nn.Module | None = None


def initial_params(model: nn.Module) -> Params:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def make_trainer(model: nn.Module, rounds: int = 3, **client: Any) -> LocalTrainer:
    return LocalTrainer(model, task_loss("regression"), ClientConfig(**client), rounds)


def make_algorithm(
    name: str,
    *,
    sizes: Sequence[int] = (2, 3, 4),
    identical: bool = False,
    rounds: int = 3,
    client: dict[str, Any] | None = None,
    **params: Any,
) -> Algorithm:
    """Algorithm ``name`` with hyper-parameters ``params`` on a fresh toy problem."""
    model = make_model()
    data = make_dataset(sizes, identical)
    trainer = make_trainer(model, rounds, **(client or {}))
    cls = ALGORITHMS.get(name)
    ctx = ToyContext(
        num_clients=data.num_clients, task=data.task, num_classes=data.num_classes, input_shape=data.input_shape,
        rounds=rounds, seed=SEED, model_factory=model_factory, trainer=trainer, data=data, model=model,
    )
    return cls(cls.Params(**params), ctx)


def make_task(alg: Algorithm, cid: int, round_idx: int, purpose: str = "train") -> ClientTask:
    return ClientTask(
        client_id=cid,
        round=round_idx,
        data=alg.ctx.data.clients[cid],
        generator=torch_generator(alg.ctx.seed, purpose, round_idx, cid),
        trainer=alg.ctx.trainer,
    )


@dataclass
class Run:
    server: dict[str, Any]
    clients: dict[int, Any]
    messages: list[list[tuple[int, dict[str, Any]]]] = field(default_factory=list)


def run_rounds(alg: Algorithm, rounds: int, cohorts: Sequence[Sequence[int]] | None = None) -> Run:
    """``rounds`` rounds from the model's initial parameters; all clients unless ``cohorts``."""
    server = alg.init_server(initial_params(alg.ctx.model))
    run = Run(server, {cid: alg.init_client(cid, server) for cid in range(alg.ctx.data.num_clients)})
    for r in range(rounds):
        results = []
        for cid in cohorts[r] if cohorts is not None else range(alg.ctx.data.num_clients):
            result = alg.client_update(run.server, run.clients[cid], make_task(alg, cid, r))
            run.clients[cid] = result.state
            results.append((cid, result.message))
        run.server = alg.aggregate(run.server, results, r)
        run.messages.append(results)
    return run


def train_directly(alg: Algorithm, start: Params, cid: int, round_idx: int) -> Params:
    """What ``cid``'s plain local SGD makes of ``start`` in round ``round_idx`` (same random stream)."""
    gen = torch_generator(alg.ctx.seed, "train", round_idx, cid)
    return alg.ctx.trainer.train(start, alg.ctx.data.clients[cid].train, gen, round_idx)[0]


def full_batch_grad(params: Params, data: ArrayDataset) -> Params:
    """Gradient of the mean squared error on all of ``data``, by autograd on a plain nn.Linear."""
    model = nn.Linear(DIM, 1).to(DTYPE)
    with torch.no_grad():
        model.weight.copy_(params["weight"])
        model.bias.copy_(params["bias"])
    F.mse_loss(model(data.x).reshape(data.y.shape), data.y).backward()
    return {"weight": model.weight.grad.clone(), "bias": model.bias.grad.clone()}


def assert_params_close(actual: Params, expected: Params, atol: float = 1e-12) -> None:
    assert actual.keys() == expected.keys()
    for k in expected:
        torch.testing.assert_close(actual[k], expected[k], rtol=0.0, atol=atol)


def assert_params_equal(actual: Params, expected: Params) -> None:
    assert actual.keys() == expected.keys()
    for k in expected:
        assert torch.equal(actual[k], expected[k]), k
