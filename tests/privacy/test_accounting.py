"""Accounting on top of dp_accounting: closed forms, opacus cross-checks, spec 002 section 1.3 targets."""

import importlib.util
import json
import math
import os
import warnings

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant

from fedveil.privacy import (
    DEFAULT_ORDERS,
    MRMTL_ORDERS,
    Accountant,
    PrivacyLedger,
    Release,
    Sampling,
    calibrate_noise,
    epsilon,
    epsilon_from_rho,
    gaussian_std,
    gaussian_steps_release,
    report_noisy_max_release,
    sampling_relation,
)
from fedveil.privacy import events


def rdp_to_eps(orders, rdp, delta):
    """Independent numpy version of the RDP -> DP conversion (spec 002 eq. 1.4)."""
    a = np.asarray(orders, dtype=float)
    r = np.asarray(rdp, dtype=float)
    keep = a > 1.01
    eps = r[keep] + np.log1p(-1.0 / a[keep]) - np.log(delta * a[keep]) / (a[keep] - 1.0)
    return max(0.0, float(eps.min()))


def _opacus_rdp_module():
    """opacus.accountants.analysis.rdp (numpy/scipy only), loaded without importing torch."""
    spec = importlib.util.find_spec("opacus")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("opacus is not installed (test-only cross-check)")
    path = os.path.join(spec.submodule_search_locations[0], "accountants", "analysis", "rdp.py")
    module_spec = importlib.util.spec_from_file_location("_opacus_rdp_standalone", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def opacus_rdp():
    return _opacus_rdp_module()


def opacus_eps(opacus_rdp, z, q, steps, delta, orders, extra_rdp=0.0):
    compute_rdp, get_privacy_spent = opacus_rdp.compute_rdp, opacus_rdp.get_privacy_spent
    rdp = np.asarray(compute_rdp(q=q, noise_multiplier=z, steps=steps, orders=list(orders))) + extra_rdp
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eps, _ = get_privacy_spent(orders=list(orders), rdp=rdp, delta=delta)
    return float(eps)


# --------------------------------------------------------------------------- closed forms / cross-checks


@pytest.mark.parametrize("z,steps,delta", [(1.0, 1, 1e-5), (2.5, 50, 1e-5), (9.28, 201, 1e-3), (20.0, 1000, 1e-8)])
def test_full_batch_matches_closed_form(z, steps, delta):
    expected = rdp_to_eps(DEFAULT_ORDERS, steps * np.asarray(DEFAULT_ORDERS) / (2 * z * z), delta)
    for sampling in ("full", "poisson"):
        got = epsilon(z, 1.0, steps, delta, sampling)
        assert got == pytest.approx(expected, rel=1e-9)
    # Full-batch Gaussian is steps/(2 z^2)-zCDP; the RDP conversion is never worse than Lemma 4.
    assert got <= epsilon_from_rho(steps / (2 * z * z), delta) + 1e-12


@pytest.mark.parametrize(
    "z,q,steps,delta",
    [(1.1, 0.01, 1000, 1e-5), (0.8, 0.004, 10000, 1e-6), (50.9, 64 / 872, 5213, 1e-7), (3.0, 0.16, 1206, 1e-3)],
)
def test_poisson_matches_opacus(opacus_rdp, z, q, steps, delta):
    # Integer orders: both libraries evaluate the same exact binomial sum.
    orders = [float(a) for a in range(2, 257)]
    ours = epsilon(z, q, steps, delta, "poisson", Accountant("rdp", orders))
    assert ours == pytest.approx(opacus_eps(opacus_rdp, z, q, steps, delta, orders), rel=1e-3)
    # Fractional orders: dp-accounting 0.6 sums the absolute values of the series
    # terms (an upper bound) where opacus subtracts the negative ones, so ours is
    # never below opacus' and close to it.
    orders = [a for a in DEFAULT_ORDERS if a <= 256]
    ours = epsilon(z, q, steps, delta, "poisson", Accountant("rdp", orders))
    theirs = opacus_eps(opacus_rdp, z, q, steps, delta, orders)
    assert theirs * (1 - 1e-9) <= ours <= theirs * 1.01


def test_pld_close_to_rdp_and_not_larger():
    z, q, steps, delta = 1.5, 0.05, 100, 1e-5
    rdp = epsilon(z, q, steps, delta)
    pld = epsilon(z, q, steps, delta, accountant="pld")
    assert pld <= rdp * 1.01
    assert pld >= 0.75 * rdp
    # shuffle (plain Gaussians) is also supported by PLD
    rdp_s = epsilon(4.0, 0.1, 30, delta, Sampling("shuffle", 100))
    pld_s = epsilon(4.0, 0.1, 30, delta, Sampling("shuffle", 100), "pld")
    assert 0.75 * rdp_s <= pld_s <= rdp_s * 1.01


def test_more_orders_never_hurt():
    args = (1.1, 0.01, 1000, 1e-5)
    assert epsilon(*args) <= epsilon(*args, accountant=Accountant("rdp", MRMTL_ORDERS)) + 1e-12
    assert set(MRMTL_ORDERS) <= set(DEFAULT_ORDERS)


# --------------------------------------------------------------------------- sampling schemes


def test_sampling_relations():
    assert sampling_relation("poisson") is NeighboringRelation.ADD_OR_REMOVE_ONE
    assert sampling_relation("full") is NeighboringRelation.ADD_OR_REMOVE_ONE
    assert sampling_relation("fixed") is NeighboringRelation.REPLACE_ONE
    assert sampling_relation("shuffle") is NeighboringRelation.REPLACE_SPECIAL


@pytest.mark.parametrize("steps,drop_last,epochs", [(10, True, 4), (10, False, 3), (9, True, 3), (1, True, 1)])
def test_shuffle_is_one_gaussian_per_epoch(steps, drop_last, epochs):
    # n=100, B=30: 3 steps/epoch when dropping the last partial batch, 4 otherwise.
    z, delta = 3.0, 1e-5
    got = epsilon(z, 0.3, steps, delta, Sampling("shuffle", 100, drop_last))
    expected = rdp_to_eps(DEFAULT_ORDERS, epochs * np.asarray(DEFAULT_ORDERS) / (2 * z * z), delta)
    assert got == pytest.approx(expected, rel=1e-9)
    assert epsilon(z, 0.3, 0, delta, Sampling("shuffle", 100)) == 0.0


FEW_ORDERS = [1.5, 1.75] + [float(a) for a in range(2, 33)]  # sampling w/o replacement costs O(order^2)
FEW = Accountant("rdp", FEW_ORDERS)


def test_fixed_size_is_replace_one_without_replacement():
    z, n, b, steps, delta = 2.0, 200, 20, 50, 1e-5
    got = epsilon(z, b / n, steps, delta, Sampling("fixed", n), FEW)
    acc = rdp_privacy_accountant.RdpAccountant(FEW_ORDERS, NeighboringRelation.REPLACE_ONE)
    acc.compose(dp_event.SampledWithoutReplacementDpEvent(n, b, dp_event.GaussianDpEvent(z / 2)), steps)
    assert got == pytest.approx(acc.get_epsilon(delta), rel=1e-12)
    # B = n: replace-one sensitivity of a clipped sum is 2C, i.e. a full-batch Gaussian with z/2.
    full_replace = epsilon(z, 1.0, steps, delta, Sampling("fixed", n), FEW)
    assert full_replace == pytest.approx(epsilon(z / 2, 1.0, steps, delta, "full", FEW), rel=1e-9)
    # Replace-one epsilon is larger than the add/remove one of Poisson sampling at the same z.
    assert got > epsilon(z, b / n, steps, delta, "poisson", FEW)


def test_sampling_argument_errors():
    with pytest.raises(ValueError, match="population_size"):
        epsilon(2.0, 0.1, 10, 1e-5, "fixed")
    with pytest.raises(ValueError, match="population_size"):
        epsilon(2.0, 0.1, 10, 1e-5, "shuffle")
    with pytest.raises(ValueError, match="whole batch size"):
        epsilon(2.0, 0.0734, 10, 1e-5, Sampling("fixed", 872))
    with pytest.raises(ValueError, match="sample_rate must be 1.0"):
        epsilon(2.0, 0.5, 10, 1e-5, "full")
    with pytest.raises(ValueError, match="PLD.*'rdp'"):
        epsilon(2.0, 0.1, 10, 1e-5, Sampling("fixed", 100), "pld")


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(noise_multiplier=0.0), "noise_multiplier"),
        (dict(noise_multiplier=-1.0), "noise_multiplier"),
        (dict(noise_multiplier=float("inf")), "noise_multiplier"),
        (dict(sample_rate=0.0), "sample_rate"),
        (dict(sample_rate=1.5), "sample_rate"),
        (dict(steps=-1), "steps"),
        (dict(steps=2.5), "steps"),
        (dict(delta=0.0), "delta"),
        (dict(delta=1.0), "delta"),
        (dict(sampling="bootstrap"), "sampling"),
        (dict(accountant="moments"), "accountant"),
    ],
)
def test_invalid_inputs(kwargs, match):
    args = dict(noise_multiplier=1.0, sample_rate=0.01, steps=100, delta=1e-5)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        epsilon(**args)


