"""Every registered algorithm gives the same numbers on every executor, with and without DP.

The list comes from the registry, so a new algorithm is covered the moment it registers.
Serial is the reference; threads and vectorized must agree on the final server state, every
client's state and the per-round metrics (epsilons included). Runs are compared in float64
(``checkpoint_in_float64``, as the Split-Mix and example tests are), so a float32 near-tie
cannot split the executors and the tolerance is tight.
"""
from __future__ import annotations

import pytest
import torch

from fedveil.algorithms import ALGORITHMS
from tiny_runs import algorithm_sections, checkpoint_in_float64, merge, tiny_config, without_wall_clock

pytestmark = pytest.mark.usefixtures("skip_plots")

RTOL = 1e-9
ATOL = 1e-9  # absolute floor for coordinates that are (nearly) zero

PRIVACY = {
    "none": {},
    "example": {"level": "example", "epsilon": 4.0, "clip": 0.5},
    "client": {"level": "client", "noise_multiplier": 1.0},
}


def _cases() -> list[tuple[str, str]]:
    cases = []
    for name in ALGORITHMS.names():
        algorithm = ALGORITHMS.get(name)
        for level in PRIVACY:
            if level == "example" and not algorithm.supports_example_dp:
                continue
            if level == "client" and not algorithm.supports_client_dp:
                continue
            cases.append((name, level))
    return cases


def _assert_tree_close(a, b, where: str) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _assert_tree_close(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, torch.Tensor):
        torch.testing.assert_close(b, a, rtol=RTOL, atol=ATOL, msg=where)
    else:
        assert a == pytest.approx(b, rel=RTOL, nan_ok=True), where


def _rows_close(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for ra, rb in zip(without_wall_clock(a), without_wall_clock(b)):
        assert ra.keys() == rb.keys()
        for key in ra:
            assert ra[key] == pytest.approx(rb[key], rel=RTOL, abs=ATOL, nan_ok=True), key


@pytest.mark.parametrize("name, level", _cases())
def test_serial_threads_and_vectorized_agree(name, level):
    sections = {
        "algorithm": {"name": name},
        "model": {"name": "mlp", "options": {"hidden": [8]}},
        "data": {"num_clients": 6},
        "federation": {"rounds": 2, "clients_per_round": 3},
        "client": {"batch_size": 16, "momentum": 0.5},
        "checkpoint": {"every": 0},
        "privacy": PRIVACY[level],
    }
    sections = algorithm_sections(name, sections)
    results = {executor: checkpoint_in_float64(tiny_config(**merge(sections, {"executor": executor})))
               for executor in ("serial", "threads", "vectorized")}
    rows_s, ck_s = results["serial"]
    for executor in ("threads", "vectorized"):
        rows, ck = results[executor]
        _rows_close(rows_s, rows)
        _assert_tree_close(ck_s["server"], ck["server"], f"{executor}: server")
        _assert_tree_close(ck_s["clients"], ck["clients"], f"{executor}: clients")


def test_every_algorithm_is_covered_with_and_without_dp():
    covered = _cases()
    assert {name for name, _ in covered} == set(ALGORITHMS.names())
    assert all((name, "none") in covered for name in ALGORITHMS.names())
