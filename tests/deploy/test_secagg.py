"""Secure aggregation (issue 35, item 1), the protocol alone: the server's unmasked sum is
the plaintext sum of the survivors' quantised vectors exactly, also when silos drop
between stages; the masked vectors the server sees look nothing like the inputs; the
quantisation error stays within the stated bound; a silo refuses inconsistent requests."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("Crypto")

from fedveil.deploy import secagg_crypto as crypto  # noqa: E402
from fedveil.deploy.secagg import SecAggClient, SecAggError, SecAggServer  # noqa: E402
from fedveil.runtime.secure_sum import (  # noqa: E402
    SecureSumError,
    SecureSumSettings,
    dequantize_sum,
    quantization_bound,
    quantize,
)

THRESHOLD, BITS = 3, 20


def run_round(inputs: dict[int, np.ndarray], drop_after_share=(), drop_after_mask=(), threshold=THRESHOLD):
    """One round through every stage; returns (unmasked sum, survivors, masked vectors seen)."""
    clients = {u: SecAggClient(u, threshold) for u in inputs}
    server = SecAggServer(threshold, round_idx=0)
    share_requests = server.collect_keys({u: c.advertise(0) for u, c in clients.items()})
    inbox = server.route_shares({u: clients[u].share(0, keys) for u, keys in share_requests.items()})
    masked = {u: clients[u].mask(0, inbox[u], inputs[u]) for u in inbox if u not in drop_after_share}
    survivors, dropped = server.unmask_request(masked)
    shares = {u: clients[u].unmask(0, survivors, dropped) for u in survivors if u not in drop_after_mask}
    return server.unmasked_sum(masked, survivors, dropped, shares), survivors, masked


def quantized_inputs(count: int, size: int, seed: int = 0) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {u: rng.integers(0, 1 << BITS, size, dtype=np.uint32) for u in range(count)}


def test_the_unmasked_sum_is_the_plaintext_sum_and_no_masked_vector_is_an_input():
    inputs = quantized_inputs(5, 1000)
    total, survivors, masked = run_round(inputs)
    assert survivors == [0, 1, 2, 3, 4]
    expected = np.sum([inputs[u].astype(np.uint64) for u in survivors], axis=0) % (1 << 32)
    assert np.array_equal(total.astype(np.uint64), expected)
    for u, y in masked.items():  # each masked vector is uniform-looking: unrelated to its input
        assert abs(np.corrcoef(y.astype(np.float64), inputs[u].astype(np.float64))[0, 1]) < 0.1
        assert y.astype(np.float64).mean() > 2**31 * 0.9  # inputs are below 2**20; masked words span 2**32


def test_silos_that_drop_before_masking_are_left_out_and_their_masks_removed():
    inputs = quantized_inputs(5, 300, seed=1)
    total, survivors, _ = run_round(inputs, drop_after_share=(1, 3))
    assert survivors == [0, 2, 4]
    expected = np.sum([inputs[u].astype(np.uint64) for u in survivors], axis=0) % (1 << 32)
    assert np.array_equal(total.astype(np.uint64), expected)


def test_survivors_that_do_not_answer_the_unmask_stage_are_still_summed_if_enough_shares_remain():
    inputs = quantized_inputs(5, 200, seed=2)
    total, survivors, _ = run_round(inputs, drop_after_share=(4,), drop_after_mask=(0,))
    assert survivors == [0, 1, 2, 3]
    expected = np.sum([inputs[u].astype(np.uint64) for u in survivors], axis=0) % (1 << 32)
    assert np.array_equal(total.astype(np.uint64), expected)


def test_below_the_threshold_the_round_stops():
    with pytest.raises(SecAggError, match="fewer than the threshold 3"):
        run_round(quantized_inputs(4, 10), drop_after_share=(0, 1))


def test_a_silo_refuses_to_reveal_both_secrets_of_a_silo_or_to_unmask_twice():
    clients = {u: SecAggClient(u, THRESHOLD) for u in range(4)}
    server = SecAggServer(THRESHOLD, 0)
    requests = server.collect_keys({u: c.advertise(0) for u, c in clients.items()})
    inbox = server.route_shares({u: clients[u].share(0, k) for u, k in requests.items()})
    for u in clients:
        clients[u].mask(0, inbox[u], np.zeros(4, dtype=np.uint32))
    with pytest.raises(SecAggError, match="do not split"):  # silo 1 both alive and dropped
        clients[0].unmask(0, [0, 1, 2], [1, 3])
    with pytest.raises(SecAggError, match="do not split"):  # silo 3 left out of both lists
        clients[0].unmask(0, [0, 1, 2], [])
    clients[0].unmask(0, [0, 1, 2], [3])
    with pytest.raises(SecAggError, match="already answered"):  # a second, different partition
        clients[0].unmask(0, [0, 1, 3], [2])


def test_quantisation_is_unbiased_and_within_its_bound():
    rng = np.random.default_rng(3)
    clip, bits, count = 2.0, 12, 6
    xs = [rng.uniform(-clip, clip, 5000) for _ in range(count)]
    total = np.sum([quantize(x, clip, bits, rng).astype(np.uint64) for x in xs], axis=0)
    error = dequantize_sum(total, count, clip, bits) - np.sum(xs, axis=0)
    bound = quantization_bound(count, clip, bits)
    assert bound == pytest.approx(count * 4.0 / 4095)
    assert np.abs(error).max() < bound
    assert abs(error.mean()) < 5 * bound / np.sqrt(5000)  # unbiased: the mean error shrinks like 1/sqrt(n)
    assert np.array_equal(dequantize_sum(np.sum([quantize(np.full(3, 9.0), clip, bits, rng) for _ in range(2)], axis=0), 2, clip, bits),
                          np.full(3, 2 * clip))  # values beyond the range are clipped to it


def test_shamir_sharing_rebuilds_from_any_threshold_shares_only():
    secret = bytes(range(32))
    shares = crypto.split_secret(secret, 3, 5)
    assert crypto.combine_secret({1: shares[0], 3: shares[2], 5: shares[4]}) == secret
    assert crypto.combine_secret({2: shares[1], 4: shares[3]}) != secret  # two are not enough


def test_settings_refuse_a_sum_that_could_overflow_and_count_the_threshold():
    settings = SecureSumSettings(clip=1.0, bits=30, weight_scale=1.0, threshold_fraction=0.5)
    with pytest.raises(SecureSumError, match="overflow"):
        settings.check(cohort_size=8)
    SecureSumSettings(clip=1.0, bits=29, weight_scale=1.0, threshold_fraction=0.5).check(cohort_size=8)
    assert [settings.threshold(n) for n in (2, 3, 5, 8)] == [2, 2, 3, 4]
    with pytest.raises(SecAggError, match="threshold of 1"):
        SecAggClient(0, 1)
