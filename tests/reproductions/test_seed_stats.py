"""Statistics over seeds (mean, sample std, standard error, cells, differences and the
one-sided verdicts) on values worked out by hand."""
from __future__ import annotations

import math

import pytest

from fedveil.reproduce import verdicts as st


def test_mean_std_sem_of_one_two_three():
    assert st.mean([1, 2, 3]) == 2.0
    # sample std: sqrt(((1-2)^2 + 0 + (3-2)^2) / (3 - 1)) = 1
    assert st.std([1, 2, 3]) == pytest.approx(1.0, abs=1e-15)
    assert st.sem([1, 2, 3]) == pytest.approx(1 / math.sqrt(3), abs=1e-15)


def test_std_is_the_sample_not_the_population_std():
    # [1, 2, 3, 4]: squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5; n - 1 = 3
    assert st.std([1, 2, 3, 4]) == pytest.approx(math.sqrt(5 / 3), abs=1e-15)
    assert st.sem([1, 2, 3, 4]) == pytest.approx(math.sqrt(5 / 3) / 2, abs=1e-15)
    # two seeds 0.1 and 0.3: std = 0.2 / sqrt(2), sem = std / sqrt(2) = 0.1
    assert st.std([0.1, 0.3]) == pytest.approx(0.2 / math.sqrt(2), abs=1e-15)
    assert st.sem([0.1, 0.3]) == pytest.approx(0.1, abs=1e-15)
    assert st.mean([0.25, 0.75, 0.5, 1.5]) == 0.75


def test_one_seed_std_zero_sem_nan():
    assert st.mean([0.7]) == 0.7
    assert st.std([0.7]) == 0.0
    assert math.isnan(st.sem([0.7]))
    assert st.std([2.5, 2.5]) == 0.0 and st.sem([2.5, 2.5]) == 0.0  # two equal seeds: zero noise, not NaN


def test_cell_formats_mean_std_and_count():
    assert st.cell([1, 2, 3]) == "2.0000 ± 1.0000 (n=3)"
    assert st.cell([0.5]) == "0.5000 ± 0.0000 (n=1)"
    assert st.cell([0.1, 0.3], digits=2) == "0.20 ± 0.14 (n=2)"  # std 0.1414...
    assert st.cell([0.123456, 0.123456, 0.123456], digits=3) == "0.123 ± 0.000 (n=3)"


def test_difference_is_b_minus_a_with_combined_standard_error():
    diff, se = st.difference([1, 2, 3], [4, 6, 8])
    assert diff == pytest.approx(4.0)  # 6 - 2
    # sem(a) = 1/sqrt(3), sem(b) = 2/sqrt(3): sqrt(1/3 + 4/3)
    assert se == pytest.approx(math.sqrt(5 / 3), abs=1e-15)
    diff, se = st.difference([4, 6, 8], [1, 2, 3])
    assert diff == pytest.approx(-4.0) and se == pytest.approx(math.sqrt(5 / 3), abs=1e-15)
    diff, se = st.difference([0.1, 0.3], [0.15, 0.35])
    assert diff == pytest.approx(0.05) and se == pytest.approx(math.sqrt(0.02), abs=1e-15)


def test_difference_with_one_seed_has_nan_standard_error():
    diff, se = st.difference([0.2], [0.5])
    assert diff == pytest.approx(0.3) and math.isnan(se)
    diff, se = st.difference([1, 2, 3], [0.5])  # one side with a single seed: no noise estimate either
    assert diff == pytest.approx(-1.5) and math.isnan(se)


def test_lower_verdict_boundaries():
    noisy = "holds, within seed noise (< 2 s.e.)"
    assert st.lower_verdict(-0.1, 0.01) == "does not hold"
    assert st.lower_verdict(0.0, 0.01) == "does not hold"  # no difference: the claimed-lower one is not lower
    assert st.lower_verdict(0.0, math.nan) == "does not hold"
    assert st.lower_verdict(0.3, math.nan) == "holds (one seed: noise not estimated)"
    assert st.lower_verdict(0.5, 0.25) == noisy  # exactly 2 s.e. is not beyond 2 s.e.
    assert st.lower_verdict(0.5000001, 0.25) == "holds"
    assert st.lower_verdict(0.4999999, 0.25) == noisy
    assert st.lower_verdict(1e-9, 0.0) == "holds"  # equal seeds: any positive gap is beyond noise


def test_at_least_verdict_boundaries():
    noisy = "holds within seed noise (lower by < 2 s.e.)"
    assert st.at_least_verdict(0.0, 0.01) == "holds"  # a tie satisfies ">="
    assert st.at_least_verdict(0.2, math.nan) == "holds"
    assert st.at_least_verdict(-0.2, math.nan) == "does not hold (one seed: noise not estimated)"
    assert st.at_least_verdict(-0.5, 0.25) == noisy  # lower by exactly 2 s.e.
    assert st.at_least_verdict(-0.4999999, 0.25) == noisy
    assert st.at_least_verdict(-0.5000001, 0.25) == "does not hold"
    assert st.at_least_verdict(-1e-9, 0.0) == "does not hold"


def test_verdicts_on_differences_of_seed_lists():
    # +0.05 with s.e. sqrt(0.1^2 + 0.1^2) = 0.141: positive but within noise
    assert st.lower_verdict(*st.difference([0.1, 0.3], [0.15, 0.35])) == "holds, within seed noise (< 2 s.e.)"
    # +4 with s.e. sqrt(5/3) = 1.29: beyond 2 s.e.
    assert st.lower_verdict(*st.difference([1, 2, 3], [4, 6, 8])) == "holds"
    assert st.at_least_verdict(*st.difference([4, 6, 8], [1, 2, 3])) == "does not hold"
    # -1 with s.e. sqrt(1/3 + 1/3) = 0.816: lower, but by less than 2 s.e.
    assert st.at_least_verdict(*st.difference([2, 3, 4], [1, 2, 3])) == "holds within seed noise (lower by < 2 s.e.)"
    assert st.lower_verdict(*st.difference([0.2], [0.5])) == "holds (one seed: noise not estimated)"
