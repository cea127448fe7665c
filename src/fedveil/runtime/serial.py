"""The serial executor: the readable reference every other executor must agree with."""
from __future__ import annotations

from ..algorithms.base import Algorithm, ClientResult, ClientTask, State


class SerialExecutor:
    """Runs the cohort's ``client_update`` calls one after another in this process."""

    name = "serial"

    def run_cohort(
        self, algorithm: Algorithm, server_state: State, jobs: list[tuple[ClientTask, State | None]]
    ) -> list[ClientResult]:
        return [algorithm.client_update(server_state, client_state, task) for task, client_state in jobs]
