"""The Ray executor: a round's cohort sharded over Ray workers (local or an existing cluster).

The server keeps everything that persists (server state, client state, the privacy
ledger): each round, every worker receives its shard of clients (their data, their
state, the state of their random stream) and returns their results, which are what the
serial executor would have produced for the same seed. Inside a worker the shard is
trained by the vectorized executor (or the serial one).

The algorithm (with the model and trainer it holds) is placed in Ray's object store
once per run; the server state once per round.
"""
from __future__ import annotations

from typing import Any

import torch

from ..algorithms.base import Algorithm, ClientResult, ClientTask, State
from .serial import SerialExecutor
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
    """What a worker needs to rebuild one client's task (a Generator travels as its state)."""
    return {
        "client_id": task.client_id, "round": task.round, "data": task.data,
        "generator_state": task.generator.get_state(), "dp": task.dp, "client_state": client_state,
    }


def _run_shard(algorithm: Algorithm, server_state: State, payloads: list[dict], inner: str) -> list[tuple[ClientResult, list[int]]]:
    """Worker side: rebuild the tasks, run them with the inner executor, report the DP
    steps of each training."""
    jobs = []
    for p in payloads:
        generator = torch.Generator()
        generator.set_state(p["generator_state"])
        task = ClientTask(p["client_id"], p["round"], p["data"], generator, algorithm.ctx.trainer, p["dp"])
        jobs.append((task, p["client_state"]))
    results = _inner_executor(inner).run_cohort(algorithm, server_state, jobs)
    return [(r, [] if task.dp is None else task.dp.trainings) for r, (task, _) in zip(results, jobs)]


def _inner_executor(name: str):
    """The executor a worker runs its shard with (``ray.inner``)."""
    if name == "serial":
        return SerialExecutor()
    if name == "vectorized":
        return VectorizedExecutor()
    raise ValueError(f"ray.inner must be 'serial' or 'vectorized', got '{name}'")


class RayExecutor:
    name = "ray"

    def __init__(self, address: str | None = None, workers: int = 2, inner: str = "vectorized") -> None:
        self.ray = _require_ray()
        if not self.ray.is_initialized():
            kwargs: dict[str, Any] = {"address": address} if address else {"num_cpus": workers}
            self.ray.init(include_dashboard=False, log_to_driver=False, ignore_reinit_error=True, **kwargs)
        self.workers, self.inner = workers, inner
        self._remote = self.ray.remote(_run_shard)
        self._algorithm_ref = None
        self._algorithm_id = None

    def run_cohort(
        self, algorithm: Algorithm, server_state: State, jobs: list[tuple[ClientTask, State | None]]
    ) -> list[ClientResult]:
        if not jobs:
            return []
        if self._algorithm_id != id(algorithm):
            self._algorithm_ref, self._algorithm_id = self.ray.put(algorithm), id(algorithm)
        state_ref = self.ray.put(server_state)
        shards = [jobs[i :: self.workers] for i in range(min(self.workers, len(jobs)))]
        futures = [
            self._remote.remote(self._algorithm_ref, state_ref, [_shard_payload(t, s) for t, s in shard], self.inner)
            for shard in shards
        ]
        by_job: dict[int, ClientResult] = {}
        for shard_index, (shard, outputs) in enumerate(zip(shards, self.ray.get(futures))):
            for pos, ((task, _), (result, trainings)) in enumerate(zip(shard, outputs)):
                if task.dp is not None:  # the server accounts what the worker released
                    task.dp.trainings.extend(trainings)
                by_job[shard_index + pos * self.workers] = result
        return [by_job[i] for i in range(len(jobs))]


__all__ = ["RayExecutor"]
