"""The benchmarked systems: fedveil's own simulation and the baselines it is compared with.

Every runner takes a :class:`Case` and returns the wall-clock seconds of each round
(warm-up rounds first), computing on the case's device with the model and the data moved
there before timing (on a GPU a round ends when its kernels have finished). A runner raises :class:`Unavailable` when its system cannot run
here (missing package, executor not built into this fedveil); heavy imports happen
inside the runners, so the harness can check availability cheaply.
"""
from __future__ import annotations

import copy
import importlib.util
import os
import time
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from .workloads import CLIP, NOISE_MULTIPLIER, Case, Workload, client_tensors, cohort_tensors, fedveil_config

CENTRAL_CHUNK = 2048  # rows per forward pass of the centralised big batch (memory only)
PER_EXAMPLE_BYTES = 2**28  # centralised DP: per-example gradients held at a time (memory only)

# packages a system needs; a missing one makes the system "n/a"
REQUIRES: dict[str, tuple[str, ...]] = {"flower": ("flwr", "ray"), "opacus": ("opacus",)}
# which systems run the non-private and the DP-SGD variant of a workload
DP_MODES: dict[str, tuple[bool, ...]] = {
    "plain-loop": (False,), "centralised": (False, True), "flower": (False,), "opacus": (True,),
}


class Unavailable(RuntimeError):
    """The system cannot run in this environment; the message says why."""


class CaseTimeout(RuntimeError):
    """A case run in the suite's own process passed its deadline (checked between rounds)."""


_round_deadline: list[float] = []  # the innermost case deadline (time.monotonic), when one is set


@contextmanager
def deadline(at: float) -> Iterator[None]:
    """Within the block, :func:`timed` raises :class:`CaseTimeout` after the first round that
    ends past ``at``: a case in the suite's own process cannot be killed, so it stops there."""
    _round_deadline.append(at)
    try:
        yield
    finally:
        _round_deadline.pop()


def supports(system: str, dp: bool) -> bool:
    """Whether ``system`` has a variant with (``dp``) or without DP-SGD."""
    return dp in DP_MODES.get(system, (False, True))


def missing_dependency(system: str) -> str | None:
    """The first package ``system`` needs that is not importable, else None."""
    for package in REQUIRES.get(system, ()):
        if importlib.util.find_spec(package) is None:
            return package
    return None


def build(w: Workload, device: torch.device | str = "cpu") -> nn.Module:
    """The workload's model, initialised on the CPU (the same weights on every device), on ``device``."""
    from ..models import build_model

    with torch.device("cpu"):
        model = build_model(w.model, w.input_shape, w.num_classes, **w.model_options)
    return model.to(device)


def case_device(case: Case) -> torch.device:
    """The device ``case.device`` names here (``auto``: CUDA when available)."""
    from ..runtime.device import resolve_device

    return resolve_device(case.device)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA kernels run asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(rounds: int, one_round: Callable[[int], None], device: torch.device | str = "cpu") -> list[float]:
    """Wall-clock seconds of each of ``rounds`` calls
    ``one_round(r)``, the device synchronised before and after each; inside a
    :func:`deadline`, stops with :class:`CaseTimeout` after a round that ends past it."""
    device = torch.device(device)
    times = []
    for r in range(rounds):
        synchronize(device)
        start = time.perf_counter()
        one_round(r)
        synchronize(device)
        times.append(time.perf_counter() - start)
        if _round_deadline and time.monotonic() > _round_deadline[-1] and r + 1 < rounds:
            raise CaseTimeout(f"stopped after {r + 1} of {rounds} rounds, past its time limit")
    return times


# --- fedveil ------------------------------------------------------------------------------


def run_fedveil(case: Case, executor: str) -> list[float]:
    """``Simulation.train_round`` of fedveil with ``executor`` (data built before timing), on
    the torch threads a run of the same config trains with."""
    from ..errors import ConfigError
    from ..config import validate
    from ..runtime import Simulation

    try:
        config = validate(fedveil_config(case, executor))
    except ConfigError as err:
        if "executor" in str(err):
            raise Unavailable(f"not available: executor '{executor}' ({err})") from None
        raise
    sim = Simulation.from_config(config)  # data and model moved to the run's device here, before timing
    state = sim.fresh_state()
    with sim.training_settings():  # the threads and collector settings `fedveil run` trains with
        return timed(case.warmup + case.rounds, lambda r: sim.train_round(state, r), sim.device)


def fedveil_executor_available(executor: str) -> str | None:
    """None when this fedveil accepts ``executor``, else the reason it does not."""
    from ..errors import ConfigError
    from ..config import validate

    try:
        validate({"executor": executor})
    except ConfigError as err:
        return f"not available: {err}"
    return None