# --------------------------------------------------------------------------- calibration


def test_calibrate_meets_target_tightly():
    target, delta, q, steps = 1.0, 1e-5, 0.01, 1000
    z = calibrate_noise(target, delta, q, steps)
    assert epsilon(z, q, steps, delta) <= target
    assert epsilon(z * 0.99, q, steps, delta) > target
    assert epsilon(z * (1 - 2e-4), q, steps, delta) > target  # rtol = 1e-4


def test_calibrate_other_samplings_and_pld():
    shuffle, fixed = Sampling("shuffle", 100), Sampling("fixed", 100)
    z = calibrate_noise(2.0, 1e-5, 0.1, 40, shuffle)
    assert epsilon(z, 0.1, 40, 1e-5, shuffle) <= 2.0
    assert epsilon(z * 0.99, 0.1, 40, 1e-5, shuffle) > 2.0
    z = calibrate_noise(2.0, 1e-5, 0.1, 20, fixed, FEW, rtol=1e-3)
    assert epsilon(z, 0.1, 20, 1e-5, fixed, FEW) <= 2.0
    assert epsilon(z * 0.99, 0.1, 20, 1e-5, fixed, FEW) > 2.0
    pld = Accountant("pld", value_discretization_interval=1e-3)
    z = calibrate_noise(2.0, 1e-5, 1.0, 4, "full", pld, rtol=1e-3)
    assert epsilon(z, 1.0, 4, 1e-5, "full", pld) <= 2.0
    assert epsilon(z * 0.99, 1.0, 4, 1e-5, "full", pld) > 2.0


