"""Empirical privacy audit (canary membership-inference game): Clopper-Pearson bound,
soundness against the accountant, and detection of a broken (noise-free) mechanism."""
from __future__ import annotations

import math

import pytest
from scipy import stats

from fedveil.privacy import epsilon
from fedveil.privacy.audit import (
    AuditResult,
    audit_dp_sgd,
    audit_linear_dp_sgd,
    clopper_pearson,
    epsilon_lower_bound,
)

DELTA = 1e-5


def _cp_upper(k: int, n: int, confidence: float = 0.95) -> float:
    # two-sided Clopper-Pearson upper limit, computed independently of the module
    return 1.0 if k == n else stats.beta.ppf(1 - (1 - confidence) / 2, k + 1, n - k)


def test_perfect_separation_matches_hand_computed_bound():
    scores_in = [1.0 + i for i in range(50)]
    scores_out = [-1.0 - i for i in range(50)]
    res = epsilon_lower_bound(scores_in, scores_out, DELTA, 0.95)
    up = _cp_upper(0, 50)  # = 1 - 0.025 ** (1 / 50)
    assert up == pytest.approx(1 - 0.025 ** (1 / 50))
    expected = math.log((1 - DELTA - up) / up)
    assert res.epsilon_lower_bound == pytest.approx(expected, rel=1e-12)
    assert res.fpr == 0.0 and res.fnr == 0.0
    assert res.threshold == 1.0 and res.trials == 100 and res.confidence == 0.95


def test_partial_overlap_matches_hand_computed_bound():
    # 40 in-scores above every out-score, 10 in-scores and 5 out-scores tied in the middle
    scores_in = [10.0] * 40 + [0.0] * 10
    scores_out = [0.0] * 5 + [-10.0] * 45
    res = epsilon_lower_bound(scores_in, scores_out, DELTA, 0.95)
    candidates = []
    # threshold 10: FP=0, FN=10; threshold 0: FP=5, FN=0; threshold -10: FP=50, FN=0
    for fp, fn in [(0, 10), (5, 0), (50, 0), (0, 50)]:
        fpr_up, fnr_up = _cp_upper(fp, 50), _cp_upper(fn, 50)
        for a, b in [(fnr_up, fpr_up), (fpr_up, fnr_up)]:
            if 1 - DELTA - a > 0:
                candidates.append(math.log((1 - DELTA - a) / b))
    assert res.epsilon_lower_bound == pytest.approx(max(candidates), rel=1e-12)
    assert res.epsilon_lower_bound > 0


def test_indistinguishable_scores_give_zero():
    scores = [0.1 * i for i in range(30)]
    assert epsilon_lower_bound(scores, scores, DELTA).epsilon_lower_bound == 0.0


def test_split_selection_and_input_checks():
    res = epsilon_lower_bound([1.0] * 40, [0.0] * 40, DELTA, select="split")
    up = _cp_upper(0, 20)
    assert res.epsilon_lower_bound == pytest.approx(math.log((1 - DELTA - up) / up))
    assert res.trials == 80  # all models trained; the bound uses the held-out half
    with pytest.raises(ValueError):
        epsilon_lower_bound([], [0.0], DELTA)
    with pytest.raises(ValueError):
        epsilon_lower_bound([1.0], [0.0], DELTA, select="bogus")
    with pytest.raises(ValueError):
        audit_dp_sgd(lambda include, seed: 0.0, 3, DELTA)
    assert clopper_pearson(0, 10, 0.95)[0] == 0.0 and clopper_pearson(10, 10, 0.95)[1] == 1.0


def test_audit_dp_sgd_alternates_in_and_out():
    calls = []

    def train_fn(include: bool, seed: int) -> float:
        calls.append((include, seed))
        return 1.0 if include else 0.0

    res = audit_dp_sgd(train_fn, 20, DELTA, accounted_epsilon=0.5, seed=7)
    assert calls == [(i % 2 == 0, 7 + i) for i in range(20)]
    assert isinstance(res, AuditResult) and res.violated
    up = _cp_upper(0, 10)
    assert res.epsilon_lower_bound == pytest.approx(math.log((1 - DELTA - up) / up))


def test_noised_dp_sgd_lower_bound_below_accounted_epsilon():
    res = audit_linear_dp_sgd(1.0, 1, delta=DELTA, trials=100, seed=0)
    assert res.accounted_epsilon == pytest.approx(epsilon(1.0, 1.0, 1, DELTA, sampling="full"))
    assert 0.0 <= res.epsilon_lower_bound <= res.accounted_epsilon
    assert not res.violated


def test_noise_free_mechanism_claiming_z5_is_caught():
    res = audit_linear_dp_sgd(0.0, 1, delta=DELTA, trials=40, claimed_noise_multiplier=5.0, seed=0)
    claimed = epsilon(5.0, 1.0, 1, DELTA, sampling="full")
    assert res.accounted_epsilon == pytest.approx(claimed)
    assert res.fpr == 0.0 and res.fnr == 0.0  # the canary is perfectly detectable
    assert res.epsilon_lower_bound > claimed
    assert res.violated
