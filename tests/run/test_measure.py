"""The measuring primitives report what happened, exactly where that is possible."""

from __future__ import annotations

import os
import time

import pytest
import torch

from playground.run.measure import (
    FLAG_BUSY,
    FLAG_EFFICIENCY_ABOVE_1,
    FLAG_FEW_RUNS,
    FLAG_FLOPS_NOT_FINITE,
    FLAG_LARGE_SPREAD,
    MIN_TIMED_RUNS,
    cost_flags,
    fit_exponent,
    fit_scaling,
    peak_memory_bytes,
    spread,
    time_call,
)


def test_peak_memory_of_a_known_allocation_is_its_size():
    assert peak_memory_bytes(lambda: torch.empty(1000, 1000)) == 4_000_000


def test_peak_memory_sees_a_freed_temporary():
    def allocate_free_allocate():
        big = torch.empty(1000, 1000)  # 4 MB
        small = torch.empty(500, 1000)  # 2 MB: 6 MB held here
        del big
        later = torch.empty(250, 1000)  # 1 MB: 3 MB held
        return small, later

    assert peak_memory_bytes(allocate_free_allocate) == 6_000_000


def test_peak_memory_is_repeatable():
    fn = lambda: torch.randn(300, 300).softmax(-1) @ torch.randn(300, 300)  # noqa: E731
    assert peak_memory_bytes(fn) == peak_memory_bytes(fn) > 0


def test_fit_exponent_recovers_known_powers():
    sizes = [512, 1024, 2048, 4096]
    assert fit_exponent(sizes, [3 * n**2 for n in sizes]) == pytest.approx(2.0)
    assert fit_exponent(sizes, [7 * n for n in sizes]) == pytest.approx(1.0)


def test_fit_exponent_rejects_too_few_points():
    with pytest.raises(ValueError, match="at least two"):
        fit_exponent([1024], [1.0])


def test_time_call_times_the_call():
    calls = []
    timing = time_call(lambda: calls.append(1), min_run_time=0.01)
    assert timing.median_s > 0 and timing.runs >= 1 and len(calls) > timing.runs


def test_time_call_runs_every_call_on_the_threads_it_records():
    seen: list[int] = []
    timing = time_call(lambda: seen.append(torch.get_num_threads()), min_run_time=0.01)
    assert timing.threads == torch.get_num_threads()
    assert set(seen) == {timing.threads}


@pytest.mark.parametrize("threads", [1, 2])
def test_time_call_uses_the_thread_count_asked_for(threads):
    before = torch.get_num_threads()
    seen: list[int] = []
    timing = time_call(lambda: seen.append(torch.get_num_threads()), 0.01, threads=threads)
    assert timing.threads == threads and set(seen) == {threads}
    assert torch.get_num_threads() == before  # restored afterwards


@pytest.mark.parametrize("threads", [0, -1, 1.5, True])
def test_time_call_refuses_a_thread_count_that_is_not_positive(threads):
    with pytest.raises(ValueError, match="positive integer"):
        time_call(lambda: None, 0.01, threads=threads)


def test_peak_memory_prints_nothing_to_the_terminal(capfd):
    peak_memory_bytes(lambda: torch.empty(1000, 1000))
    assert capfd.readouterr() == ("", "")


def test_peak_memory_passes_on_what_the_call_itself_writes(capfd):
    def noisy() -> None:
        os.write(1, b"to stdout\n")
        os.write(2, b"to stderr\n")
        torch.empty(10)

    peak_memory_bytes(noisy)
    assert capfd.readouterr() == ("to stdout\n", "to stderr\n")


def test_a_slow_call_is_timed_often_enough_for_a_spread():
    # Slower than min_run_time: blocked_autorange alone would time it once (IQR 0).
    timing = time_call(lambda: time.sleep(0.003), min_run_time=0.002)
    assert timing.runs >= MIN_TIMED_RUNS and timing.iqr_s is not None


def test_one_timed_run_has_no_spread_rather_than_an_iqr_of_zero():
    assert spread([0.5]) == (0.5, None)
    timing = time_call(lambda: time.sleep(0.003), min_run_time=0.002, min_runs=1)
    assert timing.runs == 1 and timing.iqr_s is None and timing.relative_iqr is None


def test_cost_flags_name_what_makes_a_number_doubtful():
    assert cost_flags(time_s=1.0, iqr_s=0.05, runs=5, efficiency=0.5, load=1.0, cores=2) == []
    assert cost_flags(runs=1) == [FLAG_FEW_RUNS]
    assert cost_flags(time_s=1.0, iqr_s=0.5) == [FLAG_LARGE_SPREAD]
    assert cost_flags(efficiency=1.37) == [FLAG_EFFICIENCY_ABOVE_1]
    assert cost_flags(efficiency=None, flops=float("inf")) == [FLAG_FLOPS_NOT_FINITE]
    assert cost_flags(load=5.0, cores=2) == [FLAG_BUSY]


def test_a_fit_from_three_lengths_has_an_error_and_from_two_is_a_two_point_slope():
    sizes = [512, 1024, 2048]
    exact = fit_scaling(sizes, [n**2 for n in sizes])
    assert exact.exponent == pytest.approx(2) and exact.stderr == pytest.approx(0, abs=1e-9)
    assert not exact.uncertain and "±" in exact.text()
    two = fit_scaling(sizes[:2], [1.0, 4.0])
    assert two.stderr is None and two.uncertain and two.text() == "2.00 (2-point slope)"
    negative = fit_scaling(sizes, [87.9, 15.0, 40.0])  # a swing, not a law
    assert negative.uncertain and "uncertain" in negative.text()