# Spec 002 section 1.3 reference noise multipliers (RDP, spec orders), as
# (target eps, delta, batch B, population n_k, steps T, z).  T = floor(n_k/B_k) * (R + 1).
REFERENCE = [
    pytest.param(0.5, 1e-7, 64, 872, 5213, 50.90, id="vehicle-872-eps0.5"),
    pytest.param(1.0, 1e-7, 64, 872, 5213, 26.41, id="vehicle-872-eps1"),
    pytest.param(0.5, 1e-7, 64, 1933, 12030, 34.89, id="vehicle-1933-eps0.5"),
    pytest.param(1.0, 1e-7, 64, 1933, 12030, 18.11, id="vehicle-1933-eps1"),
    pytest.param(6.0, 1e-3, 17, 17, 201, 9.28, id="school-17"),
    pytest.param(6.0, 1e-3, 32, 200, 1206, 3.72, id="school-200"),
]


@pytest.mark.parametrize("target,delta,batch,n,steps,z_ref", REFERENCE)
def test_reference_noise_multipliers(target, delta, batch, n, steps, z_ref):
    assert (n // batch) * (200 + 1 if delta == 1e-3 else 400 + 1) == steps
    z = calibrate_noise(target, delta, batch / n, steps)
    assert z == pytest.approx(z_ref, rel=5e-3)  # default (finer) orders: at most 0.5% lower


@pytest.mark.parametrize("target,delta,batch,n,steps,z_ref", [REFERENCE[1], REFERENCE[4], REFERENCE[5]])
def test_reference_noise_multipliers_with_spec_orders(target, delta, batch, n, steps, z_ref):
    z = calibrate_noise(target, delta, batch / n, steps, accountant=Accountant("rdp", MRMTL_ORDERS))
    assert z == pytest.approx(z_ref, rel=1e-3)


def test_calibrate_with_selection_cost_and_errors():
    delta, q, steps = 1e-5, 0.01, 1000
    rnm = report_noisy_max_release(0.03, count=20)
    z_plain = calibrate_noise(1.0, delta, q, steps)
    z = calibrate_noise(1.0, delta, q, steps, extra_events=rnm)
    assert z > z_plain
    ledger = PrivacyLedger()
    ledger.record_gaussian_steps("silo", z, q, steps)
    ledger.record("silo", rnm)
    assert ledger.epsilon("silo", delta) <= 1.0
    with pytest.raises(ValueError, match="unreachable"):
        calibrate_noise(1.0, delta, q, steps, extra_events=report_noisy_max_release(3.0))
    with pytest.raises(ValueError, match="too loose"):
        calibrate_noise(1e3, delta, q, steps, min_noise_multiplier=1.0)
    with pytest.raises(ValueError, match="steps"):
        calibrate_noise(1.0, delta, q, 0)
    with pytest.raises(ValueError, match="target_epsilon"):
        calibrate_noise(0.0, delta, q, steps)
    with pytest.raises(ValueError, match="PLD"):
        calibrate_noise(1.0, delta, q, steps, accountant="pld", extra_events=rnm)


# --------------------------------------------------------------------------- ledger


def test_ledger_composition_equals_total_steps_and_isolation():
    z, q, delta = 1.2, 0.02, 1e-5
    ledger = PrivacyLedger()
    for _ in range(10):
        ledger.record_gaussian_steps(0, z, q, 50)
        ledger.record_gaussian_steps(1, 2 * z, q, 50)
    assert ledger.epsilon(0, delta) == pytest.approx(epsilon(z, q, 500, delta), rel=1e-12)
    assert ledger.epsilon(1, delta) == pytest.approx(epsilon(2 * z, q, 500, delta), rel=1e-12)
    before = ledger.epsilon(0, delta)
    ledger.record_gaussian_steps(1, z, q, 1000)
    assert ledger.epsilon(0, delta) == before
    assert ledger.epsilon("never-seen", delta) == 0.0
    assert set(ledger.epsilons(delta)) == {0, 1}
    assert ledger.subjects == [0, 1]
    assert len(ledger) == 21


def test_ledger_converts_each_distinct_rdp_curve_once(monkeypatch):
    from fedveil.privacy import ledger as ledger_module

    calls = []
    real = ledger_module.rdp_to_epsilon
    monkeypatch.setattr(ledger_module, "rdp_to_epsilon", lambda *a: calls.append(1) or real(*a))
    z, q, delta = 1.1, 0.05, 1e-5
    ledger = PrivacyLedger()
    for client in range(50):  # a cohort of clients with the same history
        ledger.record_gaussian_steps(client, z, q, 20)
    ledger.record_gaussian_steps(50, 2 * z, q, 20)
    spent = ledger.epsilons(delta)
    assert len(calls) == 2  # one conversion per distinct curve
    assert all(spent[c] == pytest.approx(epsilon(z, q, 20, delta), rel=1e-12) for c in range(50))
    assert spent[50] == pytest.approx(epsilon(2 * z, q, 20, delta), rel=1e-12)
    ledger.record_gaussian_steps(3, z, q, 20)  # one client moves on: its new curve is converted afresh
    assert ledger.epsilon(3, delta) == pytest.approx(epsilon(z, q, 40, delta), rel=1e-12) and len(calls) == 3
    assert ledger.epsilon(4, 1e-6) == pytest.approx(epsilon(z, q, 20, 1e-6), rel=1e-12) and len(calls) == 4


def test_ledger_report_noisy_max_cost(opacus_rdp):
    z, q, steps, delta, eps_sel, k = 1.2, 0.02, 500, 1e-5, 0.05, 7
    ledger = PrivacyLedger()
    ledger.record_gaussian_steps("silo-a", z, q, steps)
    base = ledger.epsilon("silo-a", delta)
    ledger.record_report_noisy_max("silo-a", eps_sel, count=k)
    orders = np.asarray(DEFAULT_ORDERS)
    sgm_rdp = np.asarray(opacus_rdp.compute_rdp(q=q, noise_multiplier=z, steps=steps, orders=list(orders)))
    expected = rdp_to_eps(orders, sgm_rdp + k * orders * eps_sel**2 / 8, delta)
    assert ledger.epsilon("silo-a", delta) > base
    assert ledger.epsilon("silo-a", delta) == pytest.approx(expected, rel=1e-3)
    with pytest.raises(ValueError, match="epsilon_sel"):
        ledger.record_report_noisy_max("silo-a", 0.0)


def test_ledger_would_exceed_and_epsilon_with():
    z, q, delta = 1.0, 0.01, 1e-5
    ledger = PrivacyLedger()
    ledger.record_gaussian_steps("population", z, q, 100)
    now = ledger.epsilon("population", delta)
    step = gaussian_steps_release(z, q, 1)
    assert not ledger.would_exceed("population", [], now + 1e-9, delta)
    assert ledger.would_exceed("population", step, now + 1e-9, delta)
    assert not ledger.would_exceed("population", step, now + 1.0, delta)
    hypothetical = ledger.epsilon_with("population", [step, step], delta)
    ledger.record("population", step, count=2)
    assert ledger.epsilon("population", delta) == pytest.approx(hypothetical, rel=1e-12)
    assert ledger.epsilon_with("unknown", step, delta) == pytest.approx(epsilon(z, q, 1, delta))


def test_ledger_relations_are_checked():
    ledger = PrivacyLedger(FEW)
    ledger.record_gaussian_steps(0, 1.0, 0.1, 10)
    with pytest.raises(ValueError, match="neighbouring relation"):
        ledger.record_gaussian_steps(0, 1.0, 0.1, 10, Sampling("fixed", 100))
    assert ledger.relation(0) is NeighboringRelation.ADD_OR_REMOVE_ONE
    assert len(ledger.releases(0)) == 1  # the refused record left no trace
    ledger.record_gaussian_steps(1, 1.0, 0.1, 10, Sampling("fixed", 100))
    assert ledger.relation(1) is NeighboringRelation.REPLACE_ONE
    # Poisson composes with shuffling under zero-out neighbours.
    ledger.record_gaussian_steps(0, 1.0, 0.1, 10, Sampling("shuffle", 100))
    assert ledger.relation(0) is NeighboringRelation.REPLACE_SPECIAL
    expected = rdp_privacy_accountant.RdpAccountant(FEW_ORDERS, NeighboringRelation.REPLACE_SPECIAL)
    expected.compose(dp_event.PoissonSampledDpEvent(0.1, dp_event.GaussianDpEvent(1.0)), 10)
    expected.compose(dp_event.GaussianDpEvent(1.0), 1)
    assert ledger.epsilon(0, 1e-5) == pytest.approx(expected.get_epsilon(1e-5), rel=1e-12)
    with pytest.raises(ValueError, match="subject"):
        ledger.record_gaussian_steps(None, 1.0, 0.1, 10)
    with pytest.raises(ValueError, match="DpEvent"):
        ledger.record(0, "gaussian")


def test_ledger_generic_events_and_pld():
    ledger = PrivacyLedger()
    ledger.record("x", dp_event.LaplaceDpEvent(2.0), count=3)
    assert ledger.epsilon("x", 1e-5) == pytest.approx(1.5, rel=0.01)  # three 0.5-DP Laplace releases
    coarse = Accountant("pld", value_discretization_interval=1e-3)
    pld = PrivacyLedger(coarse)
    assert pld.accountant is coarse and PrivacyLedger("pld").accountant == Accountant("pld")
    pld.record_gaussian_steps("p", 2.0, 0.05, 50)
    pld.record_gaussian_steps("p", 2.0, 0.05, 50)
    direct = epsilon(2.0, 0.05, 100, 1e-5, accountant=coarse)
    assert pld.epsilon("p", 1e-5) == pytest.approx(direct, rel=1e-2)
    with pytest.raises(ValueError, match="PLD"):
        pld.record_report_noisy_max("p", 0.1)
    with pytest.raises(ValueError, match="PLD"):
        pld.record_gaussian_steps("p", 2.0, 0.05, 5, Sampling("fixed", 100))
    assert pld.would_exceed("p", gaussian_steps_release(2.0, 0.05, 50), pld.epsilon("p", 1e-5) + 1e-6, 1e-5)


@pytest.mark.parametrize("kind", ["rdp", "pld"])
def test_ledger_state_round_trip(kind):
    accountant = Accountant(kind, FEW_ORDERS, 1e-3)
    ledger = PrivacyLedger(accountant)
    ledger.record_gaussian_steps(3, 3.0, 0.05, 40)
    ledger.record_gaussian_steps("population", 5.0, 0.1, 20, Sampling("shuffle", 50))
    if kind == "rdp":
        ledger.record_report_noisy_max(3, 0.1, count=2)
        ledger.record_gaussian_steps(7, 2.0, 0.1, 10, Sampling("fixed", 100))
        ledger.record(3, dp_event.ComposedDpEvent([dp_event.GaussianDpEvent(9.0), dp_event.ZCDpEvent(0.001)]))
    state = json.loads(json.dumps(ledger.state_dict()))
    restored = PrivacyLedger.from_state_dict(state)
    assert restored.accountant == accountant and restored.epsilons(1e-5) == ledger.epsilons(1e-5)
    assert restored.relation("population") == ledger.relation("population")
    # Both continue identically.
    for led in (ledger, restored):
        led.record_gaussian_steps(3, 3.0, 0.05, 40)
    assert restored.epsilons(1e-5) == ledger.epsilons(1e-5)
    other = PrivacyLedger(accountant)
    other.load_state_dict(ledger.state_dict())
    assert other.epsilons(1e-6) == ledger.epsilons(1e-6)
    wrong = PrivacyLedger(Accountant("pld" if kind == "rdp" else "rdp", FEW_ORDERS, 1e-3))
    with pytest.raises(ValueError, match="accountant"):
        wrong.load_state_dict(state)
    with pytest.raises(ValueError, match="format"):
        PrivacyLedger.from_state_dict({"records": []})


def test_event_serialisation_round_trip():
    event = dp_event.ComposedDpEvent(
        [
            dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(0.1, dp_event.GaussianDpEvent(1.0)), 5),
            dp_event.ZCDpEvent(rho=0.01),
            dp_event.SampledWithoutReplacementDpEvent(100, 10, dp_event.GaussianDpEvent(0.5)),
        ]
    )
    data = json.loads(json.dumps(events.event_to_dict(event)))
    assert events.event_from_dict(data) == event
    with pytest.raises(ValueError, match="unknown DpEvent"):
        events.event_from_dict({"type": "Nope"})


def test_release_and_gaussian_std():
    assert gaussian_std(1.0, 0.5, 10) == pytest.approx(0.05)
    assert gaussian_std(0.0, 0.5, 10) == 0.0
    with pytest.raises(ValueError, match="cohort_size"):
        gaussian_std(1.0, 0.5, 0)
    with pytest.raises(ValueError, match="clip"):
        gaussian_std(1.0, 0.0, 10)
    with pytest.raises(ValueError, match="DpEvent"):
        Release("not an event")
    with pytest.raises(ValueError, match="count"):
        Release(dp_event.GaussianDpEvent(1.0), -1)
    assert not math.isnan(epsilon(1.0, 0.01, 0, 1e-5))
    assert epsilon(1.0, 0.01, 0, 1e-5) == 0.0