# --- plain PyTorch loop (optionally with Opacus DP-SGD) -------------------------------------

BatchPlan = Callable[[int, int], Iterable[torch.Tensor | slice]]


def consecutive_batches(w: Workload) -> BatchPlan:
    """Step s takes rows ``[s * batch, (s + 1) * batch)`` (the rows are already random)."""

    def plan(cid: int, n: int) -> Iterator[slice]:
        for s in range(w.steps):
            start = (s * w.batch) % n
            yield slice(start, start + w.batch)

    return plan


def local_sgd(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batches: list, lr: float, dp: bool
) -> nn.Module:
    """torch.optim.SGD on one client's rows, one step per entry of ``batches``; with ``dp``
    DP-SGD through Opacus' GradSampleModule and DPOptimizer (fixed-size batches)."""
    optimizer: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    if dp:
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer

        model = GradSampleModule(model)
        optimizer = DPOptimizer(
            torch.optim.SGD(model.parameters(), lr=lr), noise_multiplier=NOISE_MULTIPLIER,
            max_grad_norm=CLIP, expected_batch_size=len(y[batches[0]]),
        )
    for idx in batches:
        optimizer.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        optimizer.step()
    return model._module if dp else model


def plain_fedavg_round(
    model: nn.Module, clients: Iterable[tuple[torch.Tensor, torch.Tensor]], plan: BatchPlan, lr: float, dp: bool = False
) -> None:
    """One FedAvg round in place on ``model``: copy it per client, train, average uniformly."""
    total: dict[str, torch.Tensor] | None = None
    count = 0
    for cid, (x, y) in enumerate(clients):
        local = local_sgd(copy.deepcopy(model), x, y, list(plan(cid, len(x))), lr, dp)
        params = {k: v.detach() for k, v in local.named_parameters()}
        total = params if total is None else {k: total[k] + params[k] for k in total}
        count += 1
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(total[name] / count)


def run_plain_loop(case: Case, dp_engine: bool = False) -> list[float]:
    """Round times of the plain PyTorch FedAvg loop on ``case`` (``dp_engine``: DP-SGD through Opacus)."""
    w, device = case.spec, case_device(case)
    torch.manual_seed(case.seed)
    model = build(w, device)
    x, y = (t.to(device) for t in cohort_tensors(w, case.clients, case.seed))
    plan = consecutive_batches(w)
    return timed(
        case.warmup + case.rounds, lambda r: plain_fedavg_round(model, zip(x, y), plan, w.lr, dp_engine), device
    )


def run_opacus(case: Case) -> list[float]:
    """Round times of the plain loop with Opacus DP-SGD; :class:`Unavailable` without ``case.dp`` or Opacus."""
    if not case.dp:
        raise Unavailable("opacus runs only the DP-SGD variant (without DP it is plain-loop)")
    try:
        import opacus  # noqa: F401
    except ImportError as err:
        raise Unavailable(f"opacus not installed ({err})") from None
    return run_plain_loop(case, dp_engine=True)


# --- centralised: the compute limit -----------------------------------------------------------


