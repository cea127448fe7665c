"""The Ray executor: a round's cohort sharded over Ray workers (local or an existing cluster).

The server keeps everything that persists (server state, client state, the privacy
ledger): each round, every worker receives its shard of clients (their data, their
state, the state of their random stream) and returns their results, which are what the
serial executor would have produced for the same seed, DP-SGD steps taken included
(``ClientResult.dp_trainings``, filled by the inner executor on the worker). Inside a
worker the shard is trained by the vectorized executor (or the serial one).

Devices: tensors travel as CPU tensors; a worker moves its shard to its own device (its
GPU when the run's device is CUDA, each shard task asking Ray for ``1 / workers`` of a
GPU, else the CPU), and the results come back to the run's device. The algorithm (with the
model and trainer it holds) is placed in Ray's object store once per run, where its
tensors keep their device, so a CUDA run's workers need a GPU: use ``device = "cuda"``.
The server state is placed there once per round.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..algorithms.base import Algorithm, ClientResult, ClientTask, State
from ..data.federated import ClientData
from .device import CPU, dataset_to, to_cpu, to_device
from .serial import SerialExecutor
from .threaded import ThreadsExecutor
from .vectorized import VectorizedExecutor


def _require_ray():
    try:
        import ray
    except ImportError:
        raise RuntimeError(
            "executor = \"ray\" needs Ray: pip install 'fedveil[ray]' (or pip install ray)"
        ) from None
    return ray


def _shard_payload(task: ClientTask, client_state: State | None) -> dict[str, Any]:
    """What a worker needs to rebuild one client's task (a Generator travels as its state),
    as CPU tensors."""
    return {
        "client_id": task.client_id, "round": task.round, "data": _client_data_to(task.data, CPU),
        "generator_state": task.generator.get_state(), "dp": task.dp, "client_state": to_cpu(client_state),
        "privacy_budget": task.privacy_budget,
    }


def _client_data_to(data: ClientData, device: torch.device) -> ClientData:
    return dataclasses.replace(
        data, train=dataset_to(data.train, device), test=dataset_to(data.test, device),
        val=None if data.val is None else dataset_to(data.val, device),
    )


def _result_to(result: ClientResult, device: torch.device) -> ClientResult:
    return dataclasses.replace(result, message=to_device(result.message, device), state=to_device(result.state, device))


def _run_shard(
    algorithm: Algorithm, server_state: State, payloads: list[dict], inner: str, device: str = "cpu"
) -> list[ClientResult]:
    """Worker side: move the shard to ``device``, rebuild the tasks, run them with the inner
    executor (which fills each result's DP-SGD steps); results go back as CPU tensors."""
    where = torch.device(device)
    server_state = to_device(server_state, where)
    jobs = []
    for p in payloads:
        generator = torch.Generator()
        generator.set_state(p["generator_state"])
        task = ClientTask(
            p["client_id"], p["round"], _client_data_to(p["data"], where), generator, algorithm.ctx.trainer, p["dp"],
            p["privacy_budget"],
        )
        jobs.append((task, to_device(p["client_state"], where)))
    results = _inner_executor(inner).run_cohort(algorithm, server_state, jobs)
    return [_result_to(r, CPU) for r in results]


def _inner_executor(name: str):
    """The executor a worker runs its shard with (``ray.inner``)."""
    if name == "serial":
        return SerialExecutor()
    if name == "threads":
        return ThreadsExecutor(torch.get_num_threads())
    if name == "vectorized":
        return VectorizedExecutor()
    raise ValueError(f"ray.inner must be 'serial', 'threads' or 'vectorized', got '{name}'")


class RayExecutor:
    """Runs the cohort in ``workers`` shards on Ray workers, each trained by the ``inner`` executor (module doc)."""

    name = "ray"

    def __init__(
        self, address: str | None = None, workers: int = 2, inner: str = "vectorized",
        device: torch.device | str = "cpu",
    ) -> None:
        self.ray = _require_ray()
        if not self.ray.is_initialized():
            kwargs: dict[str, Any] = {"address": address} if address else {"num_cpus": workers}
            self.ray.init(include_dashboard=False, log_to_driver=False, ignore_reinit_error=True, **kwargs)
        self.workers, self.inner, self.device = workers, inner, torch.device(device)
        on_gpu = self.device.type == "cuda"
        # a worker sees the GPU Ray gives its task as "cuda"
        self._worker_device = "cuda" if on_gpu else "cpu"
        self._remote = self.ray.remote(num_gpus=1.0 / workers if on_gpu else 0)(_run_shard)
        self._algorithm_ref = None
        self._algorithm_id = None

    def run_cohort(
        self, algorithm: Algorithm, server_state: State, jobs: list[tuple[ClientTask, State | None]]
    ) -> list[ClientResult]:
        """Every (task, client state) job's ``ClientResult``, in job order, on the run's device."""
        if not jobs:
            return []
        if self._algorithm_id != id(algorithm):
            self._algorithm_ref, self._algorithm_id = self.ray.put(algorithm), id(algorithm)
        state_ref = self.ray.put(to_cpu(server_state))
        shards = [jobs[i :: self.workers] for i in range(min(self.workers, len(jobs)))]
        futures = [
            self._remote.remote(
                self._algorithm_ref, state_ref, [_shard_payload(t, s) for t, s in shard], self.inner, self._worker_device
            )
            for shard in shards
        ]
        by_job: dict[int, ClientResult] = {}
        for shard_index, (shard, outputs) in enumerate(zip(shards, self.ray.get(futures))):
            for pos, result in enumerate(outputs):
                by_job[shard_index + pos * self.workers] = _result_to(result, self.device)
        return [by_job[i] for i in range(len(jobs))]


__all__ = ["RayExecutor"]
