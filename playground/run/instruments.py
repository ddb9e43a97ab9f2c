"""Measuring one callable: time, peak memory, the device's GEMM throughput, and the
log-log scaling exponent of a series. Every number the playground reports comes from
here; none is typed in.

- Time: `torch.utils.benchmark.Timer` (it synchronises CUDA), after a timed warm-up
  call; median and interquartile range of at least `MIN_TIMED_RUNS` timed runs, so that
  every timing has a spread. A fast call is timed by `blocked_autorange` for
  `min_run_time` seconds (topped up to `MIN_TIMED_RUNS` blocks when it made fewer); a call
  whose warm-up took a `MIN_TIMED_RUNS`-th of `min_run_time` or more is timed
  `MIN_TIMED_RUNS` times, one call each. blocked_autorange spent two calls on such a
  call (one to size its blocks, one timed), or more when three did not fill
  `min_run_time`, so a slow cell costs at most one call more than it did, and a run's
  total time stays about the same. With fewer than `MIN_SPREAD_RUNS` runs (only when a
  caller asks for fewer) no IQR is reported (None), never an IQR of 0 from one sample.
  The Timer runs on one thread unless told otherwise, so every timing here names its
  thread count (default: the process's own, `torch.get_num_threads()`) and records it in
  `Timing.threads`.
- GEMM ceiling (`gemm_flops_per_second`): the faster of torch's matmul and oneDNN's
  product on a large square matrix, as a `GemmRate` that keeps both rates (`gemm_fields` is how env.json and rows record them).
- Quality flags (`cost_flags`): short fixed phrases a row and the summary carry when a
  number should not be read as exact: too few runs, a large spread, an efficiency above
  1, a non-finite `flops()`, a busy machine (`load_average`).
- Scaling exponents (`fit_scaling`): the log-log slope with its standard error, from three
  or more lengths; from two it is a two-point slope with no error.
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
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

import torch
from torch.utils import benchmark

from playground.model import linear_layers
from playground.run.row_schema import GemmFields

MIN_TIMED_RUNS = 3
"""Timed runs per cell at the least: enough for a median and a quartile spread."""
MIN_SPREAD_RUNS = 3
"""Below this many timed runs there is no spread to report: the IQR is None."""
LARGE_SPREAD = 0.2
"""A timing whose IQR exceeds this fraction of its median is flagged: on a shared
machine the runs disagreed enough that the median may be off by as much."""


@dataclass(frozen=True)
class Timing:
    median_s: float
    iqr_s: float | None
    """Interquartile range of the timed runs; None with fewer than MIN_SPREAD_RUNS runs."""
    runs: int
    threads: int
    """The torch intra-op thread count every timed call ran with."""

    @property
    def relative_iqr(self) -> float | None:
        """IQR over median; None without a spread."""
        if self.iqr_s is None or self.median_s <= 0:
            return None
        return self.iqr_s / self.median_s


def spread(times: Sequence[float]) -> tuple[float, float | None]:
    """(median, IQR) of per-call times; the IQR is None below MIN_SPREAD_RUNS samples.
    Quartiles are interpolated as numpy's default (and torch.utils.benchmark) does."""
    if not times:
        raise ValueError("no timed runs")
    median = statistics.median(times)
    if len(times) < MIN_SPREAD_RUNS:
        return median, None
    first, _, third = statistics.quantiles(times, n=4, method="inclusive")
    return median, third - first


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
    fn: Callable[[], object],
    min_run_time: float = 0.5,
    threads: int | None = None,
    min_runs: int = MIN_TIMED_RUNS,
) -> Timing:
    """Median and IQR of `fn()` in seconds over at least `min_runs` timed runs, after one
    warm-up call, every call on `threads` torch threads (default: torch.get_num_threads()).

    A call slow enough that `min_runs` of them fill `min_run_time` is timed `min_runs`
    times, one call per run (blocked_autorange would time it once, after an untimed call
    that only sizes its blocks); a faster one by blocked_autorange, topped up with blocks
    of the same size when it made fewer than `min_runs`."""
    if isinstance(min_runs, bool) or not isinstance(min_runs, int) or min_runs < 1:
        raise ValueError(f"min_runs must be a positive integer; got {min_runs!r}")
    with using_threads(threads) as count:
        started = time.perf_counter()
        fn()
        warm_up = time.perf_counter() - started
        timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=count)
        times: list[float] = []
        number = 1
        if warm_up * min_runs < min_run_time:
            measurement = timer.blocked_autorange(min_run_time=min_run_time)
            times = list(measurement.times)
            number = measurement.number_per_run
        while len(times) < min_runs:
            times += timer.timeit(number).times
    median, iqr = spread(times)
    return Timing(median, iqr, len(times), count)


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
                capture: IO[bytes] = captures.enter_context(tempfile.TemporaryFile())
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


