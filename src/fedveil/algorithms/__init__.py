"""Federated algorithms: one module per method, registered by a decorator on import."""
from .base import ALGORITHMS, Algorithm, AlgorithmParams, ClientResult, ClientTask, RunContext
from . import fedavg  # noqa: F401  (registers)

__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmParams", "ClientResult", "ClientTask", "RunContext"]
