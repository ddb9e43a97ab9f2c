"""One benchmark's timed call, built the same way wherever it is timed: by pytest-benchmark
(tests/benchmarks/test_attention_benchmarks.py) and by the time gate's paired rounds
(paired.py), which run it in a process of their own on another commit's code.

A benchmark is a registered setup of the quick spec (its label), a sequence
length and a pass; the call is the workload `playground run` times (measurer.Workload),
waiting for CUDA kernels where there are any, and slowed down on purpose where
$PLAYGROUND_BENCH_INJECT_SLOWDOWN asks (slowdown.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from playground.gates.slowdown import injected_slowdowns, slowed_down
from playground.registry import default_registry
from playground.run.measurer import BACKWARD_FLOPS_FACTOR, Workload
from playground.run.spec import Spec, VariantSetup


@dataclass
class BenchmarkCall:
    """What a benchmark times, and what it records about it."""

    workload: Callable[[], None]
    """The variant's own call (what the memory profile measures)."""
    timed: Callable[[], None]
    """What is timed: the workload, synchronised on CUDA, with any injected slow-down."""
    flops: float
    extra_info: dict[str, Any]


def labelled_points(spec: Spec) -> dict[str, VariantSetup]:
    """The quick spec's setups by benchmark label: the name, or the full label
    for a name the spec sweeps."""
    names = [variant.name for variant in spec.variants]
    return {
        (variant.name if names.count(variant.name) == 1 else variant.label): variant
        for variant in spec.variants
    }


def _synchronised(workload: Callable[[], None], device: str) -> Callable[[], None]:
    """CUDA runs asynchronously: a timed call must include waiting for its kernels."""
    if device != "cuda":
        return workload

    def synchronised() -> None:
        workload()
        torch.cuda.synchronize()

    return synchronised


def build_call(
    spec: Spec, point: VariantSetup, label: str, device: str, seq_len: int, pass_name: str
) -> BenchmarkCall:
    """The benchmark `label-n{seq_len}-{pass_name}`, warmed up once. The variant's refusal
    of this size (UnsupportedFeature) comes out of the warm-up, before anything is timed."""
    torch.manual_seed(spec.seed)
    module = (
        default_registry()
        .build(point.name, spec.d_model, spec.num_heads, **point.options)
        .to(device, spec.torch_dtype)
    )
    generator = torch.Generator().manual_seed(spec.seed)
    tokens = torch.randn(spec.batch_size, seq_len, spec.d_model, generator=generator)
    workload = Workload(module, tokens.to(device, spec.torch_dtype), pass_name)
    workload()
    flops = spec.batch_size * module.count_flops(seq_len, seq_len)
    if pass_name == "forward_backward":
        flops *= BACKWARD_FLOPS_FACTOR
    extra_info: dict[str, Any] = dict(
        variant=point.name,
        options=point.options,
        seq_len=seq_len,
        pass_name=pass_name,
        batch_size=spec.batch_size,
        d_model=spec.d_model,
        num_heads=spec.num_heads,
        dtype=spec.dtype,
        device=device,
        threads=torch.get_num_threads(),
        flops=flops,
    )
    timed = _synchronised(workload, device)
    slowdowns = injected_slowdowns()
    factor = slowdowns.get(f"{label}-n{seq_len}-{pass_name}", slowdowns.get(label))
    if factor is not None:
        timed, extra_info["injected_slowdown"] = slowed_down(timed, factor)
    return BenchmarkCall(workload, timed, flops, extra_info)
