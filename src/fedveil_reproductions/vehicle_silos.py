"""The synthetic Vehicle silos (Liu et al. 2022's Vehicle task, spec 002 §5) that the MR-MTL
trade-off and cost reproductions share: one run config per method, epsilon and seed."""
from __future__ import annotations

from typing import Any

from .silo_study import SiloStudy, SiloTask, example_privacy


def vehicle_task(tau: float, num_silos: int = 23, min_size: int = 872, max_size: int = 1933) -> SiloTask:
    """Test accuracy on ``vehicle_synthetic`` with heterogeneity ``tau`` (sizes smaller only in tests)."""

    def config(algorithm: dict, epsilon: float, seed: int, study: SiloStudy) -> dict[str, Any]:
        return {
            "seed": seed,
            "executor": "vectorized",
            "data": {
                "name": "vehicle_synthetic", "num_clients": num_silos, "test_fraction": 0.25,
                "partition": {"name": "natural", "key": "silo"},
                "options": {"tau": tau, "num_silos": num_silos, "min_size": min_size, "max_size": max_size},
            },
            "model": {"name": "linear", "options": {"zero_init": True}},
            "algorithm": algorithm,
            "client": {"batch_size": 64, "lr": study.lr, "loss": "hinge"},
            "federation": {"rounds": study.rounds, "clients_per_round": num_silos},
            "privacy": example_privacy(epsilon, delta=1e-7, clip=6.0),
            "eval": {"every": study.rounds},
            "checkpoint": {"every": 0},
        }

    return SiloTask(f"Vehicle (synthetic), tau={tau:g}", "accuracy", config)