def private_big_batch_grad(model: nn.Module, x: torch.Tensor, y: torch.Tensor, generator: torch.Generator) -> None:
    """DP-SGD gradient of the big batch into ``.grad``: per-example grads (vmap), clip, sum, noise."""
    from torch.func import functional_call, grad, vmap

    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, xi, yi):
        return F.cross_entropy(functional_call(model, p, (xi.unsqueeze(0),)), yi.unsqueeze(0))

    summed = {k: torch.zeros_like(v) for k, v in params.items()}
    chunk = max(1, min(CENTRAL_CHUNK, PER_EXAMPLE_BYTES // (4 * sum(v.numel() for v in params.values()))))
    for start in range(0, len(x), chunk):
        g = vmap(grad(loss), in_dims=(None, 0, 0))(params, x[start : start + chunk], y[start : start + chunk])
        norms = torch.linalg.vector_norm(torch.stack([v.flatten(1).norm(dim=1) for v in g.values()]), dim=0)
        factor = (CLIP / (norms + 1e-15)).clamp(max=1.0)
        for k in summed:
            summed[k] += torch.tensordot(factor, g[k], dims=1)
    for k, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=generator, device=generator.device).to(p.device) * CLIP * NOISE_MULTIPLIER
        p.grad = (summed[k] + noise) / len(x)


def central_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """Mean-loss gradient of the whole batch into ``.grad``, accumulated in chunks."""
    for start in range(0, len(x), CENTRAL_CHUNK):
        xc, yc = x[start : start + CENTRAL_CHUNK], y[start : start + CENTRAL_CHUNK]
        (F.cross_entropy(model(xc), yc, reduction="sum") / len(x)).backward()


def run_centralised(case: Case) -> list[float]:
    """One model, ``steps`` SGD steps per round on batches of ``clients * batch`` rows."""
    w, device = case.spec, case_device(case)
    torch.manual_seed(case.seed)
    model = build(w, device)
    x, y = cohort_tensors(w, case.clients, case.seed)
    x, y = x.flatten(0, 1).to(device), y.flatten().to(device)
    big = case.clients * w.batch
    optimizer = torch.optim.SGD(model.parameters(), lr=w.lr)
    generator = torch.Generator().manual_seed(case.seed)

    def one_round(r: int) -> None:
        for s in range(w.steps):
            rows = slice(s * big, (s + 1) * big)
            optimizer.zero_grad()
            if case.dp:
                private_big_batch_grad(model, x[rows], y[rows], generator)
            else:
                central_step(model, x[rows], y[rows])
            optimizer.step()

    return timed(case.warmup + case.rounds, one_round, device)


# --- Flower ---------------------------------------------------------------------------------


def run_flower(case: Case) -> list[float]:
    """Flower's Ray simulation (legacy ``start_simulation``), one actor per CPU core.

    Each ``fit`` generates its client's rows (Flower's "load the partition in the
    client" idiom) and trains like the plain loop; a round is timed from the strategy's
    ``configure_fit`` to the end of its ``aggregate_fit``.
    """
    if case.dp:
        raise Unavailable("Flower has no example-level DP-SGD built in (see opacus)")
    try:
        import flwr as fl
        from flwr.common import Context, ndarrays_to_parameters
    except ImportError as err:
        raise Unavailable(f"flwr not installed ({err})") from None
    w, seed, device = case.spec, case.seed, case_device(case)
    torch.manual_seed(seed)
    init = [p.detach().numpy() for p in build(w).parameters()]
    plan = consecutive_batches(w)
    cores = os.cpu_count() or 1
    gpu_share = 1.0 / cores if device.type == "cuda" else 0.0  # Ray actors share the GPU

    class BenchClient(fl.client.NumPyClient):
        def __init__(self, cid: int) -> None:
            self.cid = cid

        def fit(self, parameters, config):
            torch.set_num_threads(1)  # one Ray actor per core
            where = "cuda" if gpu_share else "cpu"  # the GPU Ray gives this actor
            model = build(w, where)
            with torch.no_grad():
                for p, a in zip(model.parameters(), parameters):
                    p.copy_(torch.from_numpy(a))
            x, y = (t.to(where) for t in client_tensors(w, self.cid, seed))
            local_sgd(model, x, y, list(plan(self.cid, len(x))), w.lr, dp=False)
            return [p.detach().cpu().numpy() for p in model.parameters()], len(x), {}

    def client_fn(context: Context):
        return BenchClient(int(context.node_config["partition-id"])).to_client()

    marks: list[list[float]] = []

    class TimedFedAvg(fl.server.strategy.FedAvg):
        def configure_fit(self, server_round, parameters, client_manager):
            marks.append([time.perf_counter()])
            return super().configure_fit(server_round, parameters, client_manager)

        def aggregate_fit(self, server_round, results, failures):
            if failures:
                raise RuntimeError(f"{len(failures)} Flower clients failed: {failures[0]!r}")
            out = super().aggregate_fit(server_round, results, failures)
            marks[-1].append(time.perf_counter())
            return out

    n = case.clients
    strategy = TimedFedAvg(
        fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=n, min_available_clients=n,
        initial_parameters=ndarrays_to_parameters(init),
    )
    fl.simulation.start_simulation(
        client_fn=client_fn, num_clients=n, strategy=strategy,
        config=fl.server.ServerConfig(num_rounds=case.warmup + case.rounds),
        client_resources={"num_cpus": 1, "num_gpus": gpu_share},
        ray_init_args={"num_cpus": cores, "include_dashboard": False, "log_to_driver": False},
    )
    times = [m[1] - m[0] for m in marks if len(m) == 2]
    if len(times) != case.warmup + case.rounds:
        raise RuntimeError(f"Flower finished {len(times)} of {case.warmup + case.rounds} rounds")
    return times


RUNNERS: dict[str, Callable[[Case], list[float]]] = {
    "plain-loop": run_plain_loop,
    "centralised": run_centralised,
    "flower": run_flower,
    "opacus": run_opacus,
}


def runner(system: str) -> Callable[[Case], list[float]]:
    """The runner of ``system``; ``fedveil-<executor>`` runs fedveil with that executor."""
    if system.startswith("fedveil-"):
        executor = system.removeprefix("fedveil-")
        return lambda case: run_fedveil(case, executor)
    if system not in RUNNERS:
        raise ValueError(f"unknown system '{system}'; choose fedveil-<executor> or one of {', '.join(RUNNERS)}")
    return RUNNERS[system]
