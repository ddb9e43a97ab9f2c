"""Forward-pass cost of variants at growing sequence lengths, in one process:

    python -m playground.bench --variants vanilla,longformer --seq-lens 2048,4096,8192,16384

For each (variant, n): median forward time, efficiency (useful FLOP/s from the variant's
own `flops()`, projections included, ÷ the FLOP/s of a large matmul measured at start),
and peak memory above the inputs; then the fitted log-log exponents of time and memory
over n. Batch 1 and fp32 by default, under `torch.no_grad()`, on `--threads N` torch
threads (default: torch.get_num_threads()), the GEMM included.
"""

from __future__ import annotations

import argparse
import tomllib
from dataclasses import dataclass

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from playground.errors import PlaygroundError, UnsupportedFeature
from playground.measure import (
    fit_exponent,
    gemm_flops_per_second,
    peak_memory_bytes,
    resolve_threads,
    time_call,
)
from playground.registry import default_registry


@dataclass(frozen=True)
class ForwardCost:
    variant: str
    seq_len: int
    time_s: float
    time_iqr_s: float
    flops: float
    efficiency: float
    peak_memory_bytes: int
    threads: int


def forward_cost(
    variant: str,
    seq_len: int,
    gemm_flops: float,
    d_model: int = 512,
    num_heads: int = 8,
    batch: int = 1,
    min_run_time: float = 0.5,
    options: dict | None = None,
    threads: int | None = None,
) -> ForwardCost:
    module = default_registry().build(variant, d_model, num_heads, **(options or {})).eval()
    x = torch.randn(batch, seq_len, d_model)
    with torch.no_grad():
        timing = time_call(lambda: module(x), min_run_time, threads)
        memory = peak_memory_bytes(lambda: module(x))
    flops = batch * module.count_flops(seq_len, seq_len)
    return ForwardCost(
        variant,
        seq_len,
        timing.median_s,
        timing.iqr_s,
        flops,
        flops / timing.median_s / gemm_flops,
        memory,
        timing.threads,
    )


def main(argv: list[str] | None = None) -> None:
    try:
        _main(argv)
    except (PlaygroundError, ValueError, tomllib.TOMLDecodeError) as error:
        raise SystemExit(f"error: {error}") from None


def _main(argv: list[str] | None) -> None:
    parser = argparse.ArgumentParser(prog="python -m playground.bench", description=__doc__)
    parser.add_argument("--variants", default=None, help="comma-separated (default: all)")
    parser.add_argument("--seq-lens", default="2048,4096,8192,16384")
    parser.add_argument("--min-run-time", type=float, default=0.5, help="seconds per cell")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="torch threads to time with (default: torch.get_num_threads())",
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="VARIANT.KEY=VALUE",
        help="a variant option, value in TOML syntax, e.g. NAME.OPTION=256 (repeatable)",
    )
    arguments = parser.parse_args(argv)
    options: dict[str, dict] = {}
    for text in arguments.option:
        target, _, value = text.partition("=")
        variant, _, key = target.partition(".")
        options.setdefault(variant, {})[key] = tomllib.loads(f"value = {value}")["value"]
    variants = arguments.variants.split(",") if arguments.variants else default_registry().names()
    seq_lens = [int(n) for n in arguments.seq_lens.split(",")]
    threads = resolve_threads(arguments.threads)
    gemm = gemm_flops_per_second(threads=threads)
    console = Console()
    console.print(f"GEMM fp32: {gemm / 1e9:.1f} GFLOP/s, {threads} threads")
    table = Table(
        "variant", "n", "time ms", "IQR ms", "GFLOP/s", "efficiency", "peak MiB", "status"
    )
    exponents = Table("variant", "time exponent", "memory exponent")
    for variant in variants:
        costs = []
        for n in seq_lens:
            try:
                cost = forward_cost(
                    variant,
                    n,
                    gemm,
                    min_run_time=arguments.min_run_time,
                    options=options.get(variant),
                    threads=threads,
                )
            except UnsupportedFeature as unsupported:  # recorded, and the sweep goes on
                table.add_row(variant, str(n), "-", "-", "-", "-", "-", escape(str(unsupported)))
                continue
            costs.append(cost)
            table.add_row(
                variant,
                str(cost.seq_len),
                f"{cost.time_s * 1e3:.1f}",
                f"{cost.time_iqr_s * 1e3:.1f}",
                f"{cost.flops / cost.time_s / 1e9:.1f}",
                f"{cost.efficiency:.2f}",
                f"{cost.peak_memory_bytes / 2**20:.0f}",
                "ok",
            )
        if len(costs) > 1:
            exponents.add_row(
                variant,
                f"{fit_exponent([c.seq_len for c in costs], [c.time_s for c in costs]):.2f}",
                f"{fit_exponent([c.seq_len for c in costs], [c.peak_memory_bytes for c in costs]):.2f}",
            )
    console.print(table)
    console.print(exponents)


if __name__ == "__main__":
    main()
