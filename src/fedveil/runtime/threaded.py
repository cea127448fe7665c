"""The threads executor: the cohort's clients trained side by side, one per worker thread.

Each of ``workers`` threads takes the next client, runs its ``client_update`` on one
intra-op thread (:mod:`fedveil.runtime.intra_op`) with a model of its own (a copy of the
trainer's, so that two clients never wait on one model's lock), then takes the next. A
small convolutional net's kernels do not split well across cores; two such clients at once
use them better (2 CPU cores, seconds a round: LeNet x10 1.75-1.81 against 2.17-2.21
serial, ResNet-8 x10 1.26 against 1.53-2.05, ResNet-8 x10 under DP-SGD 1.96 against 2.82).

Each client's numbers are those of the serial executor on one torch thread (its own data,
generator and noise; results in cohort order), whatever the thread timing: bit for bit on
OpenMP kernels; a large float32 matrix product can differ in its last bits when the process
runs on more threads, as MKL in a new thread takes torch's process-wide count
(docs/executors.md#threads-executor).
"""
from __future__ import annotations

import copy
import dataclasses
import threading
from concurrent.futures import ThreadPoolExecutor

from ..algorithms.base import Algorithm, ClientResult, ClientTask, State
from ..training.local import LocalTrainer
from .intra_op import use_one_intra_op_thread
from .serial import with_dp_trainings


class ThreadsExecutor:
    """Runs the cohort's ``client_update`` calls on ``workers`` threads at once (module doc)."""

    name = "threads"

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"the threads executor needs at least 1 worker, got {workers}")
        self.workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._own = threading.local()  # per worker: id(trainer) -> (trainer, its copy)

    def run_cohort(
        self, algorithm: Algorithm, server_state: State, jobs: list[tuple[ClientTask, State | None]]
    ) -> list[ClientResult]:
        """Every (task, client state) job's ``ClientResult``, in job order; the first client
        error (in job order) is re-raised here."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, "fedveil-client", initializer=use_one_intra_op_thread)

        def one(job: tuple[ClientTask, State | None]) -> ClientResult:
            task, client_state = job
            task = dataclasses.replace(task, trainer=self._trainer_copy(task.trainer))
            return with_dp_trainings(algorithm.client_update(server_state, client_state, task), task)

        return list(self._pool.map(one, jobs))

    def _trainer_copy(self, trainer: LocalTrainer) -> LocalTrainer:
        """This worker's copy of ``trainer``, with a model of its own (made once per worker)."""
        copies = getattr(self._own, "copies", None)
        if copies is None:
            copies = self._own.copies = {}
        entry = copies.get(id(trainer))
        if entry is None or entry[0] is not trainer:
            entry = copies[id(trainer)] = (trainer, dataclasses.replace(trainer, model=copy.deepcopy(trainer.model)))
        return entry[1]


__all__ = ["ThreadsExecutor"]
