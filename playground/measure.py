"""Measuring one callable: time, peak memory, the device's GEMM throughput, and the
log-log scaling exponent of a series. Every number the playground reports comes from
here; none is typed in.

- Time: `torch.utils.benchmark.Timer.blocked_autorange` (it synchronises CUDA), after a
  warm-up call; median and interquartile range.
- Peak memory on CPU: the allocator's `[memory]` events recorded by the torch profiler
  (`profile_memory=True`), summed in time order; the peak of the running sum is the most
  bytes held at once above what existed before the call. Deterministic, unlike RSS.
- Peak memory on CUDA: `torch.cuda.max_memory_allocated` above the allocation at start.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.utils import benchmark


@dataclass(frozen=True)
class Timing:
    median_s: float
    iqr_s: float
    runs: int


def time_call(fn: Callable[[], object], min_run_time: float = 0.5) -> Timing:
    """Median and IQR of `fn()` in seconds, after one warm-up call."""
    fn()
    measurement = benchmark.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(
        min_run_time=min_run_time
    )
    return Timing(measurement.median, measurement.iqr, len(measurement.times))


def peak_memory_bytes(fn: Callable[[], object], device: torch.device | str = "cpu") -> int:
    """Most bytes allocated at once by `fn()` beyond what was allocated before it."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - start
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    ) as profile:
        fn()
    # The raw allocator records: FunctionEvents fold allocations made inside an op into
    # the op's net memory, which would hide a temporary's peak.
    records = sorted(
        (e for e in profile.profiler.kineto_results.events() if e.name() == "[memory]"),
        key=lambda e: e.start_ns(),
    )
    held = peak = 0
    for record in records:
        held += record.nbytes()  # + on allocation, − on free
        peak = max(peak, held)
    return peak


def gemm_flops_per_second(
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    size: int = 2048,
    min_run_time: float = 0.5,
) -> float:
    """Throughput of a large square matmul: the practical ceiling for efficiency."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    timing = time_call(lambda: a @ b, min_run_time)
    return 2 * size**3 / timing.median_s


def fit_exponent(sizes: Sequence[float], values: Sequence[float]) -> float:
    """Least-squares slope of log(value) against log(size): 1 = linear, 2 = quadratic."""
    if len(sizes) != len(values) or len(sizes) < 2:
        raise ValueError("fit_exponent needs at least two (size, value) pairs of equal count")
    xs = [math.log(s) for s in sizes]
    ys = [math.log(v) for v in values]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        raise ValueError("fit_exponent needs at least two different sizes")
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
