"""The serial executor: the readable reference every other executor must agree with."""
from __future__ import annotations

from ..algorithms.base import Algorithm, ClientResult, ClientTask, State


def with_dp_trainings(result: ClientResult, task: ClientTask) -> ClientResult:
    """``result`` with the DP-SGD steps of each of the task's local trainings, read from
    ``task.dp`` right after ``client_update`` returned: what the runtime accounts. Every
    executor calls this on the machine that trained, so the steps travel with the result."""
    result.dp_trainings = [] if task.dp is None else list(task.dp.trainings)
    return result


class SerialExecutor:
    """Runs the cohort's ``client_update`` calls one after another in this process."""

    name = "serial"

    def run_cohort(
        self, algorithm: Algorithm, server_state: State, jobs: list[tuple[ClientTask, State | None]]
    ) -> list[ClientResult]:
        """Every (task, client state) job's ``ClientResult``, in job order, each with its DP-SGD trainings."""
        return [
            with_dp_trainings(algorithm.client_update(server_state, client_state, task), task)
            for task, client_state in jobs
        ]