class GemmRate(float):
    """A GEMM ceiling in FLOP/s: the faster of torch's matmul and oneDNN's product (a
    float, which every efficiency divides by), with each library's own rate.

    The faster, because a ceiling below what the machine does is a wrong reference: MKL
    picks its kernels by CPU vendor and runs AVX2 code on AMD CPUs even where they have
    full-width AVX-512 (about half of what oneDNN reaches there), while the playground's
    native kernels are built for the CPU's full vector width and would show an
    efficiency above 1 against torch's matmul alone."""

    matmul_flops_per_s: float
    onednn_flops_per_s: float | None
    """None where oneDNN was not measured: another device or dtype, or no oneDNN."""

    def __new__(cls, matmul_flops_per_s: float, onednn_flops_per_s: float | None = None):
        rate = super().__new__(cls, max(matmul_flops_per_s, onednn_flops_per_s or 0.0))
        rate.matmul_flops_per_s = matmul_flops_per_s
        rate.onednn_flops_per_s = onednn_flops_per_s
        return rate

    def __reduce__(self):  # pickled (Ray) with both rates, not as a bare float
        return GemmRate, (self.matmul_flops_per_s, self.onednn_flops_per_s)

    @property
    def library(self) -> str:
        """Which product the ceiling is: "onednn" when it was the faster, else "matmul"."""
        onednn = self.onednn_flops_per_s
        return "onednn" if onednn is not None and onednn > self.matmul_flops_per_s else "matmul"


def gemm_fields(rate: float | None) -> GemmFields:
    """How each row and env.json record a GEMM ceiling: `gemm_flops_per_s`, the one
    efficiency is against (the faster library's), then `gemm_matmul_flops_per_s` and
    `gemm_onednn_flops_per_s`, each library's own rate, and `gemm_library`, which was the
    faster. A plain number (a ceiling from elsewhere) records the first alone, the others
    None. An entry of env.json's `gemm_measurements` holds them without the prefix."""
    measured = rate if isinstance(rate, GemmRate) else None
    return {
        "gemm_flops_per_s": None if rate is None else float(rate),
        "gemm_matmul_flops_per_s": None if measured is None else measured.matmul_flops_per_s,
        "gemm_onednn_flops_per_s": None if measured is None else measured.onednn_flops_per_s,
        "gemm_library": None if measured is None else measured.library,
    }


def gemm_rate_of(record: dict[str, Any], prefix: str = "gemm_") -> float | None:
    """The ceiling `gemm_fields` recorded, with its two rates when the record has them (a
    run from before they were recorded gives its plain number); None when it has none."""
    flops = record.get(f"{prefix}flops_per_s")
    matmul = record.get(f"{prefix}matmul_flops_per_s")
    if flops is None or matmul is None:
        return flops
    return GemmRate(matmul, record.get(f"{prefix}onednn_flops_per_s"))


