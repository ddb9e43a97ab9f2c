"""Attention benchmarks (pytest-benchmark): every registered variant × sequence length ×
pass, grouped by sequence length, on the quick spec's workload (see conftest.py).

Each benchmark's `extra_info` records the variant, its options and shape, its FLOPs, its
peak memory (deterministic on CPU: the allocator's own records) and, when timed, its
throughput and efficiency against the session's GEMM ceiling, its threads, and each
round's time beside the reference matmul timed just before it (reference.py).
`nox -s bench` saves runs; `nox -s bench_compare` fails on a confirmed slow-down
(playground/gates/time.py) or on any growth of peak memory (playground/gates/memory.py).

`PLAYGROUND_BENCH_INJECT_SLOWDOWN` slows chosen benchmarks on purpose
(playground/gates/slowdown.py), to
prove the time gate catches it.
"""

from __future__ import annotations

import pytest

from playground.errors import UnsupportedFeature
from playground.gates.calls import build_call
from playground.run.instruments import peak_memory_bytes
from tests.benchmarks.conftest import BenchSettings
from tests.benchmarks.reference import InterleavedReference, duration_s, rounds_for


def test_attention(
    benchmark,
    bench_settings: BenchSettings,
    variant: str,
    seq_len: int,
    pass_name: str,
    request: pytest.FixtureRequest,
) -> None:
    spec, device = bench_settings.spec, bench_settings.device
    point = bench_settings.variant(variant)
    try:
        call = build_call(spec, point, variant, device, seq_len, pass_name)
    except UnsupportedFeature as error:
        pytest.skip(str(error))
    benchmark.group = f"seq_len={seq_len}"
    benchmark.extra_info.update(call.extra_info)
    timed, workload, flops = call.timed, call.workload, call.flops
    call_s = duration_s(timed)
    reference = InterleavedReference(device, spec.torch_dtype, call_s)
    rounds = 1 if bench_settings.smoke else rounds_for(call_s, request.config)
    benchmark.pedantic(timed, setup=reference, rounds=rounds, iterations=1)
    # Twice: the first profiled call after unprofiled ones reads high, by an amount that
    # varied between runs (1-4 MiB on forward+backward here), as the profiler misses the
    # frees of blocks allocated before it started (the previous call's gradients). The
    # second call's figure repeats to the byte across runs and test selections.
    if not request.config.getoption("bench_time_only", default=False):
        peak_memory_bytes(workload, device)
        peak = peak_memory_bytes(workload, device)
        benchmark.extra_info["peak_memory_bytes"] = peak
        assert peak > 0, peak
    assert flops > 0, flops

    if benchmark.stats is not None and not bench_settings.smoke:
        median_s = benchmark.stats.stats.median
        gemm = request.getfixturevalue("gemm_flops_per_s")
        benchmark.extra_info.update(
            gflops_per_s=flops / median_s / 1e9,
            efficiency=flops / median_s / gemm,
            gemm_flops_per_s=gemm,
            round_times_s=list(benchmark.stats.stats.data),
            reference_times_s=reference.times_s,
        )
