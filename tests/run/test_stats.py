"""Student-t intervals over seeds: the quantile against published tables, the interval
against its definition, and the fallback for rows written before the field existed."""

from __future__ import annotations

import math
import re
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from playground.run.stats import (
    accuracy_bounds,
    accuracy_error_bar,
    accuracy_interval,
    format_interval,
    interval_half_width,
    proportion_interval,
    t_quantile,
)

# t(0.975; df) from standard tables (e.g. NIST/SEMATECH e-Handbook, table 1.3.6.7.2).
TABLE = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 9: 2.262, 10: 2.228, 30: 2.042}


@pytest.mark.parametrize(("df", "expected"), TABLE.items())
def test_the_quantile_matches_the_published_table(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=6e-4)


def test_other_levels_and_the_normal_limit():
    assert t_quantile(0.95, 4) == pytest.approx(2.132, abs=6e-4)  # one-sided 95%, df 4
    assert t_quantile(0.995, 3) == pytest.approx(5.841, abs=6e-4)  # 99% two-sided, df 3
    assert t_quantile(0.975, 100_000) == pytest.approx(1.95996, abs=1e-4)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="probability"):
        t_quantile(0.4, 3)
    with pytest.raises(ValueError, match="df"):
        t_quantile(0.975, 0)


def test_the_interval_is_t_times_the_standard_error():
    values = [0.91, 0.97, 0.88]
    expected = 4.3027 * statistics.stdev(values) / math.sqrt(3)
    assert interval_half_width(values) == pytest.approx(expected, rel=1e-4)
    assert interval_half_width([0.5]) is None  # one seed: no spread to speak of
    assert interval_half_width([0.7, 0.7, 0.7]) == 0.0


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=2, max_size=8))
def test_the_interval_is_wider_than_the_normal_one(values):
    half = interval_half_width(values)
    assert half >= 1.95 * statistics.stdev(values) / math.sqrt(len(values)) - 1e-12


def test_rows_without_the_field_get_it_from_their_seeds():
    assert accuracy_interval({"accuracy_per_seed": [0.9, 1.0]}) == pytest.approx(
        12.7062 * statistics.stdev([0.9, 1.0]) / math.sqrt(2), rel=1e-4
    )
    assert accuracy_interval({"accuracy_ci95": 0.05, "accuracy_per_seed": [0.9, 1.0]}) == 0.05
    assert accuracy_interval({"accuracy_per_seed": [0.9]}) is None
    assert format_interval(0.9123, 0.0414) == "0.912 ± 0.041"
    assert format_interval(0.9123, None) == "0.912"


# --- intervals of a proportion (issue 30 §2) ---------------------------------------------
def test_an_accuracy_interval_stays_inside_zero_and_one():
    """Seeds at 1.0, 1.0 and 0.6: mean ± t·se reaches 1.44; the shown interval may not."""
    row = {"accuracy_mean": 13 / 15, "accuracy_per_seed": [1.0, 1.0, 0.6], "accuracy_ci95": 0.57}
    low, high = accuracy_bounds(row)
    assert 0.0 <= low < row["accuracy_mean"] < high <= 1.0
    text = format_interval(row["accuracy_mean"], accuracy_bounds(row))
    assert text == f"0.867 [{low:.3f}, {high:.3f}]"
    assert all(0.0 <= float(x) <= 1.0 for x in re.findall(r"\d+\.\d+", text))
    below, above = accuracy_error_bar(row)
    assert row["accuracy_mean"] - below >= 0.0 and row["accuracy_mean"] + above <= 1.0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0, 1), min_size=2, max_size=8),
    st.one_of(st.none(), st.integers(1, 5000)),
)
def test_the_proportion_interval_is_inside_zero_one_and_holds_the_mean(values, scored):
    low, high = proportion_interval(values, scored)
    mean = statistics.fmean(values)
    assert 0.0 <= low <= mean + 1e-9 and mean - 1e-9 <= high <= 1.0


def test_a_mean_that_rounds_to_an_end_does_not_divide_by_zero():
    # found by hypothesis in CI: the mean of these rounds to exactly 1.0
    assert proportion_interval([1.0, 0.9999999999999999]) == (1.0, 1.0)
    low, high = proportion_interval([0.0, 1e-17], scored=100)
    assert 0.0 == low <= high < 0.5


def test_the_proportion_interval_is_close_to_the_t_interval_away_from_the_ends():
    values = [0.5, 0.56, 0.53]
    low, high = proportion_interval(values)
    half = interval_half_width(values)
    assert low == pytest.approx(0.53 - half, abs=0.01) and high == pytest.approx(
        0.53 + half, abs=0.01
    )


def test_seeds_that_agree_keep_the_test_sets_own_uncertainty():
    assert proportion_interval([1.0, 1.0, 1.0]) == (1.0, 1.0)  # nothing bounds it
    low, high = proportion_interval([1.0, 1.0, 1.0], scored=1024)
    assert 0.99 < low < 1.0 and high == 1.0
    assert proportion_interval([0.7]) is None
    assert accuracy_bounds({"accuracy_per_seed": [0.9]}) is None
    assert accuracy_error_bar({"accuracy_mean": 0.9, "accuracy_per_seed": [0.9]}) == (0.0, 0.0)


def test_recorded_bounds_are_used_and_old_rows_get_them_from_their_seeds():
    recorded = {"accuracy_ci95_low": 0.8, "accuracy_ci95_high": 0.95, "accuracy_per_seed": [0.9]}
    assert accuracy_bounds(recorded) == (0.8, 0.95)
    old = {"accuracy_ci95": 0.2, "accuracy_per_seed": [0.9, 1.0]}  # a row from before
    assert accuracy_bounds(old) == proportion_interval([0.9, 1.0])
    assert accuracy_interval(old) == 0.2  # the old field still reads as before
