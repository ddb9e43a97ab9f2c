"""Confidence intervals over seeds: mean ± the half-width of a Student-t interval.

A handful of seeds is a small sample from the distribution of training outcomes; the
interval mean ± t(1 − α/2; n − 1) · s / √n (Student 1908) covers the expected accuracy with
probability 1 − α when the outcomes are roughly normal. With 3 seeds t is 4.30, so the
interval is more than twice the standard deviation: that width is the honest uncertainty,
which a bare "± std" understates.

The t quantile is computed here (no SciPy dependency): the density is integrated with
Simpson's rule and the quantile found by Newton's method, exact to about 1e-9.

An accuracy is a proportion, and mean ± half-width can leave [0, 1] (seeds at 1.0, 1.0
and 0.6 give an upper end of 1.44). The tables and figures therefore show
`proportion_interval`: Wilson's score interval with the effective sample size of Korn &
Graubard (1998), which always lies inside [0, 1] (see its docstring for why not a
bootstrap). `interval_half_width` stays for the rows' recorded `accuracy_ci95`, which
older code reads.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections.abc import Sequence

from playground.run.row_schema import Row

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


def accuracy_interval(row: Row) -> float | None:
    """A result row's 95% Student-t half-width: its recorded `accuracy_ci95`, else computed
    from its per-seed accuracies (rows written before the field existed). Kept for code
    that reads the old field; what is shown should be `accuracy_bounds`, which stays inside
    [0, 1]."""
    recorded = row.get("accuracy_ci95")
    if recorded is not None:
        return float(recorded)
    return interval_half_width(row.get("accuracy_per_seed") or [])


def proportion_interval(
    values: Sequence[float], scored: int | None = None, confidence: float = CONFIDENCE
) -> tuple[float, float] | None:
    """The (low, high) confidence interval of the expected accuracy over seeds, inside
    [0, 1]; None for fewer than two seeds (one says nothing about the spread).

    `values` are per-seed accuracies, each a proportion of `scored` held-out predictions
    (None when unknown). The method is Korn & Graubard's (1998) for a proportion estimated
    from clusters: Wilson's score interval (Wilson 1927), which stays inside [0, 1] and is
    not centred on the mean near its ends, computed with the effective sample size
    p(1 − p) / se², where se is the standard error of the mean over seeds, so the spread
    between seeds sets the width as in the Student-t interval, and with t(n − 1) in place
    of the normal quantile. The effective size is capped at the pooled predictions
    (seeds × scored), so seeds that agree exactly still leave the test set's own sampling
    error (without `scored` they give the point itself).

    Not a bootstrap: with the usual three seeds a percentile bootstrap has only ten
    distinct resampled means, its interval is at most [min, max] of the seeds, and it
    covers far less than 95 %. Not a Wilson interval on the pooled predictions alone: it
    treats every prediction as independent and ignores that seeds train different models,
    which is most of the spread."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    variance_of_mean = statistics.variance(values) / len(values)
    bernoulli = mean * (1 - mean)
    pooled = math.inf if scored is None else len(values) * scored
    if variance_of_mean > 0 and bernoulli > 0:
        # For values in [0, 1], s² ≤ n/(n − 1) · p(1 − p), so this is at least n − 1 but
        # for rounding.
        effective = max(bernoulli / variance_of_mean, len(values) - 1)
    else:  # no spread, or a mean that rounds to 0 or 1 (seeds 1.0 and 1 − 1e-16)
        effective = math.inf
    effective = min(effective, pooled)
    if math.isinf(effective):
        return (mean, mean)  # no spread between seeds and no test-set size to bound it
    quantile = t_quantile(0.5 + confidence / 2, len(values) - 1)
    ratio = quantile**2 / effective
    centre = (mean + ratio / 2) / (1 + ratio)
    half = quantile / (1 + ratio) * math.sqrt(bernoulli / effective + ratio / (4 * effective))
    return (max(0.0, centre - half), min(1.0, centre + half))


def accuracy_bounds(row: Row) -> tuple[float, float] | None:
    """A result row's 95% interval (low, high) of its accuracy, inside [0, 1]: its
    recorded `accuracy_ci95_low` and `accuracy_ci95_high`, else computed from its
    per-seed accuracies (and `accuracy_scored`, the held-out predictions per seed, where
    recorded), so rows written before the fields existed get the same interval."""
    low, high = row.get("accuracy_ci95_low"), row.get("accuracy_ci95_high")
    if low is not None and high is not None:
        return (float(low), float(high))
    return proportion_interval(row.get("accuracy_per_seed") or [], row.get("accuracy_scored"))


def accuracy_error_bar(row: Row) -> tuple[float, float]:
    """How far a row's interval reaches below and above its mean, for matplotlib's
    asymmetric `yerr=[[below], [above]]`; (0, 0) for a single seed."""
    bounds, mean = accuracy_bounds(row), row.get("accuracy_mean")
    if bounds is None or mean is None:
        return (0.0, 0.0)
    low, high = bounds
    return (max(0.0, mean - low), max(0.0, high - mean))


def format_interval(mean: float, interval: float | tuple[float, float] | None) -> str:
    """ "0.912 [0.870, 0.945]" for a (low, high) interval, "0.912 ± 0.041" for a
    half-width (rows' recorded `accuracy_ci95`), or "0.912" for a single seed."""
    if interval is None:
        return f"{mean:.3f}"
    if isinstance(interval, tuple):
        low, high = interval
        return f"{mean:.3f} [{low:.3f}, {high:.3f}]"
    return f"{mean:.3f} ± {interval:.3f}"
