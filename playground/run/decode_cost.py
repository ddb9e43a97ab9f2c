"""The decode pass: what one generated token costs a variant at a context length n.

A step changes the state, so no call can be repeated as it was: each timed run is k
consecutive steps on one state, and the time per token is the run's time over k. A cell
prefills a random prompt of n − DECODE_RESERVE tokens into a state allocated once for n
(`max_length = n`), then decodes up to n: PROBE_STEPS untimed steps, which size k
(STEPS_PER_RUN, or fewer when one step alone takes a good part of TARGET_RUN_S, as the
recompute default at a long context does: then a cell costs 18 steps rather than 130),
`time_call`'s warm-up run, then TIMED_RUNS timed runs with their warm-ups. So every
timed step lies within DECODE_RESERVE tokens below n (the row says where: `steps_from`,
`steps_to`), one prefill serves the cell, and the state's bytes are those of the very
state the steps ran on, sized for n (what `playground info` reports at n). A context
shorter than MIN_DECODE_CONTEXT leaves too little room: specs refuse it.

Against it stands the memory-bandwidth limit: the time to read the state once at the
bandwidth of this process on its threads (`memory_bandwidth`, measured once per process,
as the GEMM rate is for the other passes; the runner records it in env.json).
`bandwidth_efficiency` is that time over the measured step. It is the floor of a step
that reads its whole state, as a cache or a recurrent state does. A step also reads the
layer's weights (4 · d_model² numbers for the standard projections): where they outweigh
the state (short contexts, recurrent states) the ratio is low by construction and the row
says so (FLAG_WEIGHTS_DOMINATE), as it does for a variant decoding by the recompute
default (FLAG_RECOMPUTED), whose state is its inputs, not a cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils import benchmark

from playground.contract import AttentionVariant
from playground.decoding import DecodingState, RecomputeState
from playground.errors import InvalidInput, InvalidOutput
from playground.run.instruments import (
    FLAG_RECOMPUTED,
    FLAG_WEIGHTS_DOMINATE,
    cost_flags,
    cpu_count,
    load_average,
    time_call,
    using_threads,
)
from playground.run.row_schema import DecodeFields

STEPS_PER_RUN = 8
"""Decode steps in one timed run at most: enough that the timer's own overhead vanishes."""
TARGET_RUN_S = 0.2
"""A timed run of this long needs no more steps: fewer are taken when one step is slow
(longer than TARGET_RUN_S / STEPS_PER_RUN, 25 ms), so a cell of slow steps costs about
CALLS_PER_CELL · TARGET_RUN_S rather than DECODE_RESERVE slow steps."""
TIMED_RUNS = 5
"""Timed runs per cell: enough for a median and a spread."""
CALLS_PER_TIMED_RUN = 3
"""torch.utils.benchmark's `Timer.timeit(1)` makes two untimed warm-up calls first."""
CALLS_PER_CELL = 1 + TIMED_RUNS * CALLS_PER_TIMED_RUN
"""Timed-run calls in a cell: `time_call`'s warm-up run, then each timed run and its
warm-ups."""
PROBE_STEPS = 2
"""Untimed steps that size a timed run, from the faster: a first step may pay for
allocations, and one step on a shared machine may be held up."""
DECODE_RESERVE = PROBE_STEPS + STEPS_PER_RUN * CALLS_PER_CELL
"""Tokens a cell decodes at most below the context length: the probe steps, then
CALLS_PER_CELL runs of STEPS_PER_RUN steps."""
MIN_DECODE_CONTEXT = 1 + PROBE_STEPS + CALLS_PER_CELL
"""The shortest context a cell can time at: a prompt of one token, the probe steps, and
CALLS_PER_CELL runs of one step."""
BANDWIDTH_BYTES = 256 * 2**20
"""The matrix the bandwidth is read from: far larger than any CPU cache level or a GPU's
L2, so every read comes from memory."""
MIN_BANDWIDTH_BYTES = 32 * 2**20
"""The smallest matrix worth timing when memory is short (still beyond most caches)."""
BANDWIDTH_WIDTH = 2048
"""Columns of that matrix: a key's width times a few heads, read row after row."""


