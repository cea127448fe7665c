"""Noise calibration: the smallest noise multiplier (or schedule scale) that meets a target epsilon.

Epsilon falls monotonically as the noise grows, so each calibration brackets the
root of ``epsilon(z) - target`` and shrinks the bracket; the returned noise always
meets the target (spec 002 section 1.3; spec 000 §1.8 mode (i) for schedules).
:func:`calibrate` does it for any releases made from ``z`` (as dp-accounting's
``calibrate_dp_mechanism`` does for an event factory); the others are its uses.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import checks
from .composition import (
    Accountant,
    as_accountant,
    combined_relation,
    rdp_curve,
    rdp_to_epsilon,
    releases_epsilon,
    schedule_releases,
)
from .events import Release, as_releases, check_sample_rate, event_key, gaussian_steps_release
from .relations import Sampling, as_sampling
from .skellam import SKELLAM_RELATIONS, skellam_event

__all__ = ["calibrate", "calibrate_noise", "calibrate_noise_schedule", "calibrate_skellam", "skellam_releases"]


def _check_noise_range(min_noise_multiplier: Any, max_noise_multiplier: Any) -> tuple[float, float]:
    z_max = checks.positive("max_noise_multiplier", max_noise_multiplier)
    z_min = checks.positive("min_noise_multiplier", min_noise_multiplier)
    if z_min >= z_max:
        raise ValueError("min_noise_multiplier must be smaller than max_noise_multiplier.")
    return z_min, z_max


def calibrate(
    make_releases: Callable[[float], Any],
    target_epsilon: float,
    delta: float,
    accountant: Accountant | str = "rdp",
    *,
    guess: float | None = None,
    rtol: float = 1e-4,
    min_noise_multiplier: float = 1e-3,
    max_noise_multiplier: float = 1e6,
) -> float:
    """Smallest noise multiplier ``z`` whose releases ``make_releases(z)`` (Releases /
    DpEvents, composed by ``accountant``) spend at most ``target_epsilon`` at ``delta``.

    The event-factory form of dp-accounting's ``calibrate_dp_mechanism``; epsilon must
    fall as ``z`` grows. Brackets the root of ``epsilon(z) - target`` (factors of 4 from
    ``z = 1``, or of 1.02 from a close ``guess``) and shrinks the bracket (bisection,
    accelerated by regula falsi in ``log z``) until ``hi - lo <= rtol * hi``; returns the
    upper end, so the target is always met and ``z * (1 - rtol)`` misses it.

    Raises ValueError when the target cannot be met with ``z <= max_noise_multiplier``
    or is met even by ``z = min_noise_multiplier``.
    """
    target = checks.positive("target_epsilon", target_epsilon)
    delta = checks.fraction("delta", delta)
    acc = as_accountant(accountant)
    rtol = checks.positive("rtol", rtol)
    z_min, z_max = _check_noise_range(min_noise_multiplier, max_noise_multiplier)

    def eps_of(z: float) -> float:
        return releases_epsilon(as_releases(make_releases(z)), delta, acc)

    if guess is None:
        return _solve_noise(eps_of, target, delta, z_min, z_max, rtol)
    return _solve_noise(eps_of, target, delta, z_min, z_max, rtol, start=checks.positive("guess", guess), factor=1.02)


def calibrate_noise(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    sampling: Sampling | str = "poisson",
    accountant: Accountant | str = "rdp",
    *,
    extra_events: Any = None,
    rtol: float = 1e-4,
    min_noise_multiplier: float = 1e-3,
    max_noise_multiplier: float = 1e6,
) -> float:
    """:func:`calibrate` for ``steps`` subsampled-Gaussian steps
    (:func:`~fedveil.privacy.composition.epsilon`) plus ``extra_events``.

    ``extra_events`` (Releases / DpEvents, e.g. report-noisy-max selections, spec 002
    section 1.4) are composed with the Gaussian steps, so the noise is recalibrated to
    keep the total at the target; with RDP their curve is summed once. Results without
    ``extra_events`` are cached. Raises ValueError as :func:`calibrate` does, and when
    ``extra_events`` alone exceed the target.
    """
    target = checks.positive("target_epsilon", target_epsilon)
    delta = checks.fraction("delta", delta)
    q = check_sample_rate(sample_rate)
    steps = checks.integer("steps", steps)
    sampling = as_sampling(sampling)
    acc = as_accountant(accountant)
    rtol = checks.positive("rtol", rtol)
    z_min, z_max = _check_noise_range(min_noise_multiplier, max_noise_multiplier)
    extras = as_releases(extra_events)
    args = (target, delta, q, steps, sampling, acc, rtol, z_min, z_max)
    if not extras:
        return _calibrate_cached(*args)
    return _calibrate(*args, extras)


@functools.lru_cache(maxsize=1024)
def _calibrate_cached(*args) -> float:
    return _calibrate(*args, [])


def _calibrate(target, delta, q, steps, sampling, acc, rtol, z_min, z_max, extras):
    if steps == 0:
        raise ValueError("steps must be >= 1 to calibrate a noise multiplier (0 steps release nothing).")
    # Validates the sampling arguments and that the Gaussian steps and `extra_events` share a relation.
    probe = gaussian_steps_release(1.0, q, steps, sampling)
    extra_keys = [event_key(r.event) for r in extras]
    relation = combined_relation(acc.kind, [probe, *extras], [event_key(probe.event), *extra_keys])
    if extras:
        eps_extra = releases_epsilon(extras, delta, acc)
        if eps_extra >= target:
            raise ValueError(
                f"target epsilon {target} is unreachable: the extra releases alone cost epsilon={eps_extra:.6g} "
                f"at delta={delta:g}, before any Gaussian step."
            )
    if not extras or acc.kind != "rdp":
        return calibrate(
            lambda z: [gaussian_steps_release(z, q, steps, sampling), *extras], target, delta, acc,
            rtol=rtol, min_noise_multiplier=z_min, max_noise_multiplier=z_max,
        )
    # RDP with extras: their curve is summed once, not at every trial z.
    extra_vec = np.zeros(len(acc.orders))
    for rel, key in zip(extras, extra_keys):
        if rel.count:
            extra_vec = extra_vec + rel.count * rdp_curve(key, relation, acc.orders)

    def eps_of(z: float) -> float:
        r = gaussian_steps_release(z, q, steps, sampling)
        return rdp_to_epsilon(r.count * rdp_curve(event_key(r.event), relation, acc.orders) + extra_vec, acc.orders, delta)

    return _solve_noise(eps_of, target, delta, z_min, z_max, rtol)


def _solve_noise(
    eps_of, target: float, delta: float, z_min: float, z_max: float, rtol: float,
    start: float = 1.0, factor: float = 4.0,
) -> float:
    """Smallest ``z`` in ``[z_min, z_max]`` (up to ``rtol``) with ``eps_of(z) <= target``.

    Brackets the root of the decreasing ``eps_of(z) - target`` from ``z = start`` by
    steps of ``factor`` (squared after each step when ``factor < 4``, so a close
    initial guess costs few evaluations and a poor one still brackets quickly), then
    :func:`_shrink_bracket`.
    """
    z = min(max(start, z_min), z_max)
    e = eps_of(z)

    def widen(f: float) -> float:
        return f if f >= 4.0 else f * f

    if e <= target:
        hi, e_hi = z, e
        while True:
            if hi <= z_min:
                raise ValueError(
                    f"target epsilon {target} is met even by noise_multiplier={z_min:g}; the target is too loose "
                    "to calibrate against (lower min_noise_multiplier if this is intended)."
                )
            lo = max(hi / factor, z_min)
            e_lo = eps_of(lo)
            if e_lo > target:
                break
            hi, e_hi = lo, e_lo
            factor = widen(factor)
    else:
        lo, e_lo = z, e
        while True:
            if lo >= z_max:
                raise ValueError(
                    f"target epsilon {target} is unreachable: even noise_multiplier={z_max:g} gives epsilon="
                    f"{e_lo:.6g} at delta={delta:g}."
                )
            hi = min(lo * factor, z_max)
            e_hi = eps_of(hi)
            if e_hi <= target:
                break
            lo, e_lo = hi, e_hi
            factor = widen(factor)
    return _shrink_bracket(eps_of, target, lo, e_lo, hi, e_hi, rtol)


def _shrink_bracket(eps_of, target: float, lo: float, e_lo: float, hi: float, e_hi: float, rtol: float) -> float:
    """Shrink ``[lo, hi]`` (eps(lo) > target >= eps(hi)) until ``hi - lo <= rtol * hi``; return ``hi``.

    Bisection accelerated by regula falsi (Illinois variant) in ``log z``: each
    trial point stays strictly inside the bracket and the bracket only ever
    shrinks, so the invariant (and hence the returned ``hi`` meeting the
    target) holds exactly as for plain bisection; every few steps a plain
    bisection step guarantees progress.
    """
    a, b = math.log(lo), math.log(hi)
    fa, fb = e_lo - target, e_hi - target
    tol = -math.log1p(-rtol)  # b - a <= tol  <=>  lo >= hi * (1 - rtol)
    side = 0
    for it in range(200):
        width = b - a
        if width <= tol:
            break
        if it % 4 == 3 or not (fa > 0 >= fb) or fa == fb:
            c = 0.5 * (a + b)
        else:
            c = b - fb * width / (fb - fa)
            c = min(max(c, a + 0.4 * tol), b - 0.4 * tol)
        fc = eps_of(math.exp(c)) - target
        if fc <= 0:
            b, fb = c, fc
            if side == -1:
                fa *= 0.5
            side = -1
        else:
            a, fa = c, fc
            if side == 1:
                fb *= 0.5
            side = 1
    return math.exp(b) if b < math.log(hi) else hi


def calibrate_noise_schedule(
    shape: Sequence[float],
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps_per_entry: int = 1,
    sampling: Sampling | str = "poisson",
    accountant: Accountant | str = "rdp",
    *,
    rtol: float = 1e-4,
    min_noise_multiplier: float = 1e-3,
    max_noise_multiplier: float = 1e6,
) -> np.ndarray:
    """Noise multipliers ``z_t = s * shape_t / min(shape)`` with the smallest scale ``s``
    whose :func:`~fedveil.privacy.composition.schedule_epsilon` is <= ``target_epsilon``.

    The schedule's *shape* (e.g. a chapter-2 dynamic schedule, decaying over rounds)
    is kept and the accountant of the sampling actually used decides its overall
    level, so the budget is spent exactly by the last entry (spec 000 §1.8 mode (i),
    with a tight subsampled-Gaussian accountant in place of the zCDP sum).
    ``min_noise_multiplier`` / ``max_noise_multiplier`` bound the smallest entry ``s``.

    Each distinct value costs one accountant evaluation per trial scale (about 0.2 s
    for RDP, 0.7 s for PLD), so quantise long shapes first
    (:func:`fedveil.privacy.schedules.quantise_shape`). :func:`calibrate` starts from the
    constant schedule of the same total Gaussian cost (``1/z^2`` averaged), which
    is exact for unsampled Gaussians and close for subsampled ones.
    """
    base = checks.positive_vector("shape", shape)
    base = base / base.min()
    target = checks.positive("target_epsilon", target_epsilon)
    delta = checks.fraction("delta", delta)
    q = check_sample_rate(sample_rate)
    steps = checks.integer("steps_per_entry", steps_per_entry, minimum=1)
    sampling = as_sampling(sampling)
    acc = as_accountant(accountant)
    rtol = checks.positive("rtol", rtol)
    z_min, z_max = _check_noise_range(min_noise_multiplier, max_noise_multiplier)
    constant = _calibrate_cached(target, delta, q, base.size * steps, sampling, acc, rtol, z_min, z_max)
    scale = calibrate(
        lambda s: schedule_releases(s * base, q, steps, sampling), target, delta, acc,
        guess=constant * math.sqrt(np.mean(base**-2.0)), rtol=rtol, min_noise_multiplier=z_min,
        max_noise_multiplier=z_max,
    )
    return scale * base


def skellam_releases(noise_multipliers: Sequence[float], l2_sensitivity: float, l1_sensitivity: float) -> list[Release]:
    """One Skellam release per round at variance ``(z_r * l2_sensitivity)^2``
    (:mod:`fedveil.privacy.skellam`; ``z_r`` is std / L2 sensitivity, as for a Gaussian)."""
    return [
        Release(skellam_event((z * l2_sensitivity) ** 2, l2_sensitivity, l1_sensitivity), 1, SKELLAM_RELATIONS)
        for z in noise_multipliers
    ]


def calibrate_skellam(
    shape: Sequence[float], target_epsilon: float, delta: float, l2_sensitivity: float, l1_sensitivity: float,
    *, orders: Sequence[float] | None = None, rtol: float = 1e-4,
) -> np.ndarray:
    """Noise multipliers ``z_r = s * shape_r / min(shape)`` of one Skellam release per round
    with the smallest scale ``s`` whose RDP epsilon is <= ``target_epsilon`` (the distributed
    mechanism, :mod:`fedveil.runtime.distributed_dp`). :func:`calibrate` starts from the Gaussian
    of the same rounds without sampling, which the Skellam bound approaches as the variance grows."""
    base = checks.positive_vector("shape", shape)
    base = base / base.min()
    target = checks.positive("target_epsilon", target_epsilon)
    delta = checks.fraction("delta", delta)
    acc = Accountant("rdp", orders)
    gaussian = _calibrate_cached(target, delta, 1.0, base.size, Sampling("full"), acc, rtol, 1e-3, 1e6)
    scale = calibrate(
        lambda s: skellam_releases(s * base, l2_sensitivity, l1_sensitivity), target, delta, acc,
        guess=gaussian * math.sqrt(np.mean(base**-2.0)), rtol=rtol,
    )
    return scale * base
