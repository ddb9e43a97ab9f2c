"""Measuring one callable: time, peak memory, the device's GEMM throughput, and the
log-log scaling exponent of a series. Every number the playground reports comes from
here; none is typed in.

- Time: `torch.utils.benchmark.Timer.blocked_autorange` (it synchronises CUDA), after a
  warm-up call; median and interquartile range. The Timer runs on one thread unless told
  otherwise, so every timing here names its thread count (default: the process's own,
  `torch.get_num_threads()`) and records it in `Timing.threads`.
- Peak memory on CPU: the allocator's `[memory]` events recorded by the torch profiler
  (`profile_memory=True`), summed in time order; the peak of the running sum is the most
  bytes held at once above what existed before the call. Deterministic, unlike RSS.
  The profiler's native library writes `USDT: ... profiler_start/profiler_stop` lines
  straight to the process's stderr; they are filtered out (`without_profiler_chatter`),
  everything else written meanwhile is passed on.
- Peak memory on CUDA: `torch.cuda.max_memory_allocated` above the allocation at start.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO

import torch
from torch.utils import benchmark


@dataclass(frozen=True)
class Timing:
    median_s: float
    iqr_s: float
    runs: int
    threads: int
    """The torch intra-op thread count every timed call ran with."""


def resolve_threads(threads: int | None) -> int:
    """The thread count to measure with: `threads`, or the process's own when None."""
    if threads is None:
        return torch.get_num_threads()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive integer; got {threads!r}")
    return threads


@contextlib.contextmanager
def using_threads(threads: int | None) -> Iterator[int]:
    """torch.set_num_threads(threads) inside the block, the previous count after it;
    yields the count in use."""
    count = resolve_threads(threads)
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield count
    finally:
        torch.set_num_threads(previous)


def time_call(
    fn: Callable[[], object], min_run_time: float = 0.5, threads: int | None = None
) -> Timing:
    """Median and IQR of `fn()` in seconds, after one warm-up call, every call on
    `threads` torch threads (default: torch.get_num_threads())."""
    with using_threads(threads) as count:
        fn()
        timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=count)
        measurement = timer.blocked_autorange(min_run_time=min_run_time)
    return Timing(measurement.median, measurement.iqr, len(measurement.times), count)


PROFILER_CHATTER = re.compile(
    rb"^(?:[A-Z]+:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \w+\.cpp:\d+\] .*"
    rb"|\[[A-Z]\d{4} [\d:.]+ \w+\.cpp:\d+\] .*profil.*)(?:\n|$)",
    re.MULTILINE,
)
"""A line the profiler's native libraries log by themselves: kineto's
`USDT:2026-01-01 10:00:00 4856:4856 SyncActivityProfilerHandler.cpp:52] profiler_start`,
and c10's `[W1201 07:57:36.768 CPUAllocator.cpp:245] ... before the profiling started ...`."""


@contextlib.contextmanager
def without_profiler_chatter() -> Iterator[None]:
    """Catch what is written to file descriptors 1 and 2 inside the block and pass it on
    afterwards, less the profiler's own log lines. The native library writes to the
    descriptors directly, below sys.stdout, so they are swapped for temporary files."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved: list[tuple[int, int, IO[bytes]]] = []
    with contextlib.ExitStack() as captures:
        try:
            for descriptor in (1, 2):
                try:
                    original = os.dup(descriptor)
                except OSError:  # closed (a daemon, say): nothing to protect
                    continue
                capture = captures.enter_context(tempfile.TemporaryFile())
                os.dup2(capture.fileno(), descriptor)
                saved.append((descriptor, original, capture))
            yield
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            for descriptor, original, capture in saved:
                os.dup2(original, descriptor)
                os.close(original)
                capture.seek(0)
                kept = PROFILER_CHATTER.sub(b"", capture.read())
                while kept:  # os.write may take only part of it
                    kept = kept[os.write(descriptor, kept) :]


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
    with (
        without_profiler_chatter(),
        torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
        ) as profile,
    ):
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
    threads: int | None = None,
) -> float:
    """Throughput of a large square matmul on `threads` torch threads (default:
    torch.get_num_threads()): the practical ceiling for efficiency.

    From the fastest of the timed blocks, not their median: a machine shared with other
    work only ever slows a matmul down, and a ceiling measured during a busy moment
    would make every efficiency against it too high (above 1, even)."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    with using_threads(threads) as count:
        a @ b
        timer = benchmark.Timer(stmt="a @ b", globals={"a": a, "b": b}, num_threads=count)
        measurement = timer.blocked_autorange(min_run_time=min_run_time)
    return 2 * size**3 / min(measurement.times)


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