@torch.no_grad()
def prefilled(
    module: AttentionVariant,
    length: int,
    *,
    batch: int = 1,
    extra_tokens: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> DecodingState:
    """`module`'s decoding state after a random prompt of `length` tokens, sized for
    `extra_tokens` more (its max_length)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    prompt = torch.randn(
        batch, length, module.d_model, generator=generator, dtype=dtype, device=device
    )
    return module.prefill(prompt, max_length=length + extra_tokens)[1]


@dataclass(frozen=True)
class Bandwidth:
    """A measured memory bandwidth and what it was read from."""

    bytes_per_s: float
    buffer_bytes: int
    threads: int


def available_memory(device: torch.device | str) -> int | None:
    """Bytes free for a new buffer on `device` (CUDA's free memory, Linux's MemAvailable);
    None where the platform does not say."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def bandwidth_buffer_bytes(device: torch.device | str) -> int:
    """BANDWIDTH_BYTES, or a quarter of the free memory when that is less (never below
    MIN_BANDWIDTH_BYTES): the measurement must not push a shared machine into swap."""
    free = available_memory(device)
    if free is None:
        return BANDWIDTH_BYTES
    return max(MIN_BANDWIDTH_BYTES, min(BANDWIDTH_BYTES, free // 4))


def memory_bandwidth(
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    threads: int | None = None,
    min_run_time: float = 0.5,
    buffer_bytes: int | None = None,
) -> Bandwidth:
    """Bytes per second at which a matrix-vector product reads a matrix of `buffer_bytes`
    (default: bandwidth_buffer_bytes) on `threads` torch threads: the kernel of a
    decoding step (one query against every kept key), each byte read once. From the
    fastest block, as the GEMM rate is: sharing the machine only slows it."""
    size = bandwidth_buffer_bytes(device) if buffer_bytes is None else buffer_bytes
    itemsize = torch.finfo(dtype).bits // 8
    rows = max(1, size // (BANDWIDTH_WIDTH * itemsize))
    matrix = torch.randn(rows, BANDWIDTH_WIDTH, device=device, dtype=dtype)
    vector = torch.randn(BANDWIDTH_WIDTH, device=device, dtype=dtype)
    with using_threads(threads) as count:
        torch.mv(matrix, vector)
        timer = benchmark.Timer(
            "torch.mv(matrix, vector)",
            globals={"torch": torch, "matrix": matrix, "vector": vector},
            num_threads=count,
        )
        measurement = timer.blocked_autorange(min_run_time=min_run_time)
    return Bandwidth(matrix.nbytes / min(measurement.times), matrix.nbytes, count)


def steps_per_run(step_s: float, room: int = DECODE_RESERVE) -> int:
    """k: the steps of one timed run, so that it lasts about TARGET_RUN_S, from 1 to
    STEPS_PER_RUN, and so that the cell's runs fit in `room` tokens after the probe."""
    fits = max(1, (room - PROBE_STEPS) // CALLS_PER_CELL)
    wanted = STEPS_PER_RUN if step_s <= 0 else int(TARGET_RUN_S / step_s)
    return max(1, min(STEPS_PER_RUN, fits, wanted))


def measure_decode(
    module: AttentionVariant,
    context: int,
    batch: int,
    dtype: torch.dtype,
    device: str,
    threads: int,
    bandwidth: float,
    seed: int = 0,
) -> DecodeFields:
    """The fields of a decode row: the median time of one step just below `context`
    tokens, the state's bytes per sequence there, and the step against reading the state
    once at `bandwidth` bytes/s. In eval mode, without gradients."""
    if context < MIN_DECODE_CONTEXT:
        raise InvalidInput(
            f"a decode cell times up to {DECODE_RESERVE} steps below its context length, "
            f"at least {MIN_DECODE_CONTEXT - 1}; a context of {context} leaves no room: give "
            f"seq_lens of {MIN_DECODE_CONTEXT} or more"
        )
    module.eval()
    prompt = max(1, context - DECODE_RESERVE)
    state = prefilled(
        module,
        prompt,
        batch=batch,
        extra_tokens=context - prompt,
        dtype=dtype,
        device=device,
        seed=seed,
    )
    generator = torch.Generator(device=device).manual_seed(seed + 1)
    tokens = torch.randn(
        batch, STEPS_PER_RUN, module.d_model, generator=generator, dtype=dtype, device=device
    )

    @torch.no_grad()
    def steps(count: int) -> None:
        for i in range(count):
            output, _ = module.decode_step(tokens[:, i : i + 1], state)
        finite = bool(output.isfinite().all())
        if output.shape != (batch, 1, module.d_model) or output.dtype != dtype or not finite:
            raise InvalidOutput(
                f"decode_step returned {tuple(output.shape)} {output.dtype}"
                f"{'' if finite else ' with NaN or inf'}; expected ({batch}, 1, "
                f"{module.d_model}) {dtype}, finite"
            )

    load, cores = load_average(), cpu_count()
    probes = []
    with using_threads(threads):
        for _ in range(PROBE_STEPS):  # they check the step's output before any timing too
            started = time.perf_counter()
            steps(1)
            if torch.device(device).type == "cuda":
                torch.cuda.synchronize(device)
            probes.append(time.perf_counter() - started)
    k = steps_per_run(min(probes), context - prompt)
    timing = time_call(lambda: steps(k), min_run_time=0.0, threads=threads, min_runs=TIMED_RUNS)
    step_s = timing.median_s / k
    iqr_s = None if timing.iqr_s is None else timing.iqr_s / k
    state_bytes = state.nbytes  # every sequence's: a step reads them all
    read_s = state_bytes / bandwidth
    efficiency = read_s / step_s
    weight_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
    flags = cost_flags(
        time_s=step_s, iqr_s=iqr_s, runs=timing.runs, efficiency=efficiency, load=load, cores=cores
    )
    if isinstance(state, RecomputeState):
        flags.append(FLAG_RECOMPUTED)
    if weight_bytes > state_bytes:
        flags.append(FLAG_WEIGHTS_DOMINATE)
    return {
        "time_ms": step_s * 1e3,
        "time_iqr_ms": None if iqr_s is None else iqr_s * 1e3,
        "timed_runs": timing.runs,
        "steps_per_run": k,
        "steps_from": prompt,
        "steps_to": state.length,
        "state_bytes": state_bytes / batch,
        "state_type": type(state).__name__,
        "weight_bytes": weight_bytes,
        "bandwidth_bytes_per_s": bandwidth,
        "read_limit_ms": read_s * 1e3,
        "bandwidth_efficiency": efficiency,
        "load_average": load,
        "cores": cores,
        "flags": flags,
    }
