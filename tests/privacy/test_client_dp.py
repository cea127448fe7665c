"""Client-level DP-FedAvg (McMahan et al. 2018) and adaptive clipping (Andrew et al. 2021),
against hand-computed values and the draws of a generator with the same seed."""
from __future__ import annotations

import math

import pytest
import torch

from fedveil.privacy.client_dp import ClientLevelDP, clip_update, update_noise_multiplier


def upd(a, b):
    return {"a": torch.tensor(a, dtype=torch.float32), "b": torch.tensor(b, dtype=torch.float32)}


ZERO = upd([0.0, 0.0], [[0.0]])


# ------------------------------------------------------------------------ clip_update


def test_clip_update_scales_to_the_clip_by_global_norm():
    update = upd([3.0, 0.0], [[4.0]])  # global L2 norm sqrt(9 + 16) = 5 over both tensors
    clipped, norm = clip_update(update, 2.5)
    assert norm == pytest.approx(5.0)
    torch.testing.assert_close(clipped["a"], torch.tensor([1.5, 0.0]))
    torch.testing.assert_close(clipped["b"], torch.tensor([[2.0]]))
    after = math.sqrt(sum(float(v.pow(2).sum()) for v in clipped.values()))
    assert after == pytest.approx(2.5, rel=1e-6)


def test_clip_update_leaves_small_updates_unchanged():
    update = upd([1.0, -2.0], [[2.0]])  # norm 3
    clipped, norm = clip_update(update, 10.0)
    assert norm == pytest.approx(3.0)
    for k in update:
        assert torch.equal(clipped[k], update[k])
    # a zero update stays zero (no division by its zero norm)
    clipped, norm = clip_update(ZERO, 1.0)
    assert norm == 0.0 and all(torch.equal(clipped[k], ZERO[k]) for k in ZERO)


# ------------------------------------------------------------- update_noise_multiplier


def test_update_noise_multiplier_matches_andrew_et_al_theorem_1():
    assert update_noise_multiplier(1.0, 1.0) == pytest.approx((1 - 0.25) ** -0.5)
    assert update_noise_multiplier(1.0, 1.0) == pytest.approx(1.1547005, abs=1e-7)
    z, sigma_b = 0.8, 3.0
    assert update_noise_multiplier(z, sigma_b) == pytest.approx((z**-2 - (2 * sigma_b) ** -2) ** -0.5)
    # a large count noise costs (almost) nothing: the update keeps (almost) all of z
    assert update_noise_multiplier(z, 1e6) == pytest.approx(z, rel=1e-9)
    assert update_noise_multiplier(z, sigma_b) > z


@pytest.mark.parametrize("sigma_b", [0.5, 0.25])
def test_update_noise_multiplier_refuses_count_noise_at_most_half_z(sigma_b):
    with pytest.raises(ValueError, match="must exceed z/2"):
        update_noise_multiplier(1.0, sigma_b)


# ------------------------------------------------------------------------- noisy_mean


def test_noise_of_the_mean_has_std_z_clip_over_m():
    z, clip, m = 1.3, 0.7, 4
    dp = ClientLevelDP(noise_multiplier=z, clip=clip, expected_cohort=float(m))
    template = {"w": torch.zeros(20), "b": torch.zeros(5)}
    gen = torch.Generator().manual_seed(1234)
    draws = []
    for _ in range(4000):
        mean, facts = dp.noisy_mean([{k: torch.zeros_like(v) for k, v in template.items()}] * 3, template, gen)
        assert facts == {"clip": clip, "noise_multiplier": z}  # what was released: clip and noise
        draws.append(torch.cat([mean["w"], mean["b"]]))
    draws = torch.stack(draws).double()  # (draws, 25 coordinates)
    want = z * clip / m
    per_coordinate = draws.std(dim=0)
    assert ((per_coordinate / want - 1).abs() < 0.06).all(), per_coordinate / want
    assert draws.std().item() == pytest.approx(want, rel=0.01)
    assert abs(draws.mean().item()) < 3 * want / math.sqrt(draws.numel())
    assert (draws.mean(dim=0).abs() < 5 * want / math.sqrt(len(draws))).all()
    assert dp.clip == clip  # not adaptive: the clip never moves