def _fastest_block_s(product: Callable[[], object], min_run_time: float, threads: int) -> float:
    """Seconds per call of `product()`: the fastest block of `blocked_autorange` (whose
    first, untimed call sizes the blocks and warms the library up)."""
    timer = benchmark.Timer(stmt="product()", globals={"product": product}, num_threads=threads)
    return min(timer.blocked_autorange(min_run_time=min_run_time).times)


def gemm_flops_per_second(
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    size: int = 2048,
    min_run_time: float = 0.5,
    threads: int | None = None,
) -> GemmRate:
    """Throughput of a large square matrix product on `threads` torch threads (default:
    torch.get_num_threads()): the practical ceiling for efficiency. The faster of torch's
    matmul and, for float32 on a CPU, oneDNN's linear (`GemmRate` says why), each timed
    for `min_run_time`; both rates are kept.

    From the fastest of the timed blocks, not their median: a machine shared with other
    work only ever slows a matmul down, and a ceiling measured during a busy moment
    would make every efficiency against it too high (above 1, even)."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    products: dict[str, Callable[[], object]] = {"matmul": lambda: a @ b}
    if linear_layers.onednn_computes(device, dtype):
        # a @ bᵀ: the same 2·size³ FLOPs, as FastLinear runs it.
        products["onednn"] = lambda: linear_layers.onednn_linear(a, b)
    with using_threads(threads) as count:
        seconds = {name: _fastest_block_s(p, min_run_time, count) for name, p in products.items()}
    flops = 2 * size**3
    onednn = flops / seconds["onednn"] if "onednn" in seconds else None
    return GemmRate(flops / seconds["matmul"], onednn)


@dataclass(frozen=True)
class ScalingFit:
    """A log-log slope and how sure it is."""

    exponent: float
    stderr: float | None
    """Standard error of the slope; None from two lengths (a line through two points has
    no residual to estimate it from)."""
    lengths: int
    """How many different lengths it was fitted from."""

    @property
    def uncertain(self) -> bool:
        """True when the slope should not be read as a fact: two points only, a standard
        error above UNCERTAIN_EXPONENT, or a negative slope (neither time nor memory shrinks
        as sequences grow: a negative fit is noise or fixed overhead)."""
        return self.stderr is None or self.stderr > UNCERTAIN_EXPONENT or self.exponent < 0

    def text(self) -> str:
        """`1.98 ± 0.02`; `1.9 (2-point slope)`; `-0.63 ± 0.80 (uncertain)`."""
        if self.stderr is None:
            return f"{self.exponent:.2f} (2-point slope)"
        tail = " (uncertain)" if self.uncertain else ""
        return f"{self.exponent:.2f} ± {self.stderr:.2f}{tail}"


UNCERTAIN_EXPONENT = 0.25
"""A fitted exponent with a standard error above this is marked uncertain: it cannot tell
linear from quadratic-ish growth at two standard errors."""


def fit_scaling(sizes: Sequence[float], values: Sequence[float]) -> ScalingFit:
    """The log-log slope of `values` over `sizes` with its standard error (ordinary least
    squares: sqrt(residual variance / Σ(x − x̄)²), with n − 2 degrees of freedom)."""
    slope = fit_exponent(sizes, values)
    xs = [math.log(s) for s in sizes]
    ys = [math.log(v) for v in values]
    lengths = len(set(sizes))
    if len(xs) < 3 or lengths < 3:
        return ScalingFit(slope, None, lengths)
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread_x = sum((x - mean_x) ** 2 for x in xs)
    residual = sum((y - mean_y - slope * (x - mean_x)) ** 2 for x, y in zip(xs, ys, strict=True))
    return ScalingFit(slope, math.sqrt(residual / (len(xs) - 2) / spread_x), lengths)


def load_average() -> float | None:
    """The machine's 1-minute load average (runnable processes); None where the platform
    has none."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def cpu_count() -> int:
    """Cores this process may run on (its affinity where the platform says)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


FLAG_FEW_RUNS = "too few runs"
FLAG_LARGE_SPREAD = "large spread"
FLAG_EFFICIENCY_ABOVE_1 = "efficiency > 1"
FLAG_FLOPS_NOT_FINITE = "flops() not finite"
FLAG_BUSY = "busy machine"
FLAG_PASS_ORDER = "forward slower than fwd+bwd"
FLAG_RECOMPUTED = "decodes by recompute"
FLAG_WEIGHTS_DOMINATE = "weights > state"
FLAG_MEANINGS = {
    FLAG_FEW_RUNS: f"fewer than {MIN_SPREAD_RUNS} timed runs, so no spread (IQR shown as -)",
    FLAG_LARGE_SPREAD: f"the IQR is above {LARGE_SPREAD:.0%} of the median time",
    FLAG_EFFICIENCY_ABOVE_1: "faster than the measured matmul ceiling (torch's or oneDNN's, "
    "whichever was faster; a decode step: than reading its state once at the measured bandwidth): the ceiling or the time was measured "
    "in an odd moment, flops() overcounts, or the step does not read its whole state",
    FLAG_FLOPS_NOT_FINITE: "the variant's flops() overflowed (inf) or is NaN: no efficiency",
    FLAG_BUSY: "the 1-minute load average was above the core count: other work competed",
    FLAG_PASS_ORDER: "the forward alone took longer than forward+backward at the same n: "
    "at least one of the two times is off (measure again on a quiet machine)",
    FLAG_RECOMPUTED: "the variant decodes by the default that re-runs the causal forward over "
    "every token at each step: its state is the inputs, not a cache, so its bandwidth "
    "efficiency compares a whole forward with reading them once",
    FLAG_WEIGHTS_DOMINATE: "the layer's weights, which every decode step also reads, hold more "
    "bytes than its decoding state: reading the state is not this step's floor, so its "
    "bandwidth efficiency is low by construction",
}
"""Every flag a cost row may carry, with what it means. Short fixed phrases, so that rows
and tables compare them and a table column stays narrow; the meanings are printed as a
legend under the tables that show a flag."""
FLAGS = tuple(FLAG_MEANINGS)
LIMIT_FLAGS = (FLAG_RECOMPUTED, FLAG_WEIGHTS_DOMINATE)
"""Flags that doubt only a decode row's bandwidth efficiency, not its time or its bytes."""


