"""Statistics over seeds shared by the reproductions: mean ± std cells, standard errors and
one-sided verdicts that say when a difference is within seed noise."""
from __future__ import annotations

import math
import statistics
from typing import Sequence


def mean(values: Sequence[float]) -> float:
    """The mean over seeds."""
    return statistics.fmean(values)


def std(values: Sequence[float]) -> float:
    """Sample standard deviation over seeds; 0 with one seed."""
    return statistics.stdev(values) if len(values) > 1 else 0.0


def sem(values: Sequence[float]) -> float:
    """Standard error of the mean; NaN with one seed (no noise estimate)."""
    return std(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan


def cell(values: Sequence[float], digits: int = 4) -> str:
    """``mean ± std (n=seeds)``, the table cell of a measurement over seeds."""
    return f"{mean(values):.{digits}f} ± {std(values):.{digits}f} (n={len(values)})"


def difference(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """mean(b) - mean(a) and the standard error of that difference (seeds independent)."""
    return mean(b) - mean(a), math.hypot(sem(a), sem(b))


def lower_verdict(diff: float, se: float) -> str:
    """``diff`` = (the other) - (the one claimed lower): holds when > 0, clearly when beyond 2 standard errors."""
    if diff <= 0:
        return "does not hold"
    if math.isnan(se):
        return "holds (one seed: noise not estimated)"
    return "holds" if diff > 2 * se else "holds, within seed noise (< 2 s.e.)"


def at_least_verdict(diff: float, se: float) -> str:
    """``diff`` = (the one claimed >=) - (the other): holds unless it is lower beyond 2 standard errors."""
    if diff >= 0:
        return "holds"
    if math.isnan(se):
        return "does not hold (one seed: noise not estimated)"
    return "does not hold" if -diff > 2 * se else "holds within seed noise (lower by < 2 s.e.)"
