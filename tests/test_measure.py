"""The measuring primitives report what happened, exactly where that is possible."""

from __future__ import annotations

import os

import pytest
import torch

from playground.measure import fit_exponent, peak_memory_bytes, time_call


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
