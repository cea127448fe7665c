"""Person-level epsilon (``records_per_person = k``) against values computed here independently.

* Full batch: k records shift the sum by k C, a Gaussian of sensitivity k, whose exact
  epsilon is the analytic Gaussian mechanism's (Balle & Wang 2018, Thm. 8).
* Poisson sampling: the person's presence gives ``P = sum_j Bin(j; k, q) N(j, z^2)`` against
  ``Q = N(0, z^2)``. One step: the hockey-stick divergences of P and Q integrated
  numerically. Several steps: the privacy-loss distribution built here from the two
  densities (each cell's exact mass, its loss rounded up for an upper bound, down for a
  lower one), composed with dp_accounting's convolution: the true epsilon lies between.
* The group bound (one shift of k C) still used where PLD cannot go must bound the true
  mechanism's Renyi divergences, integrated numerically at integer orders.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import privacy_loss_distribution as pld
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import integrate, optimize, special, stats

from fedveil.config import ConfigError, validate
from fedveil.privacy.composition import DEFAULT_ORDERS
from fedveil.privacy.ledger import PrivacyLedger
from fedveil.privacy.person_level import EXACT, GROUP_BOUND, group_bound_event, group_bound_releases, person_epsilon
from fedveil.runtime import Simulation

DELTA = 1e-5
TOLERANCE = 2e-3  # relative: the code's PLD is discretised at 1e-3, pessimistically


def poisson(q: float, z: float) -> dp_event.PoissonSampledDpEvent:
    return dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z))


def ledger_of(event: dp_event.DpEvent, count: int, accountant: str = "rdp") -> PrivacyLedger:
    ledger = PrivacyLedger(accountant)
    ledger.record(0, event, count)
    return ledger


def epsilon_for(delta_of, delta: float) -> float:
    """The smallest epsilon with ``delta_of(epsilon) <= delta`` (``delta_of`` decreasing)."""
    return optimize.brentq(lambda eps: delta_of(eps) - delta, 0.0, 200.0, xtol=1e-10)


# --------------------------------------------------------------------------- full batch


def analytic_gaussian_epsilon(mu: float, delta: float) -> float:
    """Exact epsilon of N(mu, 1) vs N(0, 1) (Balle & Wang 2018, Thm. 8)."""
    norm = stats.norm
    return epsilon_for(lambda e: norm.cdf(mu / 2 - e / mu) - math.exp(e) * norm.cdf(-mu / 2 - e / mu), delta)


def test_full_batch_gaussian_is_a_gaussian_of_sensitivity_k():
    z, k, steps = 3.0, 4, 50
    got = person_epsilon(ledger_of(dp_event.GaussianDpEvent(z), steps), 0, k, DELTA)
    want = analytic_gaussian_epsilon(k * math.sqrt(steps) / z, DELTA)
    assert got.method == EXACT
    assert want <= got.epsilon <= want * (1 + TOLERANCE)


# --------------------------------------------------------------------------- Poisson, one step


def log_mixture(x: np.ndarray, q: float, z: float, k: int) -> np.ndarray:
    """log of ``sum_j Bin(j; k, q) N(x; j, z^2)``."""
    j = np.arange(k + 1)
    terms = stats.binom.logpmf(j, k, q)[:, None] + stats.norm.logpdf(x[None, :], j[:, None], z)
    return special.logsumexp(terms, axis=0)


def hockey_stick(q: float, z: float, k: int, eps: float) -> float:
    """max over both directions of ``int (A - e^eps B)_+``, A and B the mixture and N(0, z^2)."""
    lo, hi = -14 * z, k + 14 * z

    def p(x):
        return math.exp(log_mixture(np.array([x]), q, z, k)[0])

    def q0(x):
        return stats.norm.pdf(x, 0, z)

    def integral(f):
        return integrate.quad(lambda x: max(f(x), 0.0), lo, hi, limit=400, points=[0, k], epsabs=1e-14)[0]

    return max(integral(lambda x: p(x) - math.exp(eps) * q0(x)), integral(lambda x: q0(x) - math.exp(eps) * p(x)))


@pytest.mark.parametrize("q, z, k", [(0.1, 1.5, 2), (0.05, 1.0, 3)])
def test_one_poisson_step_matches_the_hockey_stick_divergence_of_the_mixture(q, z, k):
    got = person_epsilon(ledger_of(poisson(q, z), 1), 0, k, DELTA)
    want = epsilon_for(lambda eps: hockey_stick(q, z, k, eps), DELTA)
    assert got.method == EXACT
    assert want * (1 - 1e-6) <= got.epsilon <= want * (1 + TOLERANCE)


# --------------------------------------------------------------------------- Poisson, composed


def mixture_pld(q: float, z: float, k: int, interval: float, pessimistic: bool) -> pld.PrivacyLossDistribution:
    """The mixture's privacy-loss distribution from its densities: the grid's cells carry their
    exact masses; the loss, monotone in x, is taken at the cell's worse (``pessimistic``) or
    better end and rounded that way; mass beyond the grid is lost at infinity (pessimistic)
    or dropped."""
    edges = np.linspace(-12 * z, k + 12 * z, 400_001)
    loss = log_mixture(edges, q, z, k) - stats.norm.logpdf(edges, 0, z)  # increasing in x
    j = np.arange(k + 1)[:, None]
    mixture_cdf = (stats.binom.pmf(j, k, q) * stats.norm.cdf(edges[None, :], j, z)).sum(axis=0)
    null_cdf = stats.norm.cdf(edges, 0, z)

    def pmf(cdf, cell_loss):
        mass = np.diff(cdf)
        index = np.ceil(cell_loss / interval) if pessimistic else np.floor(cell_loss / interval)
        keys, where = np.unique(index.astype(np.int64), return_inverse=True)
        sums = np.bincount(where, weights=mass)
        tails = cdf[0] + (1.0 - cdf[-1])
        return {int(key): float(s) for key, s in zip(keys, sums) if s > 0}, (tails if pessimistic else 0.0)

    # remove: x ~ mixture, loss log(P/Q) increasing; add: x ~ N(0, z^2), loss log(Q/P) decreasing
    remove, inf_remove = pmf(mixture_cdf, loss[1:] if pessimistic else loss[:-1])
    add, inf_add = pmf(null_cdf, -loss[:-1] if pessimistic else -loss[1:])
    return pld.PrivacyLossDistribution.create_from_rounded_probability(
        remove, inf_remove, interval, pessimistic_estimate=pessimistic,
        rounded_probability_mass_function_add=add, infinity_mass_add=inf_add, symmetric=False,
    )


def true_epsilon_bounds(q: float, z: float, k: int, steps: int, delta: float) -> tuple[float, float]:
    """(lower, upper) bounds on the epsilon of ``steps`` k-record Poisson steps."""
    lower = mixture_pld(q, z, k, 1e-4, pessimistic=False).self_compose(steps).get_epsilon_for_delta(delta)
    upper = mixture_pld(q, z, k, 1e-4, pessimistic=True).self_compose(steps).get_epsilon_for_delta(delta)
    return lower, upper


@pytest.mark.parametrize("q, z, k, steps", [(0.1, 1.5, 2, 20), (0.05, 2.0, 3, 30)])
def test_composed_poisson_steps_match_the_mixture_built_from_its_densities(q, z, k, steps):
    ledger = ledger_of(poisson(q, z), steps)
    got = person_epsilon(ledger, 0, k, DELTA)
    lower, upper = true_epsilon_bounds(q, z, k, steps, DELTA)
    assert got.method == EXACT
    assert lower * (1 - 1e-6) <= got.epsilon <= upper * (1 + TOLERANCE)
    old = ledger.epsilon_of(group_bound_releases(ledger.releases(0), k), DELTA)
    assert ledger.epsilon(0, DELTA) < got.epsilon < old  # a person costs more than a record, less than the bound said


def test_one_record_per_person_is_the_record_level_epsilon():
    ledger = ledger_of(poisson(0.05, 1.2), 100, accountant="pld")
    assert person_epsilon(ledger, 0, 1, DELTA).epsilon == pytest.approx(ledger.epsilon(0, DELTA), rel=TOLERANCE)


# --------------------------------------------------------------------------- the group bound, where PLD cannot go


def test_a_zcdp_release_falls_back_to_the_group_bound():
    q, z, k, eps_sel = 0.05, 1.2, 2, 0.3
    ledger = ledger_of(poisson(q, z), 10)
    ledger.record_report_noisy_max(0, eps_sel)
    got = person_epsilon(ledger, 0, k, DELTA)
    accountant = rdp_privacy_accountant.RdpAccountant(list(DEFAULT_ORDERS))
    accountant.compose(poisson(1 - (1 - q) ** k, z / k), 10)
    accountant.compose(dp_event.ZCDpEvent((k * eps_sel) ** 2 / 8))
    assert got.method == GROUP_BOUND
    assert got.epsilon == pytest.approx(accountant.get_epsilon(DELTA), rel=1e-9)


def rdp_of(event: dp_event.DpEvent, orders: list[float]) -> np.ndarray:
    accountant = rdp_privacy_accountant.RdpAccountant(orders)
    accountant.compose(event)
    return np.asarray(accountant._rdp)


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
def test_the_group_bound_bounds_the_true_k_record_mechanism(q, z, k):
    orders = [2.0, 3.0, 4.0, 6.0, 8.0]
    bound = rdp_of(group_bound_event(poisson(q, z), k), orders)
    single = rdp_of(poisson(q, z), orders)
    for alpha, b, s in zip(orders, bound, single):
        forward, backward = true_group_rdp(q, z, k, int(alpha))
        assert max(forward, backward) <= b * (1 + 1e-6), (alpha, forward, backward, b)
        assert b > s  # a person costs more than a record


# --------------------------------------------------------------------------- in a run


def test_person_level_epsilon_in_a_run(tmp_path, monkeypatch):
    import fedveil.runtime.simulation as simulation

    monkeypatch.setattr(simulation, "write_report", lambda path: [])
    k, rounds, steps = 2, 3, 4
    raw = {
        "data": {"name": "digits", "num_clients": 3}, "model": {"name": "linear"},
        "client": {"batch_size": 32, "lr": 0.1, "steps": steps}, "federation": {"rounds": rounds, "clients_per_round": 3},
        "privacy": {"level": "example", "epsilon": 2.0, "delta": DELTA, "records_per_person": k},
    }
    sim = Simulation.from_config(validate(raw))
    summary = sim.run(tmp_path / "run")
    assert summary["records_per_person"] == k
    assert summary["person_epsilon_method"] == EXACT
    for cid in range(3):
        z, q = summary["noise_multiplier_per_client"][cid], 32 / sim.data.clients[cid].num_train
        lower, upper = true_epsilon_bounds(q, z, k, rounds * steps, DELTA)
        assert lower * (1 - 1e-6) <= summary["person_epsilon_per_client"][cid] <= upper * (1 + TOLERANCE)
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
