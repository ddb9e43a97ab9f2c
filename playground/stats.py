"""Confidence intervals over seeds: mean ± the half-width of a Student-t interval.

A handful of seeds is a small sample from the distribution of training outcomes; the
interval mean ± t(1 − α/2; n − 1) · s / √n (Student 1908) covers the expected accuracy with
probability 1 − α when the outcomes are roughly normal. With 3 seeds t is 4.30, so the
interval is more than twice the standard deviation: that width is the honest uncertainty,
which a bare "± std" understates.

The t quantile is computed here (no SciPy dependency): the density is integrated with
Simpson's rule and the quantile found by Newton's method, exact to about 1e-9.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence
from typing import Any

CONFIDENCE = 0.95
"""Coverage of the intervals the tables, figures and report show."""


def _t_density(x: float, df: int) -> float:
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(log_norm - (df + 1) / 2 * math.log1p(x * x / df))


def _t_cdf_from_zero(x: float, df: int, intervals: int = 2000) -> float:
    """P(0 < T < x) for x >= 0, by composite Simpson's rule."""
    h = x / intervals
    total = _t_density(0.0, df) + _t_density(x, df)
    for i in range(1, intervals):
        total += (4 if i % 2 else 2) * _t_density(i * h, df)
    return total * h / 3


@functools.lru_cache(maxsize=64)
def t_quantile(probability: float, df: int) -> float:
    """The `probability` quantile of Student's t with `df` degrees of freedom (p > 0.5)."""
    if not 0.5 < probability < 1.0:
        raise ValueError(f"probability must be in (0.5, 1); got {probability}")
    if df < 1:
        raise ValueError(f"df must be a positive integer; got {df}")
    target = probability - 0.5
    x = statistics.NormalDist().inv_cdf(probability)  # below the t quantile: Newton climbs
    for _ in range(100):  # the cdf is concave on x > 0, so Newton from below is monotone
        step = (target - _t_cdf_from_zero(x, df)) / _t_density(x, df)
        x += step
        if abs(step) < 1e-12 * max(1.0, x):
            break
    return x


def interval_half_width(values: Sequence[float], confidence: float = CONFIDENCE) -> float | None:
    """Half-width of the Student-t confidence interval of the mean of `values`; None for
    fewer than two values (one seed says nothing about the spread)."""
    if len(values) < 2:
        return None
    spread = statistics.stdev(values) / math.sqrt(len(values))
    return t_quantile(0.5 + confidence / 2, len(values) - 1) * spread


def accuracy_interval(row: dict[str, Any]) -> float | None:
    """A result row's 95% half-width: its recorded `accuracy_ci95`, else computed from its
    per-seed accuracies (rows written before the field existed)."""
    recorded = row.get("accuracy_ci95")
    if recorded is not None:
        return float(recorded)
    return interval_half_width(row.get("accuracy_per_seed") or [])


def format_interval(mean: float, half_width: float | None) -> str:
    """ "0.912 ± 0.041" (the 95% half-width), or "0.912" for a single seed."""
    return f"{mean:.3f}" if half_width is None else f"{mean:.3f} ± {half_width:.3f}"
