"""``calibrate`` over an event factory, against dp-accounting's own ``calibrate_dp_mechanism``;
the frozen ``Sampling`` and ``Accountant`` values refuse what cannot be accounted."""

import dataclasses

import pytest
from dp_accounting import dp_event
from dp_accounting.mechanism_calibration import ExplicitBracketInterval, calibrate_dp_mechanism
from dp_accounting.rdp import rdp_privacy_accountant

from fedveil.privacy import (
    DEFAULT_ORDERS,
    Accountant,
    Sampling,
    calibrate,
    calibrate_noise,
    epsilon,
    gaussian_steps_release,
)


def poisson_gaussian_steps(q: float, steps: int):
    return lambda z: dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), steps)


def test_calibrate_an_event_factory_as_dp_accounting_does():
    q, steps, target, delta = 0.01, 1000, 1.0, 1e-5
    make_event = poisson_gaussian_steps(q, steps)
    theirs = calibrate_dp_mechanism(
        lambda: rdp_privacy_accountant.RdpAccountant(list(DEFAULT_ORDERS)), make_event, target, delta,
        ExplicitBracketInterval(0.1, 100.0), tol=1e-9,
    )
    ours = calibrate(make_event, target, delta, rtol=1e-7)
    assert theirs * (1 - 1e-7) <= ours <= theirs * (1 + 2e-7)  # the smallest z that meets the target, both
    assert epsilon(ours, q, steps, delta) <= target < epsilon(ours * (1 - 1e-6), q, steps, delta)


def test_calibrate_noise_is_calibrate_over_the_gaussian_steps():
    q, steps, delta = 0.1, 20, 1e-5
    for sampling, accountant in [("poisson", "rdp"), (Sampling("shuffle", 50), Accountant("pld"))]:
        via_factory = calibrate(lambda z: [gaussian_steps_release(z, q, steps, sampling)], 2.0, delta, accountant)
        assert via_factory == calibrate_noise(2.0, delta, q, steps, sampling, accountant)


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: Sampling("bootstrap"), "sampling must be one of"),
        (lambda: Sampling("fixed"), "needs population_size"),
        (lambda: Sampling("shuffle", 0), "population_size must be an integer >= 1"),
        (lambda: Sampling("shuffle", 10, drop_last="no"), "drop_last must be True or False"),
        (lambda: Accountant("moments"), "accountant must be one of"),
        (lambda: Accountant("rdp", orders=[0.5, 2.0]), "orders must be"),
        (lambda: Accountant("pld", value_discretization_interval=0.0), "value_discretization_interval must be"),
        (lambda: Accountant("pld", value_discretization_interval=0.5), "too coarse"),
        (lambda: epsilon(1.0, 0.1, 10, 1e-5, "shuffle"), "needs population_size"),
        (lambda: epsilon(1.0, 0.1, 10, 1e-5, accountant="moments"), "accountant must be one of"),
    ],
)
def test_bad_sampling_or_accountant_is_refused_in_one_line(make, match):
    with pytest.raises(ValueError, match=match) as err:
        make()
    assert "\n" not in str(err.value)


def test_sampling_and_accountant_are_frozen_values():
    assert Sampling("poisson") == Sampling() and Accountant("rdp") == Accountant()
    assert Accountant("rdp", [2, 3]).orders == (2.0, 3.0) and Accountant(orders=None).orders == DEFAULT_ORDERS
    with pytest.raises(dataclasses.FrozenInstanceError):
        Sampling("shuffle", 10).drop_last = False
