"""The "beyond 2 standard errors" verdict rule, at and either side of its boundary.

Every instance of the rule is checked on standard errors worked out here from first principles
(sample variance with n - 1, s.e. of a mean = sd / sqrt(n), of a difference of independent
means = sqrt(se_a^2 + se_b^2), of a paired difference = sd of the per-seed differences /
sqrt(n)), with differences placed at k standard errors for k just inside 2 (1.9, 1.99), just
outside (2.01, 2.1), far on either side (1, 1.5, 2.5, 3) and exactly at 2 (exact binary
fractions: 1.0 = 2 x 0.5; the rule is strict, so exactly 2 s.e. is not beyond).

A mutant of the factor (1 or 3 instead of 2), of the comparison (>= for >), or of the s.e.
(population sd, sd without the sqrt(n), a sum instead of a quadrature) fails these tests:
the expected verdicts and the boundaries are computed here, not read from the code.
"""
from __future__ import annotations

import math

import pytest

from fedveil.reproduce import verdicts as st
from fedveil_reproductions.dp_schedules import claim_verdict, significance
from fedveil_reproductions.silo_study import (
    SiloStudy,
    SiloTask,
    beats_both_rows,
    gap_text,
    paired_gap,
)

INSIDE = (0.0, 0.5, 1.0, 1.5, 1.9, 1.99, 2.0)  # at most 2 s.e.: within seed noise (2.0 * se is exact: a doubling)
OUTSIDE = (2.01, 2.1, 2.5, 3.0, 4.0)  # beyond 2 s.e.
ACCURACY = SiloTask("toy", "accuracy", lambda *a: {})
# Four paired differences exactly 2 s.e. from zero in floating point: mean 2, sample variance
# (1 + 1 + 1 + 9) / 3 = 4, sd 2, s.e. 2 / sqrt(4) = 1; scaled by 1/64 (exact) for scores.
AT_TWO_SE = [1 / 64, 1 / 64, 1 / 64, 5 / 64]


