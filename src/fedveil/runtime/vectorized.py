"""The vectorized executor: a round's cohort trained as one stacked computation.

Algorithms stay as they are. Each client's ``client_update`` runs in its own thread
with a trainer that, instead of training, posts its ``train`` call and waits. When
every client is either waiting or done, the executor trains all posted calls at
once (:func:`~fedveil.training.cohort.train_stacked`, in cohort order) and
wakes the clients, which go on to build their messages, and possibly train again
(fine-tuning, Ditto's two models): each such wave is stacked in turn. Since a wave
starts only when every client has reached it, waves and results do not depend on
thread timing.

Models the engine cannot stack (e.g. the char-LSTM) are trained client by client,
with a warning, so any run works with ``executor = "vectorized"``.
"""
from __future__ import annotations

import queue
import threading
import warnings
from dataclasses import dataclass, field, replace
from typing import Any

from torch import nn

from ..algorithms.base import Algorithm, ClientResult, ClientTask, State
from .intra_op import use_one_intra_op_thread
from .serial import with_dp_trainings
from ..engine import StackedModel, UnsupportedModelError
from ..training.cohort import stacking_key, train_stacked
from ..training.local import LocalTrainer
from ..training.request import TrainRequest
from ..training.private_stacked import check_private_stacking

# Clients stacked in one computation at most (bounds memory: stacked params, grads, activations).
MAX_STACKED_BYTES = 1 << 30


@dataclass
class _Post:
    job: int
    trainer: LocalTrainer
    request: TrainRequest
    result: Any = None
    done: threading.Event = field(default_factory=threading.Event)


class _Gate:
    """Counts clients that are still computing; collects the train calls of those waiting."""

    def __init__(self, clients: int) -> None:
        self.cond = threading.Condition()
        self.running = clients
        self.posts: list[_Post] = []

    def post(self, post: _Post) -> Any:
        with self.cond:
            self.posts.append(post)
            self._one_less()
        post.done.wait()
        if isinstance(post.result, BaseException):
            raise post.result
        return post.result

    def finished(self) -> None:
        with self.cond:
            self._one_less()

    def _one_less(self) -> None:
        self.running -= 1
        if self.running == 0:  # only the last one wakes the executor (not a wake-up per client)
            self.cond.notify_all()

    def next_wave(self) -> list[_Post]:
        with self.cond:
            self.cond.wait_for(lambda: self.running == 0)
            wave, self.posts = sorted(self.posts, key=lambda p: p.job), []
            self.running += len(wave)
            return wave


