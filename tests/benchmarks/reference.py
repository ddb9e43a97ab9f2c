"""The reference timed beside every benchmark round, so that the time gate can divide out
how fast the machine happened to be at that moment.

On a machine shared with other jobs a benchmark's time moves with the load on the cores,
not only with the code. A fixed matmul, which no code of this project touches, is timed
just before each timed round of each benchmark (pytest-benchmark's `pedantic` setup, which
is not timed): a round's time divided by the reference's just before it is a figure of the
code alone, as far as the load slows both alike, and the median of those ratios over the
rounds is what `playground/gates/time.py` compares. The pairing is what helps: the load
changes within a second, so a reference timed at another moment (once per session, or the
fastest of a benchmark's references) divides by the wrong machine.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import pytest
import torch

REFERENCE_SIZE = 512
"""A (512, 512) @ (512, 512) matmul: 0.27 GFLOP, a few milliseconds on two CPU cores, so
that timing it before every round adds little to the suite."""


REFERENCE_SHARE = 0.1
"""Each round's reference lasts about this share of the benchmark's call (at least one
matmul): long enough to sample the load the round meets, short enough to add little."""


class InterleavedReference:
    """Times the reference before each round; pass it as `pedantic(setup=...)`.
    `times_s` holds, per round, the time of one reference matmul (the block's mean)."""

    def __init__(self, device: str, dtype: torch.dtype, call_s: float) -> None:
        generator = torch.Generator().manual_seed(0)
        shape = (REFERENCE_SIZE, REFERENCE_SIZE)
        self.a = torch.randn(shape, generator=generator).to(device, dtype)
        self.b = torch.randn(shape, generator=generator).to(device, dtype)
        self.cuda = device == "cuda"
        self.times_s: list[float] = []
        self.matmuls = 1
        single_s = min(self._block_s() for _ in range(3))  # the first sets up BLAS threads
        self.matmuls = max(1, round(REFERENCE_SHARE * call_s / single_s))

    def _block_s(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(self.matmuls):
            self.a @ self.b
        if self.cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() - start) / self.matmuls

    def __call__(self) -> None:
        self.times_s.append(self._block_s())


def rounds_for(call_s: float, config: pytest.Config) -> int:
    """pytest-benchmark's own choice of rounds for a call this long: enough to fill
    --benchmark-max-time, at least --benchmark-min-rounds."""
    max_time = float(config.getoption("benchmark_max_time"))
    min_rounds = int(config.getoption("benchmark_min_rounds"))
    return max(min_rounds, math.ceil(max_time / max(call_s, 1e-9)))


def duration_s(call: Callable[[], None]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start
