"""Person-level epsilon (``records_per_person = k``) against independent values.

* Full-batch Gaussian: a person's k records move the sum by k C, so the RDP is the closed
  form ``alpha k^2 / (2 z^2)``; its epsilon is computed here from that formula.
* Poisson sampling: the true k-record mechanism (j ~ Bin(k, q) of the records in the batch,
  the worst case all shifting one way) is integrated numerically at integer orders in both
  directions, and must never exceed the RDP fedveil accounts for it.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import integrate, stats

from fedveil.config import ConfigError, validate
from fedveil.privacy.composition import DEFAULT_ORDERS
from fedveil.privacy.person_level import person_event
from fedveil.runtime import Simulation

DELTA = 1e-5


def rdp_of(event: dp_event.DpEvent, orders: list[float]) -> np.ndarray:
    accountant = rdp_privacy_accountant.RdpAccountant(orders)
    accountant.compose(event)
    return np.asarray(accountant._rdp)


def test_full_batch_gaussian_with_k_records_has_the_closed_form_rdp():
    z, k, steps = 3.0, 4, 50
    event = person_event(dp_event.GaussianDpEvent(z), k)
    accountant = rdp_privacy_accountant.RdpAccountant(list(DEFAULT_ORDERS))
    accountant.compose(event, steps)
    closed = [steps * a * k * k / (2 * z * z) for a in DEFAULT_ORDERS]
    want, _ = rdp_privacy_accountant.compute_epsilon(list(DEFAULT_ORDERS), closed, DELTA)
    assert accountant.get_epsilon(DELTA) == pytest.approx(want, rel=1e-9)


def true_group_rdp(q: float, z: float, k: int, alpha: int) -> tuple[float, float]:
    """Both Renyi divergences of the k-record Poisson-subsampled Gaussian (C = 1, worst case
    all k records shifting the same way): P = sum_j Bin(k, q)(j) N(j, z^2) vs Q = N(0, z^2)."""
    weights = stats.binom.pmf(np.arange(k + 1), k, q)

    def p(x):
        return sum(w * stats.norm.pdf(x, j, z) for j, w in enumerate(weights))

    def q_(x):
        return stats.norm.pdf(x, 0, z)

    lo, hi = -12 * z, k + 12 * z
    forward = integrate.quad(lambda x: p(x) ** alpha * q_(x) ** (1 - alpha), lo, hi, limit=200)[0]
    backward = integrate.quad(lambda x: q_(x) ** alpha * p(x) ** (1 - alpha), lo, hi, limit=200)[0]
    return math.log(forward) / (alpha - 1), math.log(backward) / (alpha - 1)


@pytest.mark.parametrize("q, z, k", [(0.05, 1.0, 2), (0.1, 2.0, 3), (0.3, 1.5, 2)])
def test_poisson_k_record_rdp_bounds_the_true_group_mechanism(q, z, k):
    orders = [2.0, 3.0, 4.0, 6.0, 8.0]
    bound = rdp_of(person_event(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), k), orders)
    single = rdp_of(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), orders)
    for alpha, b, s in zip(orders, bound, single):
        forward, backward = true_group_rdp(q, z, k, int(alpha))
        assert max(forward, backward) <= b * (1 + 1e-6), (alpha, forward, backward, b)
        assert b > s  # a person costs more than a record


def test_person_level_epsilon_in_a_run(tmp_path, monkeypatch):
    import fedveil.runtime.simulation as simulation

    monkeypatch.setattr(simulation, "write_report", lambda path: [])
    raw = {
        "data": {"name": "digits", "num_clients": 3}, "model": {"name": "linear"},
        "client": {"batch_size": 32, "lr": 0.1, "steps": 4}, "federation": {"rounds": 3, "clients_per_round": 3},
        "privacy": {"level": "example", "epsilon": 2.0, "delta": DELTA, "records_per_person": 3},
    }
    sim = Simulation.from_config(validate(raw))
    summary = sim.run(tmp_path / "run")
    assert summary["records_per_person"] == 3
    for cid in range(3):
        n = sim.data.clients[cid].num_train
        z, q = summary["noise_multiplier_per_client"][cid], 32 / n
        accountant = rdp_privacy_accountant.RdpAccountant(list(DEFAULT_ORDERS))
        accountant.compose(dp_event.PoissonSampledDpEvent(1 - (1 - q) ** 3, dp_event.GaussianDpEvent(z / 3)), 3 * 4)
        assert summary["person_epsilon_per_client"][cid] == pytest.approx(accountant.get_epsilon(DELTA), rel=1e-9)
        assert summary["person_epsilon_per_client"][cid] > summary["epsilon_per_client"][cid]
    assert summary["person_epsilon"] == max(summary["person_epsilon_per_client"])


def test_fixed_size_cohorts_refuse_several_records_per_person():
    raw = {
        "data": {"name": "digits", "num_clients": 10}, "model": {"name": "linear"},
        "federation": {"rounds": 2, "clients_per_round": 5, "sampling": "fixed"},
        "privacy": {"level": "client", "epsilon": 2.0, "records_per_person": 2},
    }
    with pytest.raises(ConfigError, match="records_per_person"):
        Simulation.from_config(validate(raw))
