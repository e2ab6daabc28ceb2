"""Confidence intervals and spread for benchmark figures (pure functions, no numpy).

Benchmarks on shared cores vary from run to run by more than the effects
they measure; a figure is reported with the interval that says how well the
runs pinned it down, not as a single number.
"""

from __future__ import annotations

import math
import statistics

# Student's t, two-sided 95% (the 0.975 quantile), by degrees of freedom.
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042]
_T975_LARGE = [(40, 2.021), (60, 2.000), (120, 1.980)]


def t975(df: int) -> float:
    """Pure function: Student's t 0.975 quantile for `df` degrees of freedom.

    Between tabulated values the smaller df's (larger, conservative) value is used.

    Raises:
        ValueError: for df < 1.
    """
    if df < 1:
        raise ValueError(f"a t interval needs at least 1 degree of freedom. Received: df={df}.")
    if df <= len(_T975):
        return _T975[df - 1]
    value = _T975[-1]
    for at, t in _T975_LARGE:
        if df >= at:
            value = t
    return value if df < 1000 else 1.960


def mean_ci95(values: list[float]) -> tuple[float, float, float]:
    """Pure function: (mean, low, high) of a 95% t interval for the mean of `values`.

    Raises:
        ValueError: with fewer than 2 values (no spread, no interval).
    """
    if len(values) < 2:
        raise ValueError(f"a confidence interval needs at least 2 values. Received: {values}.")
    mean = statistics.fmean(values)
    half = t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def verdict(low: float, high: float, goal: float) -> str:
    """Pure function: "met" when the interval lies at or above `goal`, "not met" when below, else
    "undecided" (the runs cannot tell the two apart)."""
    if low >= goal:
        return "met"
    if high < goal:
        return "not met"
    return "undecided"
