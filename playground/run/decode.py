"""The decode pass: what one generated token costs a variant at a context length.

A decode cell prefills a random prompt of the context length (`prefilled`), then times
`decode_step`: each timed run is STEPS_PER_RUN consecutive steps (a step changes the
state, so no call can be repeated as it was), TIMED_RUNS runs and their warm-ups, so the
steps timed lie between the context length and DECODE_RESERVE tokens past it (the row
says how far). The state is allocated once for all of them (`max_length`).

Against it stands the memory-bandwidth limit: the time to read the state once at the
bandwidth of this process on its threads (`memory_bandwidth`, measured once per process,
as the GEMM rate is for the other passes). `bandwidth_efficiency` is that time over the
measured step. It is the limit of a step that reads its whole state, as a cache or a
recurrent state does; a step also reads the layer's weights (4 · d_model² numbers for the
standard projections), so at short contexts, where the state is small beside them, the
ratio is low by design. The recompute default re-runs a whole forward: its ratio says
how far it is from a real cache.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import benchmark

from playground.contract import AttentionVariant
from playground.decoding import DecodingState
from playground.errors import InvalidOutput
from playground.run.measure import cost_flags, cpu_count, load_average, time_call, using_threads

STEPS_PER_RUN = 8
"""Decode steps in one timed run."""
TIMED_RUNS = 5
"""Timed runs per cell: enough for a median and a spread."""
CALLS_PER_TIMED_RUN = 3
"""torch.utils.benchmark's `Timer.timeit(1)` makes two untimed warm-up calls first."""
DECODE_RESERVE = STEPS_PER_RUN * (1 + TIMED_RUNS * CALLS_PER_TIMED_RUN)
"""Tokens decoded past the context length in one cell: `time_call`'s warm-up run, then
every timed run and its warm-ups."""
BANDWIDTH_BYTES = 256 * 2**20
"""The matrix the bandwidth is read from: far larger than any cache level."""


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


def memory_bandwidth(
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    threads: int | None = None,
    min_run_time: float = 0.5,
) -> float:
    """Bytes per second that a matrix-vector product reads a BANDWIDTH_BYTES matrix at,
    on `threads` torch threads: the kernel a decoding step is (a query against every
    kept key). From the fastest block, as the GEMM rate is: sharing only slows it."""
    width = 2048
    rows = BANDWIDTH_BYTES // (width * torch.finfo(dtype).bits // 8)
    matrix = torch.randn(rows, width, device=device, dtype=dtype)
    vector = torch.randn(width, device=device, dtype=dtype)
    with using_threads(threads) as count:
        torch.mv(matrix, vector)
        timer = benchmark.Timer(
            "torch.mv(matrix, vector)",
            globals={"torch": torch, "matrix": matrix, "vector": vector},
            num_threads=count,
        )
        measurement = timer.blocked_autorange(min_run_time=min_run_time)
    return matrix.nbytes / min(measurement.times)


def measure_decode(
    module: AttentionVariant,
    context: int,
    batch: int,
    dtype: torch.dtype,
    device: str,
    threads: int,
    bandwidth: float,
    seed: int = 0,
) -> dict[str, Any]:
    """The fields of a decode row: the median time of one step at `context` tokens, the
    state's bytes per sequence there, and the step against reading the state once."""
    module.eval()
    state_bytes = prefilled(module, context, batch=batch, dtype=dtype, device=device).nbytes
    state = prefilled(
        module, context, batch=batch, extra_tokens=DECODE_RESERVE, dtype=dtype, device=device
    )
    generator = torch.Generator(device=device).manual_seed(seed + 1)
    tokens = torch.randn(
        batch, STEPS_PER_RUN, module.d_model, generator=generator, dtype=dtype, device=device
    )

    @torch.no_grad()
    def steps() -> None:
        for i in range(STEPS_PER_RUN):
            output, _ = module.decode_step(tokens[:, i : i + 1], state)
        if output.shape != (batch, 1, module.d_model) or not bool(output.isfinite().all()):
            raise InvalidOutput(
                f"decode_step returned {tuple(output.shape)} {output.dtype}"
                f"{'' if output.isfinite().all() else ' with NaN or inf'}; expected "
                f"({batch}, 1, {module.d_model}), finite"
            )

    load, cores = load_average(), cpu_count()
    timing = time_call(steps, min_run_time=0.0, threads=threads, min_runs=TIMED_RUNS)
    step_s = timing.median_s / STEPS_PER_RUN
    iqr_s = None if timing.iqr_s is None else timing.iqr_s / STEPS_PER_RUN
    read_s = state_bytes / bandwidth
    efficiency = read_s / step_s
    return {
        "time_ms": step_s * 1e3,
        "time_iqr_ms": None if iqr_s is None else iqr_s * 1e3,
        "timed_runs": timing.runs,
        "steps_per_run": STEPS_PER_RUN,
        "decoded_past_context": state.length - context,
        "state_bytes": state_bytes / batch,
        "bandwidth_bytes_per_s": bandwidth,
        "read_limit_ms": read_s * 1e3,
        "bandwidth_efficiency": efficiency,
        "load_average": load,
        "cores": cores,
        "flags": cost_flags(
            time_s=step_s,
            iqr_s=iqr_s,
            runs=timing.runs,
            efficiency=efficiency,
            load=load,
            cores=cores,
        ),
    }