def test_mean_of_clipped_updates_has_a_fixed_denominator():
    clip, m = 2.5, 5
    dp = ClientLevelDP(noise_multiplier=1e-12, clip=clip, expected_cohort=float(m))
    big = upd([3.0, 0.0], [[4.0]])  # norm 5, clipped to [1.5, 0], [[2]]
    small = upd([1.0, -1.0], [[0.5]])  # norm 1.5, kept
    gen = torch.Generator().manual_seed(0)
    mean, _ = dp.noisy_mean([big, small], ZERO, gen)  # 2 of the expected 5 arrived
    torch.testing.assert_close(mean["a"], torch.tensor([2.5, -1.0]) / 5)
    torch.testing.assert_close(mean["b"], torch.tensor([[2.5]]) / 5)
    # not the mean of the two that arrived
    assert not torch.allclose(mean["a"], torch.tensor([2.5, -1.0]) / 2)
    # nobody arrived: zero signal (plus noise), still divided by m
    empty, _ = dp.noisy_mean([], ZERO, gen)
    assert all(v.abs().max() < 1e-10 for v in empty.values())


def test_noise_is_drawn_from_the_generator_tensor_by_tensor():
    z, clip, m = 0.9, 1.5, 3.0
    dp = ClientLevelDP(noise_multiplier=z, clip=clip, expected_cohort=m)
    update = upd([3.0, 0.0], [[4.0]])  # clipped to 0.3 of itself
    mean, _ = dp.noisy_mean([update], ZERO, torch.Generator().manual_seed(7))
    gen = torch.Generator().manual_seed(7)
    noise = {k: torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in ZERO.items()}
    for k in ZERO:
        torch.testing.assert_close(mean[k], (update[k] * 0.3 + z * clip * noise[k]) / m)


# ------------------------------------------------------------------------ adaptive clip


def adaptive(clip=1.0, z=0.5, m=4.0, quantile=0.5, lr=0.2, count_noise=2.0):
    return ClientLevelDP(
        noise_multiplier=z, clip=clip, expected_cohort=m, adaptive=True, target_quantile=quantile, clip_lr=lr,
        count_noise_std=count_noise,
    )


def test_adaptive_clip_step_reproduces_the_draws():
    """Update noise (z_Delta C, one tensor after the other) first, then the count noise."""
    C, z, m, gamma, eta, sigma_b = 1.0, 0.5, 4.0, 0.5, 0.2, 2.0
    dp = adaptive(C, z, m, gamma, eta, sigma_b)
    updates = [upd([0.3, 0.0], [[0.4]]), upd([3.0, 0.0], [[4.0]]), upd([0.0, 0.6], [[0.0]])]  # norms 0.5, 5, 0.6
    mean, facts = dp.noisy_mean(updates, ZERO, torch.Generator().manual_seed(11))
    z_update = (z**-2 - (2 * sigma_b) ** -2) ** -0.5
    # the two releases: update noise z_update C (sensitivity C), count noise sigma_b on shifted
    # bits (sensitivity 1/2); together one Gaussian with (z_update^-2 + (0.5 / sigma_b)^2)^-1/2 = z
    assert facts["clip"] == C and facts["update_noise_multiplier"] == pytest.approx(z_update, rel=1e-12)
    assert facts["clip_count_noise"] == sigma_b and facts["clip_count_sensitivity"] == 0.5
    assert facts["noise_multiplier"] == pytest.approx(z, rel=1e-12)

    gen = torch.Generator().manual_seed(11)
    noise = {k: torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in ZERO.items()}
    g = float(torch.randn((), generator=gen, dtype=torch.float64))
    unclipped, cohort = 2, 3  # shifted count: sum of (b_i - 1/2) = 2 - 1.5, unshifted after dividing by m
    share = (unclipped - cohort / 2 + sigma_b * g) / m + 0.5
    assert dp.clip == pytest.approx(C * math.exp(-eta * (share - gamma)), rel=1e-12)
    total = {"a": torch.tensor([0.3 + 0.6, 0.6]), "b": torch.tensor([[0.4 + 0.8]])}  # the 5 scaled to 1
    for k in ZERO:
        torch.testing.assert_close(mean[k], (total[k] + z_update * C * noise[k]) / m)


