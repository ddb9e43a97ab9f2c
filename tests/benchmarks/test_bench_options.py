"""The benchmark suite's environment settings: the thread count it times with, and the
deliberate slow-down that proves the time gate."""

from __future__ import annotations

import pytest
import torch

from playground.errors import PlaygroundError
from playground.gates.slowdown import SLOWDOWN_ENV, injected_slowdowns, slowed_down
from tests.benchmarks.conftest import THREADS_ENV, bench_threads, check_injected_slowdowns


def test_threads_default_to_torchs_own_count(monkeypatch):
    monkeypatch.delenv(THREADS_ENV, raising=False)
    assert bench_threads() == torch.get_num_threads()
    monkeypatch.setenv(THREADS_ENV, "3")
    assert bench_threads() == 3


@pytest.mark.parametrize("text", ["0", "two", "-1", "1.5"])
def test_a_bad_thread_count_says_what_it_takes(monkeypatch, text):
    monkeypatch.setenv(THREADS_ENV, text)
    with pytest.raises(pytest.UsageError, match="takes a positive integer"):
        bench_threads()


def test_slowdowns_are_read_per_benchmark_or_per_variant(monkeypatch):
    monkeypatch.setenv(SLOWDOWN_ENV, "longformer=1.5, vanilla-n512-forward=2")
    assert injected_slowdowns() == {"longformer": 1.5, "vanilla-n512-forward": 2.0}
    monkeypatch.delenv(SLOWDOWN_ENV)
    assert injected_slowdowns() == {}


@pytest.mark.parametrize("text", ["longformer", "longformer=1", "longformer=fast"])
def test_a_slowdown_needs_a_factor_above_one(monkeypatch, text):
    monkeypatch.setenv(SLOWDOWN_ENV, text)
    with pytest.raises(PlaygroundError, match="BENCHMARK_ID=FACTOR"):
        injected_slowdowns()
    with pytest.raises(pytest.UsageError, match="BENCHMARK_ID=FACTOR"):
        check_injected_slowdowns()  # the suite's refusal, before anything is timed


@pytest.mark.parametrize("factor", [1.5, 2.0, 1.25, 3.7])
def test_the_slowed_workload_does_factor_times_its_own_work(factor):
    calls = []
    slower, injected = slowed_down(lambda: calls.append(1), factor)
    for count in range(1, 41):
        slower()
        assert abs(len(calls) - factor * count) < 1  # within one call, at every count
    assert injected == factor
    pairs = [len(calls)]  # any two consecutive calls of a 1.5 slow-down: three workloads
    if factor == 1.5:
        for _ in range(6):
            before = len(calls)
            slower()
            slower()
            pairs.append(len(calls) - before)
        assert set(pairs[1:]) == {3}
