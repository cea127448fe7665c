"""Fixed-size sampling without replacement: the replace-one noise multiplier z/2, from first principles.

The mechanism sums vectors clipped to L2 norm C over a batch (cohort) of exactly b of the n
units and adds N(0, (z C)^2 I). Under replace-one neighbours one clipped vector u leaves and
another v arrives: ||u - v|| <= 2C, attained at v = -u. The Gaussian's privacy depends on
std / sensitivity = z C / (2 C) = z / 2, so the accounted event is
``SampledWithoutReplacementDpEvent(n, b, GaussianDpEvent(z / 2))``.

Independent guards of that halving (the mutant ``z / 2 -> z`` fails every one of them):

* the event built for "fixed" sampling, and the one the ledger records, carry z / 2;
* b = n (every unit every step) is the plain Gaussian mechanism with sensitivity 2C: RDP
  ``alpha (2C)^2 / (2 (zC)^2) = 2 alpha / z^2`` per step, converted to (eps, delta) by hand;
* at order 2 the subsampled RDP is Wang, Balle & Kasiviswanathan (2019) Thm 9 written out:
  ``log(1 + gamma^2 min(4 (e^{eps(2)} - 1), 2 e^{eps(2)}))`` with ``eps(2) = 4 / z^2``;
* client-level DP-FedAvg with fixed cohorts, end to end: the noise the server adds (std
  measured) over the replace-one sensitivity of its clipped sum (measured on neighbouring
  cohorts) is the multiplier the run's ledger records; and a whole run's epsilon is the
  closed form (full cohorts) or dp_accounting's with the halved multiplier built here.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant
from dp_accounting.rdp.rdp_privacy_accountant import NeighborRel

from fedveil.config import PrivacyConfig, validate
from fedveil.privacy import (
    DEFAULT_ORDERS,
    Accountant,
    PrivacyLedger,
    Sampling,
    epsilon,
    gaussian_steps_release,
    sampling_relation,
)
from fedveil.privacy.randomness import NoiseSource
from fedveil.runtime import run
from fedveil.runtime.privacy_plan import PopulationPlan, PrivacyPlan
from fedveil.runtime.run_privacy import RunPrivacy

DELTA = 1e-5
FEW_ORDERS = [1.5, 1.75] + [float(a) for a in range(2, 33)]  # without replacement costs O(order^2) per order


def replace_one_multiplier(z: float, clip: float = 1.0) -> float:
    """std / replace-one sensitivity of a clipped sum: (z C) / (2 C)."""
    return (z * clip) / (2 * clip)


def rdp_to_dp(orders, rdp, delta: float) -> float:
    """Spec 002 eq. (1.4): eps = min_alpha rdp(alpha) + log(1 - 1/alpha) - log(delta alpha) / (alpha - 1)."""
    return min(r + math.log1p(-1 / a) - math.log(delta * a) / (a - 1) for a, r in zip(orders, rdp) if a > 1.01)


# ------------------------------------------------------------------ the event


@pytest.mark.parametrize("z, n, b", [(2.0, 200, 20), (0.8, 10, 3), (5.0, 50, 50)])
def test_fixed_release_is_without_replacement_gaussian_at_half_z(z, n, b):
    release = gaussian_steps_release(z, b / n, 7, Sampling("fixed", n))
    assert release.event == dp_event.SampledWithoutReplacementDpEvent(n, b, dp_event.GaussianDpEvent(replace_one_multiplier(z)))
    assert release.event.event.noise_multiplier == z / 2 != z
    assert release.count == 7 and sampling_relation("fixed") is NeighborRel.REPLACE_ONE
    ledger = PrivacyLedger("rdp")
    ledger.record_gaussian_steps("p", z, b / n, 7, Sampling("fixed", n))
    (recorded,) = ledger.releases("p")
    assert recorded.event.event.noise_multiplier == pytest.approx(replace_one_multiplier(z), rel=1e-15)
    assert ledger.relation("p") is NeighborRel.REPLACE_ONE


# ------------------------------------------------------------------ its epsilon


@pytest.mark.parametrize("z, steps", [(2.0, 10), (4.0, 100), (1.0, 1)])
def test_full_batch_fixed_epsilon_is_the_gaussian_with_sensitivity_2c(z, steps):
    """b = n: every step is the Gaussian mechanism on a sum whose replace-one sensitivity is 2C,
    noise std zC: RDP alpha (2C)^2 / (2 (zC)^2) = 2 alpha / z^2 per step. The mutant (z for
    z/2) accounts alpha / (2 z^2), four times less RDP, and a far smaller epsilon."""
    n = 30
    rdp = [steps * 2 * a / z**2 for a in FEW_ORDERS]
    want = rdp_to_dp(FEW_ORDERS, rdp, DELTA)
    got = epsilon(z, 1.0, steps, DELTA, Sampling("fixed", n), Accountant("rdp", FEW_ORDERS))
    assert got == pytest.approx(want, rel=1e-9)
    mutant = rdp_to_dp(FEW_ORDERS, [steps * a / (2 * z**2) for a in FEW_ORDERS], DELTA)
    assert mutant < 0.75 * want


@pytest.mark.parametrize("z, n, b, steps", [(2.0, 100, 10, 20), (4.0, 60, 15, 50), (1.0, 1000, 8, 5)])
def test_subsampled_fixed_epsilon_at_order_two_is_wbk_theorem_9(z, n, b, steps):
    """Order 2 alone: eps'(2) = log(1 + gamma^2 C(2,2) min(4 (e^{eps(2)} - 1), e^{eps(2)} min(2, (e^{eps(inf)} - 1)^2)))
    with gamma = b / n, eps(2) = 2 / (2 sigma'^2), sigma' = z / 2 and eps(inf) = inf for a
    Gaussian; then eps = T eps'(2) + log(1 - 1/2) - log(2 delta) (eq. 1.4 at alpha = 2)."""
    gamma, sigma = b / n, replace_one_multiplier(z)

    def wbk2(s: float) -> float:
        e2 = 2 / (2 * s * s)
        return math.log1p(gamma**2 * min(4 * math.expm1(e2), 2 * math.exp(e2)))

    want = steps * wbk2(sigma) + math.log(0.5) - math.log(2 * DELTA)
    got = epsilon(z, gamma, steps, DELTA, Sampling("fixed", n), Accountant("rdp", [2.0]))
    assert got == pytest.approx(want, rel=1e-9)
    mutant = steps * wbk2(z) + math.log(0.5) - math.log(2 * DELTA)
    assert abs(got - mutant) > 1e-3 * got


def test_fixed_epsilon_is_dp_accounting_with_the_halved_multiplier_built_here():
    """The ledger composed over several records equals a reference RdpAccountant (replace-one)
    fed with GaussianDpEvent(z / 2) constructed in this test; with z it would be far lower."""
    z, n, b, steps = 1.5, 40, 8, 30
    ledger = PrivacyLedger(Accountant("rdp", FEW_ORDERS))
    for _ in range(3):
        ledger.record_gaussian_steps("p", z, b / n, steps, Sampling("fixed", n))

    def reference(multiplier: float) -> float:
        acc = rdp_privacy_accountant.RdpAccountant(FEW_ORDERS, NeighborRel.REPLACE_ONE)
        acc.compose(dp_event.SampledWithoutReplacementDpEvent(n, b, dp_event.GaussianDpEvent(multiplier)), 3 * steps)
        return acc.get_epsilon(DELTA)

    assert ledger.epsilon("p", DELTA) == pytest.approx(reference(replace_one_multiplier(z)), rel=1e-12)
    assert reference(z) < 0.8 * ledger.epsilon("p", DELTA)


# ------------------------------------------------------------------ end to end: DP-FedAvg with fixed cohorts


def _updates(dim: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [{"w": 3.0 * torch.randn(dim, generator=g, dtype=torch.float64)} for _ in range(4)]  # norms >> C


def test_server_noise_over_replace_one_sensitivity_is_the_recorded_multiplier():
    """Measure both sides of the ratio on the mechanism the run uses, then read the ledger.

    std: the noisy sum minus the clipped sum, over 20000 coordinates (relative s.e. 0.5%);
    sensitivity: two neighbouring cohorts (first update negated) with the same noise seed,
    whose noisy sums differ by exactly the clipped sums' difference, of norm 2C. The
    recorded GaussianDpEvent's multiplier must be std / sensitivity (= z / 2, not z)."""
    z, clip, n, m, dim = 3.0, 0.5, 20, 4, 20_000
    cfg = PrivacyConfig(level="client", noise_multiplier=z, clip=clip, delta=DELTA)
    population = PopulationPlan(z, cohort=m, sample_rate=m / n, sampling="fixed", count_noise_std=m / 20,
                                planned_epsilon=0.0)
    privacy = RunPrivacy.start(PrivacyPlan(cfg, n, np.ones(3), population=population), NoiseSource())
    server = privacy.server
    updates = _updates(dim)
    template = {"w": torch.zeros(dim, dtype=torch.float64)}
    clipped_sum = sum(u["w"] * (clip / u["w"].norm()) for u in updates)

    mean, _ = privacy.private_mean_update(updates, template, torch.Generator().manual_seed(1), 0)
    noise = mean["w"] * m - clipped_sum
    std = float(noise.std())
    assert std == pytest.approx(z * clip, rel=0.03)

    neighbour = [{"w": -updates[0]["w"]}] + updates[1:]
    a, _ = server.noisy_mean(updates, template, torch.Generator().manual_seed(5))
    b, _ = server.noisy_mean(neighbour, template, torch.Generator().manual_seed(5))
    sensitivity = float(((a["w"] - b["w"]) * m).norm())
    assert sensitivity == pytest.approx(2 * clip, rel=1e-9)

    (release,) = privacy.ledger.releases(PrivacyLedger.POPULATION)
    assert release.event == dp_event.SampledWithoutReplacementDpEvent(n, m, release.event.event)
    assert release.event.event.noise_multiplier == pytest.approx(std / sensitivity, rel=0.03)
    assert abs(z / (std / sensitivity) - 1) > 0.5  # the mutant's z is twice the measured ratio


def _client_level_config(cohort: int, z: float, rounds: int):
    return validate({
        "seed": 0, "data": {"name": "digits", "num_clients": 5}, "model": {"name": "linear"},
        "algorithm": {"name": "fedavg"}, "client": {"batch_size": 32, "lr": 0.1},
        "federation": {"rounds": rounds, "clients_per_round": cohort, "sampling": "fixed"},
        "privacy": {"level": "client", "noise_multiplier": z, "delta": DELTA},
    })


def test_run_with_full_fixed_cohorts_reports_the_closed_form_epsilon(tmp_path):
    """All 5 clients every round (b = n): each round is one Gaussian on a sum of sensitivity 2C,
    so the run's epsilon after R rounds is eq. (1.4) over RDP R * 2 alpha / z^2 (default orders)."""
    z, rounds = 3.0, 3
    summary = run(_client_level_config(5, z, rounds), tmp_path / "full", progress=False, plots=False)
    want = rdp_to_dp(DEFAULT_ORDERS, [rounds * 2 * a / z**2 for a in DEFAULT_ORDERS], DELTA)
    assert summary["epsilon"] == pytest.approx(want, rel=1e-9)
    assert summary["epsilon"] > 1.3 * rdp_to_dp(DEFAULT_ORDERS, [rounds * a / (2 * z**2) for a in DEFAULT_ORDERS], DELTA)


def test_run_with_fixed_cohorts_reports_dp_accounting_at_half_z(tmp_path):
    """3 of 5 clients per round: the run's epsilon is that of a reference RdpAccountant fed
    SampledWithoutReplacementDpEvent(5, 3, GaussianDpEvent(z / 2)) once per round."""
    z, rounds = 3.0, 3
    summary = run(_client_level_config(3, z, rounds), tmp_path / "sub", progress=False, plots=False)
    acc = rdp_privacy_accountant.RdpAccountant(list(DEFAULT_ORDERS), NeighborRel.REPLACE_ONE)
    acc.compose(dp_event.SampledWithoutReplacementDpEvent(5, 3, dp_event.GaussianDpEvent(z / 2)), rounds)
    assert summary["epsilon"] == pytest.approx(acc.get_epsilon(DELTA), rel=1e-9)
