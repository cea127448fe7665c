"""Accounting of noise schedules (one noise multiplier per round): closed forms and opacus."""

import importlib.util
import math
import os
import warnings

import numpy as np
import pytest

from fedveil.privacy import Accountant, Sampling, calibrate_noise, calibrate_noise_schedule, epsilon, schedule_epsilon
from fedveil.privacy.schedules import gd_dynamic_sigmas, quantise_shape, round_shape

DELTA = 1e-5
INTEGER_ORDERS = [float(a) for a in range(2, 129)]
INTEGER = Accountant("rdp", INTEGER_ORDERS)


def opacus_schedule_eps(zs, q, steps_per_entry, delta, orders):
    """opacus' own RDP composition of heterogeneous subsampled Gaussians (test-only)."""
    spec = importlib.util.find_spec("opacus")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("opacus is not installed (test-only cross-check)")
    path = os.path.join(spec.submodule_search_locations[0], "accountants", "analysis", "rdp.py")
    module_spec = importlib.util.spec_from_file_location("_opacus_rdp_schedule", path)
    rdp_mod = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(rdp_mod)
    total = sum(np.asarray(rdp_mod.compute_rdp(q=q, noise_multiplier=z, steps=steps_per_entry, orders=orders)) for z in zs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eps, _ = rdp_mod.get_privacy_spent(orders=orders, rdp=total, delta=delta)
    return float(eps)


def test_constant_schedule_is_plain_composition():
    zs = np.full(7, 1.3)
    for sampling in [Sampling("poisson"), Sampling("fixed", 50), Sampling("shuffle", 50)]:
        got = schedule_epsilon(zs, 0.2, DELTA, 3, sampling)
        # shuffle: each entry is a fresh permutation of 50 // 10 = 5 steps per epoch: 1 epoch per entry
        steps = 21 if sampling.scheme != "shuffle" else 35
        assert got == pytest.approx(epsilon(1.3, 0.2, steps, DELTA, sampling), rel=1e-12)


def test_unsampled_gaussians_compose_to_one_gaussian():
    """T Gaussians with multipliers z_t are exactly one Gaussian with z^-2 = sum_t z_t^-2 (RDP is linear in z^-2)."""
    zs = np.array([4.0, 3.0, 2.5, 2.0, 1.7])
    z_eff = float(np.sum(zs**-2.0) ** -0.5)
    assert schedule_epsilon(zs, 1.0, DELTA, 1, "full") == pytest.approx(epsilon(z_eff, 1.0, 1, DELTA, "full"), rel=1e-9)
    pld = schedule_epsilon(zs, 1.0, DELTA, 1, "full", accountant="pld")
    assert pld == pytest.approx(epsilon(z_eff, 1.0, 1, DELTA, "full", accountant="pld"), rel=2e-3)


def test_poisson_schedule_matches_opacus():
    zs = np.array([2.2, 1.9, 1.6, 1.4, 1.2])
    ours = schedule_epsilon(zs, 0.05, DELTA, 40, accountant=INTEGER)
    assert ours == pytest.approx(opacus_schedule_eps(zs, 0.05, 40, DELTA, INTEGER_ORDERS), rel=1e-3)


@pytest.mark.parametrize("target", [1.0, 4.0])
def test_calibrated_schedule_keeps_shape_and_spends_the_budget(target):
    shape = gd_dynamic_sigmas(1.0, 6, 0.7)  # decreasing: the last round is the least noisy
    rtol = 1e-3
    zs = calibrate_noise_schedule(shape, target, DELTA, 0.1, 5, accountant=INTEGER, rtol=rtol)
    np.testing.assert_allclose(zs / zs.min(), shape / shape.min(), rtol=1e-12)
    spent = schedule_epsilon(zs, 0.1, DELTA, 5, accountant=INTEGER)
    assert spent <= target
    # minimal: a little less noise everywhere overspends
    assert schedule_epsilon(zs * (1 - 2 * rtol), 0.1, DELTA, 5, accountant=INTEGER) > target
    assert opacus_schedule_eps(zs, 0.1, 5, DELTA, INTEGER_ORDERS) == pytest.approx(spent, rel=1e-3)


def test_calibrated_constant_schedule_is_calibrate_noise():
    zs = calibrate_noise_schedule(np.ones(4), 2.0, DELTA, 0.1, 25, rtol=1e-4)
    assert np.all(zs == zs[0])
    assert zs[0] == pytest.approx(calibrate_noise(2.0, DELTA, 0.1, 100), rel=2e-4)


def test_calibrated_shuffle_schedule_matches_the_single_gaussian_closed_form():
    """Shuffling is accounted as one Gaussian per epoch, so the calibrated schedule must have
    sum_t epochs_t / z_t^2 = 1 / z1^2 with z1 the single Gaussian meeting the target."""
    shape = np.array([3.0, 2.0, 1.5, 1.0])
    n, batch, steps = 40, 10, 6  # 4 steps per epoch: 6 steps = 2 epochs per round
    zs = calibrate_noise_schedule(shape, 3.0, DELTA, batch / n, steps, Sampling("shuffle", n), rtol=1e-6)
    z1 = calibrate_noise(3.0, DELTA, 1.0, 1, "full", rtol=1e-6)
    assert float(np.sum(2 / zs**2) ** -0.5) == pytest.approx(z1, rel=1e-5)


def test_schedule_arguments_are_checked():
    with pytest.raises(ValueError, match="positive finite"):
        schedule_epsilon([1.0, 0.0], 0.1, DELTA)
    with pytest.raises(ValueError, match="positive finite"):
        calibrate_noise_schedule([], 1.0, DELTA, 0.1)
    with pytest.raises(ValueError, match="steps_per_entry"):
        schedule_epsilon([1.0], 0.1, DELTA, 0)


# ------------------------------------------------------------------ shapes over rounds


def test_round_shapes():
    np.testing.assert_allclose(round_shape("constant", 4), np.ones(4))
    np.testing.assert_allclose(round_shape("uniform", 4), np.ones(4) * round_shape("uniform", 4)[0])
    dyn = round_shape("dynamic", 5, gamma=0.8)
    # corrected Thm 4 (spec 000 §1.4): sigma_t^2 proportional to gamma^{t/2}, so sigma_{t+1}/sigma_t = gamma^{1/4}
    np.testing.assert_allclose(dyn[1:] / dyn[:-1], 0.8**0.25, rtol=1e-12)
    decay = round_shape("exp_decay", 4, k=0.1)
    np.testing.assert_allclose(decay / decay[0], np.exp(-0.1 * np.arange(4)), rtol=1e-12)
    np.testing.assert_allclose(round_shape("predefined", 3, sigmas=[3, 2, 1, 9]), [3, 2, 1])


@pytest.mark.parametrize(
    "name, options, match",
    [
        ("validation", {"k": 0.5}, "cannot be planned"),
        ("dynamic", {"gamma": 0.9, "T": 4}, "the run sets R and T"),
        ("predefined", {"sigmas": [1.0, 2.0]}, "defines 2 rounds, fewer than the run's 3"),
        ("predefined", {"sigmas": [1.0, 0.0, 2.0]}, "zero sigma"),
        ("constant", {"k": 1}, "takes no options"),
        ("dynamic", {}, "gamma: Field required"),
    ],
)
def test_round_shape_refusals(name, options, match):
    with pytest.raises(ValueError, match=match):
        round_shape(name, 3, **options)


def test_quantise_shape_bounds_the_distinct_values_and_the_error():
    shape = np.exp(-0.05 * np.arange(100)) + 0.1
    q = quantise_shape(shape, 8)
    assert len(np.unique(q)) <= 8
    assert q.min() == pytest.approx(shape.min()) and q.max() == pytest.approx(shape.max())
    step = math.log(shape.max() / shape.min()) / 7
    assert np.max(np.abs(np.log(q / shape))) <= step / 2 + 1e-12
    assert np.all(np.diff(q) <= 0)  # order kept
    np.testing.assert_array_equal(quantise_shape(np.full(5, 2.0), 8), np.full(5, 2.0))
