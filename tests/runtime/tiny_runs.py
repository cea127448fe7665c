"""Tiny, fast run configs and helpers shared by the runtime tests."""
from __future__ import annotations

import copy
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import scipy.io
import torch

from fedveil.config import RunConfig, validate
from fedveil.runtime import Callback
from fedveil.runtime.run_dir import read_metrics

BASE: dict[str, Any] = {
    "seed": 0,
    "data": {"name": "digits", "num_clients": 5},
    "model": {"name": "linear"},
    "algorithm": {"name": "fedavg"},
    "client": {"batch_size": 32, "lr": 0.1},
    "federation": {"rounds": 6, "clients_per_round": 3},
    "checkpoint": {"every": 2},
}

WALL_CLOCK_KEYS = {"elapsed_s", "wall_time_s"}


class Killed(Exception):
    """What :class:`KillAfterRound` raises: the stand-in for a killed process."""


class KillAfterRound(Callback):
    """Raises once round ``at`` has been logged: the process dies before the next checkpoint."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_round_end(self, row):
        if row["round"] == self.at:
            raise Killed(f"killed after round {self.at}")


def tiny_distiller(where: Path, options: dict[str, Any] | None = None) -> str:
    """A stand-in for a finished FedFed phase-1 run on BASE's 1x8x8 digits: the run-directory
    files FedFed's phase 2 reads (``config.json``'s model, ``model.pt``), for an untrained
    ``fedfed_vae`` (the shared features are then x minus an untrained reconstruction)."""
    from fedveil.models import build_model
    from fedveil.models.functional import model_state

    options = {"latent": 4, "width": 4, "rho": 0.05} if options is None else options
    where.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    torch.save(model_state(build_model("fedfed_vae", (1, 8, 8), 10, **options)), where / "model.pt")
    (where / "config.json").write_text(json.dumps({"model": {"name": "fedfed_vae", "options": options}}))
    return str(where)


# one per test process (pytest-xdist workers import this module each)
TINY_DISTILLER = tiny_distiller(Path(tempfile.gettempdir()) / f"fedveil-tiny-distiller-{os.getpid()}")
# sigma 2 on ||x_s|| <= 0.05 * 8 (mu 0.2): epsilon ~ 1 at delta 1e-5, so DP-SGD's budget has room left
FEDFED_PHASE2 = {"algorithm": {"distiller": TINY_DISTILLER, "sigma": 2.0}}

# Algorithms that need their own model and data in registry-driven tests (everything else
# runs BASE's model on digits): merged over a test's sections.
ALGORITHM_SETUP: dict[str, dict[str, Any]] = {
    "adds": {
        "model": {"name": "adds_vgg", "options": {"channels": [], "hidden": [16, 8]}},
    },
    "fedfed_distill": {
        "model": {"name": "fedfed_vae", "options": {"latent": 4, "width": 4}},
        "data": {"name": "synthetic_images", "num_clients": 5, "options": {"height": 8, "width": 8, "rows": 300}},
    },
    **{f"fedfed_{base}": FEDFED_PHASE2 for base in ("fedavg", "fedprox", "scaffold", "fednova")},
    "feddrop": {
        "model": {"name": "adds_vgg", "options": {"channels": [], "hidden": [16, 8]}},
    },
    "fade": {
        "algorithm": {"group_key": "domain"},
        "model": {"name": "fade_mlp", "options": {"hidden": [8], "z_dim": 8, "disc_hidden": [8], "groups": 6}},
        "data": {"name": "rotated_digits", "num_clients": 6, "options": {"num_domains": 6}, "partition": {"name": "domain"}},
    },
    "heterofl": {
        "algorithm": {"budgets": [0.5, 1.0]},  # fractions of the width-0.25 model
        "model": {"name": "digit_cnn", "options": {"width": 0.25, "norm": "none"}},
    },
    "sheterofl": {
        "algorithm": {"budgets": [0.5, 1.0]},  # fractions of the width-0.25 model
        "model": {"name": "digit_cnn", "options": {"width": 0.25, "norm": "none"}},
    },
    "split_mix": {
        "algorithm": {"budgets": [0.125, 0.25]},
        "model": {"name": "digit_cnn", "options": {"width": 0.25, "bases": 2, "norm": "none"}},
    },
}


def algorithm_sections(name: str, sections: dict[str, Any]) -> dict[str, Any]:
    """``sections`` with algorithm ``name`` and whatever model and data it needs."""
    setup = ALGORITHM_SETUP.get(name, {})
    if "model" in setup:  # its own model replaces the test's (whose options would not fit it)
        sections = {**sections, "model": {}}
    return merge(merge(sections, {"algorithm": {"name": name}}), setup)


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def tiny_raw(**sections: Any) -> dict[str, Any]:
    return merge(BASE, sections)


def tiny_config(**sections: Any) -> RunConfig:
    return validate(tiny_raw(**sections))


def deploy_config(**sections: Any) -> RunConfig:
    """A tiny run as deployment tests use it: its simulation trains serially, as each deployed
    silo does, so the two are compared bit for bit (``auto`` would stack the linear model)."""
    return tiny_config(**{"executor": "serial", **sections})


def without_wall_clock(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: without_wall_clock(v) for k, v in obj.items() if k not in WALL_CLOCK_KEYS}
    if isinstance(obj, list):
        return [without_wall_clock(v) for v in obj]
    return obj


def rows_of(run_dir: Path) -> list[dict[str, Any]]:
    return read_metrics(Path(run_dir) / "metrics.jsonl")


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def load_checkpoint(run_dir: Path) -> dict[str, Any]:
    return torch.load(Path(run_dir) / "checkpoint.pt", weights_only=True)


def assert_same_state(a: Any, b: Any, where: str = "state") -> None:
    """Exact (bitwise) equality of nested checkpoint states, wall-clock entries ignored."""
    if isinstance(a, dict):
        assert isinstance(b, dict), where
        a_keys, b_keys = set(a) - WALL_CLOCK_KEYS, set(b) - WALL_CLOCK_KEYS
        assert a_keys == b_keys, f"{where}: keys {sorted(map(str, a_keys))} != {sorted(map(str, b_keys))}"
        for key in a_keys:
            assert_same_state(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), f"{where} differs"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def write_school(directory, sizes=(30, 25, 35)):
    """A School-format file with a well-conditioned linear target (float features)."""
    rng = np.random.default_rng(0)
    xs, ys = [], []
    w = rng.normal(size=28) / 5
    for n in sizes:
        x = rng.normal(size=(n, 28))
        xs.append(x)
        ys.append((x @ w + 0.1 * rng.normal(size=n)).reshape(n, 1))
    directory.mkdir(parents=True, exist_ok=True)
    scipy.io.savemat(directory / "school.mat", {"X": _cells(xs), "Y": _cells(ys)})
    return directory


def _cells(matrices):
    """A 1 x K object array: what savemat writes as a MATLAB cell array."""
    out = np.empty((1, len(matrices)), dtype=object)
    for k, m in enumerate(matrices):
        out[0, k] = m
    return out


def run_in_float64(config: RunConfig) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The run's metrics rows and final server state, with its data and initial model in
    float64: executors compared this way cannot be split by a float32 near-tie (two values of a
    max-pool window closer than rounding send the gradient to different positions)."""
    rows, checkpoint = checkpoint_in_float64(config)
    return rows, checkpoint["server"]


def checkpoint_in_float64(config: RunConfig) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """:func:`run_in_float64`'s rows and the whole final checkpoint (server and client states).
    Torch's default dtype is float64 meanwhile, so the models and tensors an algorithm makes
    itself (IFCA's centroids, FedFed's generator) are float64 too."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return _checkpoint_in_float64(config)
    finally:
        torch.set_default_dtype(before)


def _checkpoint_in_float64(config: RunConfig) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    import dataclasses

    from fedveil.runtime.recorder import MemoryRecorder
    from fedveil.runtime.simulation import Simulation

    def wide(ds):
        return None if ds is None else dataclasses.replace(ds, x=ds.x.double())

    sim = Simulation.from_config(config)
    sim.data = dataclasses.replace(sim.data, test=wide(sim.data.test), clients=[
        dataclasses.replace(c, train=wide(c.train), val=wide(c.val), test=wide(c.test)) for c in sim.data.clients
    ])
    sim.init = {k: v.double() if v.is_floating_point() else v for k, v in sim.init.items()}
    recorder = MemoryRecorder()
    sim.record(recorder)
    return recorder.rows, recorder.load_checkpoint()
