"""Student-t intervals over seeds: the quantile against published tables, the interval
against its definition, and the fallback for rows written before the field existed."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from playground.stats import accuracy_interval, format_interval, interval_half_width, t_quantile

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