def cost_flags(
    *,
    time_s: float | None = None,
    iqr_s: float | None = None,
    runs: int | None = None,
    efficiency: float | None = None,
    flops: float | None = None,
    load: float | None = None,
    cores: int | None = None,
) -> list[str]:
    """The flags of one timed cell, from what was measured (a None is not judged).

    - too few runs: fewer than MIN_SPREAD_RUNS timed runs, so no spread;
    - large spread: IQR above LARGE_SPREAD of the median;
    - efficiency above 1: faster than the matmul ceiling, so the ceiling was measured in a
      slow moment, the time in a fast one, or `flops()` overcounts;
    - flops() not finite: the variant's count overflowed (or is NaN), no efficiency;
    - busy: the 1-minute load average exceeds the cores, so other work competed for them
      (the run itself accounts for at most its own thread count)."""
    flags = []
    if runs is not None and runs < MIN_SPREAD_RUNS:
        flags.append(FLAG_FEW_RUNS)
    if iqr_s is not None and time_s and iqr_s / time_s > LARGE_SPREAD:
        flags.append(FLAG_LARGE_SPREAD)
    if flops is not None and not math.isfinite(flops):
        flags.append(FLAG_FLOPS_NOT_FINITE)
    elif efficiency is not None and efficiency > 1:
        flags.append(FLAG_EFFICIENCY_ABOVE_1)
    if load is not None and cores and load > cores:
        flags.append(FLAG_BUSY)
    return flags


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