def test_adaptive_clip_rises_when_every_update_is_clipped_and_falls_when_none_is():
    m = 5
    large = [upd([30.0, 0.0], [[40.0]])] * m  # norm 50
    tiny = [upd([0.003, 0.0], [[0.004]])] * m  # norm 0.005
    for updates, moves in ((large, "up"), (tiny, "down")):
        dp = adaptive(clip=1.0, z=0.01, m=float(m), quantile=0.5, lr=0.2, count_noise=0.01)
        gen = torch.Generator().manual_seed(3)
        clips = [dp.clip]
        for _ in range(5):
            dp.noisy_mean(updates, ZERO, gen)
            clips.append(dp.clip)
        steps = [b / a for a, b in zip(clips, clips[1:])]
        if moves == "up":  # share of unclipped ~ 0: C <- C exp(eta * gamma)
            assert all(s == pytest.approx(math.exp(0.2 * 0.5), rel=5e-3) for s in steps), steps
        else:  # share ~ 1: C <- C exp(-eta * (1 - gamma))
            assert all(s == pytest.approx(math.exp(-0.2 * 0.5), rel=5e-3) for s in steps), steps


def test_state_dict_round_trip():
    dp = adaptive(clip=1.0)
    updates = [upd([3.0, 0.0], [[4.0]])] * 4
    dp.noisy_mean(updates, ZERO, torch.Generator().manual_seed(5))
    state = dp.state_dict()
    assert state == {"clip": dp.clip} and dp.clip != 1.0

    other = adaptive(clip=1.0)
    other.load_state_dict(state)
    assert other.clip == dp.clip
    a, _ = dp.noisy_mean(updates, ZERO, torch.Generator().manual_seed(6))
    b, _ = other.noisy_mean(updates, ZERO, torch.Generator().manual_seed(6))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert other.clip == dp.clip
    # a state saved as JSON (clip as an int) loads as a float
    other.load_state_dict({"clip": 2})
    assert other.clip == 2.0 and isinstance(other.clip, float)


@pytest.mark.parametrize("cohort_size", [3, 4])
def test_shifted_clip_count_moves_by_half_when_a_client_joins(cohort_size):
    """Add/remove one client: the released count sum_i (b_i - 1/2) moves by exactly 1/2 (the
    sensitivity the (2 sigma_b)^-2 term assumes), whether the newcomer is clipped or not.
    The count is read back from the clip step: share = gamma - log(C'/C) / eta."""
    C, m, gamma, eta = 1.0, 4.0, 0.5, 0.2
    base = [upd([0.3, 0.0], [[0.4]])] * (cohort_size - 1) + [upd([3.0, 0.0], [[4.0]])]

    def released_count(updates):
        dp = adaptive(C, 0.5, m, gamma, eta, count_noise=2.0)
        dp.noisy_mean(updates, ZERO, torch.Generator().manual_seed(5))  # same draws every time
        share = gamma - math.log(dp.clip / C) / eta
        return (share - 0.5) * m

    with_unclipped = released_count(base + [upd([0.1, 0.0], [[0.0]])])
    with_clipped = released_count(base + [upd([9.0, 0.0], [[0.0]])])
    alone = released_count(base)
    assert with_unclipped - alone == pytest.approx(0.5, abs=1e-9)
    assert with_clipped - alone == pytest.approx(-0.5, abs=1e-9)
