"""A deliberate slow-down of chosen benchmarks, to prove that the time gate catches one.

    PLAYGROUND_BENCH_INJECT_SLOWDOWN="longformer-n1024-forward=1.5" nox -s bench_compare

makes that benchmark's timed call do its own work and then extra matmuls sized to take
half as long again (1.5 times in all), so the same benchmark id gets slower while no
plugin changes. A variant's label alone (`longformer=1.5`) slows all its benchmarks;
several are separated by commas. The extra work is timed only: the
profiled call that measures peak memory stays the variant's own, so the memory gate is
not disturbed. The factor actually injected (it is sized from a few timed calls) is saved
as `extra_info["injected_slowdown"]`.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable

import pytest
import torch

from tests.benchmarks.reference import duration_s

SLOWDOWN_ENV = "PLAYGROUND_BENCH_INJECT_SLOWDOWN"
REFINE_ROUNDS = 5
EXTRA_SIZE = 256
"""Each unit of extra work is a (256, 256) @ (256, 256) matmul, a fraction of a
millisecond, so the extra time can be sized to a few percent of any benchmark's."""


def injected_slowdowns() -> dict[str, float]:
    """Benchmark id (`longformer-n1024-forward`) or variant label -> factor, from
    $PLAYGROUND_BENCH_INJECT_SLOWDOWN."""
    factors: dict[str, float] = {}
    for part in os.environ.get(SLOWDOWN_ENV, "").split(","):
        if not part.strip():
            continue
        name, _, factor = part.partition("=")
        try:
            factors[name.strip()] = float(factor)
        except ValueError:
            factors[name.strip()] = 0.0
        if factors[name.strip()] <= 1.0:
            raise pytest.UsageError(
                f"{SLOWDOWN_ENV} takes BENCHMARK_ID=FACTOR pairs with a factor above 1, "
                f"like longformer-n1024-forward=1.5; got {part!r}"
            )
    return factors


def slowed_down(workload: Callable[[], None], factor: float) -> tuple[Callable[[], None], float]:
    """`workload` followed by extra matmuls taking (factor - 1) times its own time, and
    the factor that sizing gives. A first guess from the fastest of a few calls of each is
    refined by timing the workload and the extra work in turn, REFINE_ROUNDS times: on a
    loaded machine the fastest short matmul and the fastest long call meet different
    loads, and sized that way the extra work came out far more than asked for."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(EXTRA_SIZE, EXTRA_SIZE, generator=generator)
    b = torch.randn(EXTRA_SIZE, EXTRA_SIZE, generator=generator)

    def extra(units: int) -> Callable[[], None]:
        def work() -> None:
            for _ in range(units):
                a @ b

        return work

    workload_s = min(duration_s(workload) for _ in range(3))
    unit_s = min(duration_s(extra(1)) for _ in range(20))
    guess = max(1, round((factor - 1) * workload_s / unit_s))
    share = statistics.median(
        duration_s(extra(guess)) / duration_s(workload) for _ in range(REFINE_ROUNDS)
    )  # the guessed extra work's time over the workload's
    units = max(1, round(guess * (factor - 1) / share))
    extra_work = extra(units)

    def slower() -> None:
        workload()
        extra_work()

    return slower, 1 + share * units / guess
