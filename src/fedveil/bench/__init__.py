"""Benchmark suite: fedveil's simulation against a plain PyTorch loop, a centralised
big-batch model, Flower and Opacus on the same federated workloads (``fedveil bench``).

``run_suite`` is imported lazily, so that ``python -m fedveil.bench.harness`` (one case
per subprocess) does not import the harness twice.
"""
from typing import Any

__all__ = ["run_suite"]


def __getattr__(name: str) -> Any:
    if name == "run_suite":
        from .harness import run_suite

        return run_suite
    raise AttributeError(f"module 'fedveil.bench' has no attribute '{name}'")
