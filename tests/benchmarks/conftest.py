"""The pytest-benchmark suite's settings: which sizes, which variants, what to record.

Sizes. With nothing set the suite is a smoke test: one short sequence, each benchmark run
once, so the README's `python -m pytest -q` stays fast. Real sizes come from
`--bench-seq-lens 512,1024,2048` (registered here, so it works when tests/benchmarks is
named on the command line: `pytest tests/benchmarks --bench-seq-lens ...`) or from the
`PLAYGROUND_BENCH_SEQ_LENS` environment variable (works from anywhere); the option wins.
`PLAYGROUND_BENCH_DEVICE=cuda` times on the GPU.

Threads. The suite times with `PLAYGROUND_BENCH_THREADS` CPU threads (default: torch's own
count, `torch.get_num_threads()`, which is what `playground run` times with), set once when
the suite loads and recorded in the saved machine info and every benchmark's `extra_info`:
the gates refuse to compare runs timed with different counts.

Everything else (variants and their options, d_model, heads, batch, dtype) is the quick
spec's (`experiments/quick.toml`), so a benchmark here and a `playground compare` cell are
the same workload, timed by two different harnesses.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from playground.errors import PlaygroundError
from playground.gates.calls import labelled_points
from playground.gates.slowdown import injected_slowdowns
from playground.registry import default_registry
from playground.run.environment import environment
from playground.run.instruments import gemm_flops_per_second
from playground.run.spec import Spec, VariantSetup
from playground.run.spec_loading import load_spec

SEQ_LENS_ENV = "PLAYGROUND_BENCH_SEQ_LENS"
DEVICE_ENV = "PLAYGROUND_BENCH_DEVICE"
THREADS_ENV = "PLAYGROUND_BENCH_THREADS"
SMOKE_SEQ_LENS = (32,)
PASSES = ("forward", "forward_backward")


@dataclass(frozen=True)
class BenchSettings:
    """What every benchmark of a session shares."""

    spec: Spec
    """The quick spec: variants and their options, shape, dtype, seed."""
    device: str
    smoke: bool
    """No sizes were asked for: run each benchmark once to prove it works."""

    def variant(self, label: str) -> VariantSetup:
        """The spec's setup that `pytest_generate_tests` named `label`."""
        return labelled_points(self.spec)[label]


def _parse_seq_lens(text: str, where: str) -> tuple[int, ...]:
    try:
        seq_lens = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        seq_lens = ()
    if not seq_lens or min(seq_lens) < 1:
        raise pytest.UsageError(
            f"{where} takes comma-separated positive integers, like 512,1024,2048; got {text!r}"
        )
    return seq_lens


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--bench-seq-lens",
        metavar="N,M",
        help=f"sequence lengths of the attention benchmarks (default: ${SEQ_LENS_ENV}, "
        f"else a smoke test at n={SMOKE_SEQ_LENS[0]})",
    )
    parser.addoption(
        "--bench-time-only",
        action="store_true",
        help="time the benchmarks but skip their peak-memory profiling (faster, when only "
        "the times are wanted; the memory gate then has nothing to compare)",
    )


def _seq_lens(config: pytest.Config) -> tuple[tuple[int, ...], bool]:
    """(lengths, smoke): the option, else the environment variable, else the smoke size."""
    option = config.getoption("bench_seq_lens", default=None)
    if option:
        return _parse_seq_lens(option, "--bench-seq-lens"), False
    if os.environ.get(SEQ_LENS_ENV):
        return _parse_seq_lens(os.environ[SEQ_LENS_ENV], SEQ_LENS_ENV), False
    return SMOKE_SEQ_LENS, True


def bench_threads() -> int:
    """The CPU thread count to time with: $PLAYGROUND_BENCH_THREADS, else torch's own."""
    text = os.environ.get(THREADS_ENV, "").strip()
    if not text:
        return torch.get_num_threads()
    if not text.isdigit() or int(text) < 1:
        raise pytest.UsageError(
            f"{THREADS_ENV} takes a positive integer (the CPU threads to time with), "
            f"like 2; got {text!r}. Unset it to use torch's default."
        )
    return int(text)


def check_injected_slowdowns() -> None:
    """$PLAYGROUND_BENCH_INJECT_SLOWDOWN's refusal (slowdown.py raises PlaygroundError,
    importable without pytest) as pytest's usage error, before anything is timed."""
    try:
        injected_slowdowns()
    except PlaygroundError as error:
        raise pytest.UsageError(str(error)) from None


def pytest_configure(config: pytest.Config) -> None:
    # Once, before anything is timed or the machine info is read.
    torch.set_num_threads(bench_threads())
    check_injected_slowdowns()


def _device() -> str:
    device = os.environ.get(DEVICE_ENV, "cpu")
    if device not in ("cpu", "cuda"):
        raise pytest.UsageError(f"{DEVICE_ENV} must be cpu or cuda; got {device!r}")
    return device


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize `variant, seq_len, pass_name` (plain values, so the saved JSON's
    `params` read cleanly) over the quick spec's variants, the lengths and the passes;
    a decoding benchmark's `context_length` over the lengths."""
    seq_lens, _ = _seq_lens(metafunc.config)
    if "context_length" in metafunc.fixturenames:
        metafunc.parametrize("context_length", seq_lens, ids=[f"n{n}" for n in seq_lens])
    if "variant" not in metafunc.fixturenames:
        return
    labels = labelled_points(load_spec("quick", default_registry()))
    combinations = [
        (label, seq_len, pass_name)
        for label in labels
        for seq_len in seq_lens
        for pass_name in PASSES
    ]
    metafunc.parametrize(
        ("variant", "seq_len", "pass_name"),
        combinations,
        ids=[f"{label}-n{seq_len}-{pass_name}" for label, seq_len, pass_name in combinations],
    )


@pytest.fixture(scope="session")
def bench_settings(pytestconfig: pytest.Config) -> BenchSettings:
    _, smoke = _seq_lens(pytestconfig)
    return BenchSettings(load_spec("quick", default_registry()), _device(), smoke)


@pytest.fixture(scope="session")
def gemm_flops_per_s(bench_settings: BenchSettings) -> float:
    """The matmul ceiling on the benchmarks' device and dtype, measured once per session
    (ask for it only where a timing exists to divide by it)."""
    return gemm_flops_per_second(bench_settings.device, bench_settings.spec.torch_dtype)


def pytest_benchmark_update_machine_info(
    config: pytest.Config, machine_info: dict[str, Any]
) -> None:
    """What produced the numbers, beside pytest-benchmark's CPU and Python details:
    torch version, threads, device (a change in any makes times incomparable)."""
    env = environment(_device())
    machine_info.update(
        torch_version=env["torch_version"],
        torch_threads=env["threads"],
        device=env["device"],
        device_name=env["device_name"],
        cuda_version=env["cuda_version"],
        playground_version=env["playground_version"],
    )
