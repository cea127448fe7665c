"""Executors run one round's cohort of client updates. ``serial`` is the readable reference;
``vectorized`` stacks the cohort's local training (:mod:`fedveil.runtime.vectorized`)."""
from __future__ import annotations

from ..algorithms.base import Algorithm, ClientResult, ClientTask, State


class SerialExecutor:
    """Runs the cohort's ``client_update`` calls one after another in this process."""

    name = "serial"

    def run_cohort(
        self, algorithm: Algorithm, server_state: State, jobs: list[tuple[ClientTask, State | None]]
    ) -> list[ClientResult]:
        return [algorithm.client_update(server_state, client_state, task) for task, client_state in jobs]


EXECUTORS = ("serial", "vectorized")


def make_executor(name: str):
    if name == "serial":
        return SerialExecutor()
    if name == "vectorized":
        from .vectorized import VectorizedExecutor

        return VectorizedExecutor()
    raise ValueError(f"unknown executor '{name}'; available: {', '.join(EXECUTORS)}")
