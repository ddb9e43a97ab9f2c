"""A deliberate slow-down of chosen benchmarks, to prove that the time gate catches one.

    PLAYGROUND_BENCH_INJECT_SLOWDOWN="longformer-n1024-forward=1.5" nox -s bench_compare

makes that benchmark's timed call do half as much of its own work again (every other call
runs it twice: 1.5 times in all), so the same benchmark id gets slower while no plugin
changes. A variant's label alone (`longformer=1.5`) slows all its benchmarks; several are
separated by commas. The extra work is timed only: the profiled call that measures peak
memory stays the variant's own, so the memory gate is not disturbed. The factor is saved
as `extra_info["injected_slowdown"]`.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from playground.errors import PlaygroundError

SLOWDOWN_ENV = "PLAYGROUND_BENCH_INJECT_SLOWDOWN"


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
            raise PlaygroundError(
                f"{SLOWDOWN_ENV} takes BENCHMARK_ID=FACTOR pairs with a factor above 1, "
                f"like VARIANT-n1024-forward=1.5; got {part!r}"
            )
    return factors


def slowed_down(workload: Callable[[], None], factor: float) -> tuple[Callable[[], None], float]:
    """`workload`, run again as often as makes `factor` times its work: each call adds
    factor − 1 to a running count and runs the workload once more for each whole unit, so
    any run of calls does factor times the work to within one call (1.5: every other call
    runs it twice). More of the variant's own work slows it by exactly the factor, under
    any load; extra work of another kind (matmuls sized by timing them) came out between
    1.1 and 1.5 times on a loaded machine, as the load slows different work differently."""
    owed = [0.0]

    def slower() -> None:
        workload()
        owed[0] += factor - 1
        while owed[0] >= 1:
            workload()
            owed[0] -= 1

    return slower, factor
