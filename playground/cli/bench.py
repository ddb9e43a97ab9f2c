"""Cost of variants at growing sequence lengths, in one process:

    python -m playground.cli.bench --variants vanilla,longformer --seq-lens 2048,4096,8192,16384
    python -m playground.cli.bench --variants alibi --pass forward_backward --option alibi.learnable_slopes=true

For each (variant, n): median time of the pass, efficiency (useful FLOP/s from the
variant's own `flops()`, projections included, ×3 for forward+backward, ÷ the FLOP/s of a
large matmul measured at start), and peak memory above the inputs; then the fitted
log-log exponents of time and memory over n, with their standard error from three or more
lengths (from two, a two-point slope). The pass is the one `playground run` times
(measurer.Workload): forward under `torch.no_grad()`, or forward+backward in train mode.
Batch 1 and fp32, on `--threads N` torch threads (default: torch.get_num_threads()), the
GEMM included. Each time is the median of at least three timed runs (measure.time_call);
the IQR is "-" where there is no spread, and a `flags` column names what makes a number
doubtful (measure.cost_flags: large spread, efficiency above 1, a non-finite flops(), a
busy machine).
"""

from __future__ import annotations

import argparse
import math
import tomllib
from dataclasses import dataclass

import torch
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from playground.errors import PlaygroundError, UnsupportedFeature
from playground.registry import default_registry
from playground.run.instruments import (
    FLAG_MEANINGS,
    cost_flags,
    cpu_count,
    fit_scaling,
    gemm_flops_per_second,
    load_average,
    peak_memory_bytes,
    resolve_threads,
    time_call,
)
from playground.run.measurer import BACKWARD_FLOPS_FACTOR, Workload


@dataclass(frozen=True)
class PassCost:
    """One (variant, n, pass): median time and IQR, useful FLOPs, peak memory."""

    variant: str
    seq_len: int
    time_s: float
    time_iqr_s: float | None
    """None without a spread (fewer than measure.MIN_SPREAD_RUNS timed runs)."""
    flops: float
    peak_memory_bytes: int
    threads: int
    timed_runs: int = 0
    load_average: float | None = None
    """The 1-minute load average when the cell started."""


def pass_cost(
    variant: str,
    seq_len: int,
    d_model: int = 512,
    num_heads: int = 8,
    batch: int = 1,
    min_run_time: float = 0.5,
    options: dict | None = None,
    threads: int | None = None,
    pass_name: str = "forward",
) -> PassCost:
    """Time and profile one variant's pass at one length, as `playground run` does."""
    module = default_registry().build(variant, d_model, num_heads, **(options or {}))
    workload = Workload(module, torch.randn(batch, seq_len, d_model), pass_name)
    load = load_average()
    timing = time_call(workload, min_run_time, threads)
    memory = peak_memory_bytes(workload)
    flops = batch * module.count_flops(seq_len, seq_len)
    if pass_name == "forward_backward":
        flops *= BACKWARD_FLOPS_FACTOR
    return PassCost(
        variant,
        seq_len,
        timing.median_s,
        timing.iqr_s,
        flops,
        memory,
        timing.threads,
        timing.runs,
        load,
    )


def main(argv: list[str] | None = None) -> None:
    try:
        _main(argv)
    except (PlaygroundError, ValueError, tomllib.TOMLDecodeError) as error:
        raise SystemExit(f"error: {error}") from None


def _main(argv: list[str] | None) -> None:
    parser = argparse.ArgumentParser(prog="python -m playground.cli.bench", description=__doc__)
    parser.add_argument("--variants", default=None, help="comma-separated (default: all)")
    parser.add_argument("--seq-lens", default="2048,4096,8192,16384")
    parser.add_argument(
        "--pass",
        dest="pass_name",
        choices=("forward", "forward_backward"),
        default="forward",
        help="what is timed (default: forward)",
    )
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
    # On a shared machine one GEMM measurement can land in a slow moment: it is measured
    # again after the sweep, and efficiency is against the faster, the ceiling this run
    # actually reached.
    gemm = gemm_flops_per_second(threads=threads)
    console = Console()
    results: dict[str, list[PassCost | tuple[int, str]]] = {}
    for variant in variants:
        for n in seq_lens:
            if console.is_terminal:
                console.print(f"{variant} n={n} …", end="\r")
            try:
                cost = pass_cost(
                    variant,
                    n,
                    min_run_time=arguments.min_run_time,
                    options=options.get(variant),
                    threads=threads,
                    pass_name=arguments.pass_name,
                )
            except UnsupportedFeature as unsupported:  # recorded, and the sweep goes on
                results.setdefault(variant, []).append((n, str(unsupported)))
                continue
            results.setdefault(variant, []).append(cost)
    gemm = max(gemm, gemm_flops_per_second(threads=threads))
    console.print(
        f"GEMM fp32: {gemm / 1e9:.1f} GFLOP/s (the faster of before and after), "
        f"{threads} threads; pass: {arguments.pass_name}"
    )
    table = Table(
        "variant",
        "n",
        "time ms",
        "IQR ms",
        "GFLOP/s",
        "efficiency",
        "peak MiB",
        "flags",
        "status",
    )
    exponents = Table("variant", "time exponent", "memory exponent")
    cores = cpu_count()
    shown: set[str] = set()
    for variant, entries in results.items():
        costs = [entry for entry in entries if isinstance(entry, PassCost)]
        for entry in entries:
            if not isinstance(entry, PassCost):
                n, reason = entry
                table.add_row(variant, str(n), "-", "-", "-", "-", "-", "-", escape(reason))
                continue
            finite = math.isfinite(entry.flops)
            efficiency = entry.flops / entry.time_s / gemm if finite else None
            flags = cost_flags(
                time_s=entry.time_s,
                iqr_s=entry.time_iqr_s,
                runs=entry.timed_runs,
                efficiency=efficiency,
                flops=entry.flops,
                load=entry.load_average,
                cores=cores,
            )
            shown.update(flags)
            iqr = entry.time_iqr_s
            table.add_row(
                variant,
                str(entry.seq_len),
                f"{entry.time_s * 1e3:.1f}",
                "-" if iqr is None else f"{iqr * 1e3:.1f}",
                f"{entry.flops / entry.time_s / 1e9:.1f}" if finite else "-",
                "-" if efficiency is None else f"{efficiency:.2f}",
                f"{entry.peak_memory_bytes / 2**20:.0f}",
                escape("; ".join(flags)) or "-",
                "ok",
            )
        if len({cost.seq_len for cost in costs}) > 1:
            sizes = [cost.seq_len for cost in costs]
            exponents.add_row(
                variant,
                fit_scaling(sizes, [cost.time_s for cost in costs]).text(),
                fit_scaling(sizes, [cost.peak_memory_bytes for cost in costs]).text()
                if all(cost.peak_memory_bytes > 0 for cost in costs)
                else "-",
            )
    console.print(table)
    for flag in (flag for flag in FLAG_MEANINGS if flag in shown):
        console.print(f"{flag}: {FLAG_MEANINGS[flag]}", soft_wrap=True)
    console.print(exponents)


if __name__ == "__main__":
    main()