def sample_sd(values: list[float]) -> float:
    m = sum(values) / len(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def sem(values: list[float]) -> float:
    return sample_sd(values) / math.sqrt(len(values))


def test_standard_errors_by_hand_agree_with_seed_stats():
    a, b = [0.80, 0.82, 0.84], [0.85, 0.87, 0.89]
    # sd = sqrt((0.02^2 + 0 + 0.02^2) / 2) = 0.02; s.e. = 0.02 / sqrt(3); of the difference: 0.02 sqrt(2/3)
    assert sample_sd(a) == pytest.approx(0.02, rel=1e-12)
    diff, se = st.difference(a, b)
    assert diff == pytest.approx(0.05, rel=1e-12)
    assert se == pytest.approx(0.02 * math.sqrt(2 / 3), rel=1e-12) == pytest.approx(math.hypot(sem(a), sem(b)), rel=1e-12)


# ------------------------------------------------------------------ seed_stats


def test_lower_verdict_on_hand_computed_seed_lists_either_side_of_two_se():
    """a = [0.80, 0.82, 0.84] against b with the same spread: s.e. of the difference
    0.02 sqrt(2/3) = 0.016330, so 2 s.e. = 0.032660. b's mean 0.82 + 0.034 (2.08 s.e.) holds;
    0.82 + 0.031 (1.90 s.e.) and 0.82 + 0.0163 (1.0 s.e.) are within noise; 0.82 + 0.05 (3.06 s.e.) holds."""
    a = [0.80, 0.82, 0.84]
    two_se = 2 * 0.02 * math.sqrt(2 / 3)
    assert two_se == pytest.approx(0.0326599, abs=1e-7)
    for shift, verdict in [(0.034, "holds"), (0.05, "holds"), (0.031, "holds, within seed noise (< 2 s.e.)"),
                           (0.0163, "holds, within seed noise (< 2 s.e.)"), (-0.034, "does not hold")]:
        b = [v + shift for v in a]
        assert st.lower_verdict(*st.difference(a, b)) == verdict, shift
    # the population sd (divide by n) would make 2 s.e. = 0.02667 and call +0.031 beyond noise
    population_two_se = 2 * math.sqrt(2 * (0.02**2 * 2 / 3) / 3)
    assert population_two_se < 0.031 < two_se


def test_at_least_verdict_on_hand_computed_seed_lists_either_side_of_two_se():
    """The claimed-higher side lower by 2.08 s.e. does not hold; by 1.90 s.e. it holds within noise."""
    a = [1.0, 2.0, 3.0]  # sd 1, s.e. 1/sqrt(3)
    two_se = 2 * math.sqrt(2 / 3)  # 1.63299
    b_far = [v + 3.4 for v in a]  # the other is higher by 3.4 = 4.16 s.e.
    b_near = [v + 1.7 for v in a]  # 2.08 s.e.
    b_noise = [v + 1.55 for v in a]  # 1.90 s.e.
    assert 1.55 < two_se < 1.7
    # at_least_verdict(diff) with diff = (claimed >=) - (other) = mean(a) - mean(b) = difference(b, a)
    assert st.at_least_verdict(*st.difference(b_far, a)) == "does not hold"
    assert st.at_least_verdict(*st.difference(b_near, a)) == "does not hold"
    assert st.at_least_verdict(*st.difference(b_noise, a)) == "holds within seed noise (lower by < 2 s.e.)"
    assert st.at_least_verdict(*st.difference(a, b_near)) == "holds"


@pytest.mark.parametrize("se", [0.5, 0.0123, 3.0])
def test_seed_stats_verdicts_switch_exactly_past_two_se(se):
    for k in INSIDE:
        if k > 0:
            assert st.lower_verdict(k * se, se) == "holds, within seed noise (< 2 s.e.)", k
        assert st.at_least_verdict(-k * se, se) == ("holds" if k == 0 else "holds within seed noise (lower by < 2 s.e.)"), k
    for k in OUTSIDE:
        assert st.lower_verdict(k * se, se) == "holds", k
        assert st.at_least_verdict(-k * se, se) == "does not hold", k


def test_seed_stats_exactly_two_se_is_not_beyond():
    assert st.lower_verdict(1.0, 0.5) == "holds, within seed noise (< 2 s.e.)"
    assert st.lower_verdict(math.nextafter(1.0, 2.0), 0.5) == "holds"
    assert st.at_least_verdict(-1.0, 0.5) == "holds within seed noise (lower by < 2 s.e.)"
    assert st.at_least_verdict(math.nextafter(-1.0, -2.0), 0.5) == "does not hold"


# ------------------------------------------------------------------ dp_schedules


def test_dp_schedules_significance_either_side_and_at_two_se():
    se = 0.004
    for k in INSIDE:
        assert significance(k * se, se) == "not resolved" == significance(-k * se, se), k
    for k in OUTSIDE:
        assert significance(k * se, se) == "exp lower", k
        assert significance(-k * se, se) == "uni lower", k
    assert significance(1.0, 0.5) == "not resolved" == significance(-1.0, 0.5)
    assert significance(math.nextafter(1.0, 2.0), 0.5) == "exp lower"
    assert significance(math.nextafter(-1.0, -2.0), 0.5) == "uni lower"
    assert significance(5.0, math.nan) == "not resolved"


def _size(n_train: int, gaps: list[float]) -> dict:
    """A sweep entry with the paired excess gap's mean and s.e. worked out here."""
    return {"n_train": n_train, "excess_gap": gaps, "excess_gap_mean": sum(gaps) / len(gaps), "excess_gap_se": sem(gaps)}


def test_claim_verdict_on_hand_computed_paired_gaps_around_two_se():
    """Per-seed gaps [c - 0.03, c, c + 0.03]: sd 0.03, s.e. 0.03 / sqrt(3) = 0.017321, 2 s.e. = 0.034641.
    c = 0.0364 (2.10 s.e.) is a win, c = 0.0329 (1.90 s.e.) is unresolved. The trend is the per-seed
    change of the gap from the smallest to the largest N, judged by the same rule."""
    h, two_se = 0.03, 2 * 0.03 / math.sqrt(3)
    assert two_se == pytest.approx(0.0346410, abs=1e-7)

    def gaps(c, spread=h):
        return [c - spread, c, c + spread]

    win, near = 0.0364, 0.0329
    assert near < two_se < win
    # both sizes beyond 2 s.e. (the larger: gaps [0.0336, 0.0736, 0.1136], 2 s.e. 0.0462); the per-seed
    # change [0.0272, 0.0372, 0.0472]: mean 0.0372, 2 s.e. 0.0115, so it grows
    sweep = [_size(100, gaps(win)), _size(400, [g + 0.0372 + d for g, d in zip(gaps(win), (-0.01, 0.0, 0.01))])]
    v = claim_verdict(sweep)
    assert v["status"] == ["exp lower", "exp lower"] and v["trend"] == "grows" and v["verdict"] == "claim reproduced"
    # the smaller size just inside 2 s.e.: unresolved there, so only partly reproduced
    sweep = [_size(100, gaps(near)), _size(400, [g + 0.0372 + d for g, d in zip(gaps(near), (-0.01, 0.0, 0.01))])]
    v = claim_verdict(sweep)
    assert v["status"] == ["not resolved", "exp lower"] and v["unresolved"] == [100]
    assert v["verdict"] == "claim partly reproduced"
    # the trend itself either side of 2 s.e.: change per seed [m - 0.01, m, m + 0.01], 2 s.e. = 0.011547
    for m, trend in [(0.0121, "grows"), (0.0110, "no resolved change"), (-0.0121, "shrinks")]:
        later = [g + m + d for g, d in zip(gaps(win), (-0.01, 0.0, 0.01))]
        assert claim_verdict([_size(100, gaps(win)), _size(400, later)])["trend"] == trend, m
    # a change of exactly 2 s.e. (four seeds, dyadic values: exact) is not a resolved trend
    first = [0.25, 0.5, 0.75, 0.5]
    v = claim_verdict([_size(100, first), _size(400, [f + d for f, d in zip(first, AT_TWO_SE)])])
    assert (v["trend_change"], v["trend_se"]) == (2 / 64, 1 / 64) and v["trend"] == "no resolved change"
    v = claim_verdict([_size(100, first), _size(400, [f - d for f, d in zip(first, AT_TWO_SE)])])
    assert (v["trend_change"], v["trend_se"]) == (-2 / 64, 1 / 64) and v["trend"] == "no resolved change"


# ------------------------------------------------------------------ silo_study


def test_paired_gap_text_either_side_of_two_se():
    """Diffs [0.03, 0.01, 0.02]: mean 0.02, sd 0.01, s.e. 0.005774, 2 s.e. 0.011547: beyond.
    Diffs [0.03, -0.01, 0.02]: mean 0.013333, sd 0.020817, s.e. 0.012019: within."""
    base = [0.5, 0.6, 0.7]
    clear = [b + d for b, d in zip(base, (0.03, 0.01, 0.02))]
    noisy = [b + d for b, d in zip(base, (0.03, -0.01, 0.02))]
    mean, se = paired_gap(clear, base)
    assert mean == pytest.approx(0.02, rel=1e-9) and se == pytest.approx(0.01 / math.sqrt(3), rel=1e-9)
    assert gap_text("x", (mean, se)).endswith("(beyond 2 s.e.)")
    mean, se = paired_gap(noisy, base)
    assert se == pytest.approx(sem([0.03, -0.01, 0.02]), rel=1e-9) and abs(mean) < 2 * se
    assert gap_text("x", (mean, se)).endswith("(within 2 s.e.)")
    for k in INSIDE:
        for sign in (1, -1):
            assert gap_text("x", (sign * k * 0.01, 0.01)).endswith("(within 2 s.e.)"), (sign, k)
    for k in OUTSIDE:
        for sign in (1, -1):
            assert gap_text("x", (sign * k * 0.01, 0.01)).endswith("(beyond 2 s.e.)"), (sign, k)
    assert gap_text("x", (1.0, 0.5)).endswith("(within 2 s.e.)")
    at = paired_gap([0.5 + d for d in AT_TWO_SE], [0.5] * 4)
    assert at == (2 / 64, 1 / 64)  # exactly 2 s.e.
    assert gap_text("x", at).endswith("(within 2 s.e.)")
    assert gap_text("x", (math.nextafter(-1.0, -2.0), 0.5)).endswith("(beyond 2 s.e.)")


@pytest.mark.parametrize("k_local, k_fedavg, verdict", [
    (2.1, 2.1, "holds"),
    (1.9, 2.1, "holds on the means, within 2 s.e. of local"),
    (2.1, 1.9, "holds on the means, within 2 s.e. of fedavg"),
    (1.5, 1.99, "holds on the means, within 2 s.e. of local and fedavg"),
    (2.5, 2.01, "holds"),
])
def test_beats_both_rows_resolve_each_gap_at_two_se(k_local, k_fedavg, verdict):
    """MR-MTL's per-seed accuracy is each baseline's plus [c - 0.03, c, c + 0.03], c = k s.e.
    with s.e. = 0.03 / sqrt(3): the win is resolved against a baseline iff k > 2."""
    h = 0.03
    se = h / math.sqrt(3)
    mrmtl = [0.80, 0.80, 0.80]
    offsets = (-h, 0.0, h)
    local = [m - (k_local * se + d) for m, d in zip(mrmtl, offsets)]
    fedavg = [m - (k_fedavg * se + d) for m, d in zip(mrmtl, offsets)]
    results = {"local": {"2": local}, "fedavg": {"2": fedavg}, "mr_mtl(lam=1)": {"2": mrmtl}}
    (row,) = beats_both_rows(results, SiloStudy(epsilons=[2.0], lambdas=[1.0]), ACCURACY, "yes")
    assert row.verdict == verdict


def test_beats_both_rows_exactly_two_se_is_not_resolved():
    """Four seeds, MR-MTL minus local = AT_TWO_SE (mean exactly 2 s.e.), minus fedavg = 3x that
    with the same spread shifted (mean 4 s.e.): the win over local is not resolved."""
    mrmtl = [0.75, 0.75, 0.75, 0.75]
    local = [m - d for m, d in zip(mrmtl, AT_TWO_SE)]
    fedavg = [m - d - 2 / 64 for m, d in zip(mrmtl, AT_TWO_SE)]
    assert paired_gap(mrmtl, local) == (2 / 64, 1 / 64) and paired_gap(mrmtl, fedavg) == (4 / 64, 1 / 64)
    results = {"local": {"2": local}, "fedavg": {"2": fedavg}, "mr_mtl(lam=1)": {"2": mrmtl}}
    (row,) = beats_both_rows(results, SiloStudy(epsilons=[2.0], lambdas=[1.0]), ACCURACY, "yes")
    assert row.verdict == "holds on the means, within 2 s.e. of local"
    assert "vs local +0.03125 ± 0.01562 s.e. (within 2 s.e.)" in row.measured
    assert "vs fedavg +0.06250 ± 0.01562 s.e. (beyond 2 s.e.)" in row.measured


@pytest.mark.parametrize("extra, verdict", [(0.0, "holds on the means, within 2 s.e. of fedavg"), (1 / 1024, "holds")])
def test_beats_both_rows_fedavg_gap_at_and_just_past_two_se(extra, verdict):
    """MSE (lower is better): MR-MTL below FedAvg by exactly 2 s.e. (AT_TWO_SE) is unresolved;
    1/1024 more on every seed (mean 2.0625 s.e., same s.e.) is resolved. Local is far off."""
    mse_task = SiloTask("toy", "mse", lambda *a: {})
    mrmtl = [0.25, 0.25, 0.25, 0.25]
    fedavg = [m + d + extra for m, d in zip(mrmtl, AT_TWO_SE)]
    local = [m + 0.5 for m in mrmtl]
    assert paired_gap(mrmtl, fedavg) == (-(2 / 64 + extra), 1 / 64)
    results = {"local": {"2": local}, "fedavg": {"2": fedavg}, "mr_mtl(lam=1)": {"2": mrmtl}}
    (row,) = beats_both_rows(results, SiloStudy(epsilons=[2.0], lambdas=[1.0]), mse_task, "yes")
    assert row.verdict == verdict