class _Workers:
    """Daemon threads kept between rounds: each job of :meth:`run` gets a thread of its own at
    once (every client must be able to wait at the gate together), reusing idle threads and
    starting new ones only when all are busy, so a round does not pay a thread start per client."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.idle = 0

    def run(self, jobs: list) -> threading.Event:
        """Start every job now; the returned event is set when all have returned."""
        finished, left = threading.Event(), [len(jobs)]
        if not jobs:
            finished.set()

        def counted(job) -> None:
            try:
                job()
            finally:
                with self.lock:
                    left[0] -= 1
                    if left[0] == 0:
                        finished.set()

        with self.lock:
            missing = max(0, len(jobs) - self.idle)
            self.idle -= len(jobs) - missing
        for _ in range(missing):
            threading.Thread(target=self._serve, daemon=True, name="fedveil-client").start()
        for job in jobs:
            self.jobs.put(lambda job=job: counted(job))
        return finished

    def _serve(self) -> None:
        use_one_intra_op_thread()  # a client's own tensors are small; the stacked kernels keep the cores
        while True:
            self.jobs.get()()
            with self.lock:
                self.idle += 1


_WORKERS = _Workers()


class _PostingTrainer:
    """Stands in for a :class:`LocalTrainer`: ``train`` is posted to the gate, the rest delegated."""

    def __init__(self, trainer: LocalTrainer, gate: _Gate, job: int) -> None:
        self._trainer, self._gate, self._job = trainer, gate, job

    def train(self, params, data, generator, round_idx, grad_hook=None, dp=None, **request):
        request = TrainRequest(params, data, generator, round_idx, grad_hook, dp, **request)
        return self._gate.post(_Post(self._job, self._trainer, request))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._trainer, name)


class VectorizedExecutor:
    """Trains a round's cohort stacked: each client's ``client_update`` runs in its own thread
    and posts its local training; once every client waits or is done, the posted trainings run
    at once as one stacked computation (module docstring)."""

    name = "vectorized"

    def __init__(self) -> None:
        self._stacked: dict[int, StackedModel | None] = {}

    def run_cohort(
        self, algorithm: Algorithm, server_state: State, jobs: list[tuple[ClientTask, State | None]]
    ) -> list[ClientResult]:
        """Every (task, client state) job's ``ClientResult``, in job order; a client's error is
        re-raised here."""
        gate = _Gate(len(jobs))
        results: list[Any] = [None] * len(jobs)
        errors: list[BaseException | None] = [None] * len(jobs)

        def work(i: int, task: ClientTask, client_state: State | None) -> None:
            try:
                posting = replace(task, trainer=_PostingTrainer(task.trainer, gate, i))
                results[i] = algorithm.client_update(server_state, client_state, posting)
            except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
                errors[i] = err
            finally:
                gate.finished()

        finished = _WORKERS.run([lambda i=i, t=t, s=s: work(i, t, s) for i, (t, s) in enumerate(jobs)])
        while True:
            wave = gate.next_wave()
            if not wave:
                break
            self._train_wave(wave)
        finished.wait()
        for err in errors:
            if err is not None:
                raise err
        return [with_dp_trainings(result, task) for result, (task, _) in zip(results, jobs)]

    def _train_wave(self, wave: list[_Post]) -> None:
        groups: dict[tuple, list[_Post]] = {}
        for post in wave:  # requests stack when trainer, round, model variant, objective, mask kind and privacy agree
            key = (id(post.trainer), post.request.round_idx, stacking_key(post.request, post.trainer))
            groups.setdefault(key, []).append(post)
        try:
            for posts in groups.values():
                self._train_group(posts)
        except BaseException as err:  # noqa: BLE001 - wake every client with the error
            for post in wave:
                if not post.done.is_set():
                    post.result = err
                    post.done.set()
            raise

    def _train_group(self, posts: list[_Post]) -> None:
        trainer, first = posts[0].trainer, posts[0].request
        model = trainer.model if first.model is None else first.model
        # a per-step input transform (PGD pairs) runs the model on each client's own batch
        stacked = None if first.input_fn is not None else self._stacked_model(model, private=first.dp is not None)
        if stacked is None:
            outputs = [trainer.run(p.request) for p in posts]
        else:
            outputs = []
            for chunk in _chunks(posts, stacked_chunk_size(model)):
                outputs += train_stacked(trainer, stacked, [p.request for p in chunk])
        for post, output in zip(posts, outputs):
            post.result = output
            post.done.set()

    def probe(self, model: nn.Module, private: bool) -> None:
        """Check ``model`` before any work: a model the engine cannot stack is reported now,
        in one warning line, and trained client by client."""
        self._stacked_model(model, private)

    def _stacked_model(self, model: nn.Module, private: bool) -> StackedModel | None:
        key = id(model) * 2 + int(private)
        if key not in self._stacked:
            try:
                stacked = StackedModel(model)
                if private:
                    check_private_stacking(model)
            except UnsupportedModelError as err:
                warnings.warn(f"vectorized executor: training clients one by one: {err}", stacklevel=2)
                stacked = None
            self._stacked[key] = stacked
        return self._stacked[key]


def stacked_chunk_size(model: nn.Module) -> int:
    """How many copies of ``model`` one stacked computation trains at most (:data:`MAX_STACKED_BYTES`)."""
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return max(1, MAX_STACKED_BYTES // (8 * param_bytes))  # params, grads, momentum, updates + slack


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]
