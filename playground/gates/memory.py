"""The exact gate on peak memory: a benchmark run against a saved baseline, failing if
any benchmark's `peak_memory_bytes` grew by even one byte.

    python -m playground.gates.memory [.benchmarks]             newest saved run
                                                                against the one before
    python -m playground.gates.memory .benchmarks --candidate run.json
                                        a run written with --benchmark-json against the
                                        newest saved run (what `nox -s bench_compare` does)

Peak memory on CPU is the allocator's own record of the bytes a call holds at once, so
it is the same on every run of the same code, torch and thread count: any growth is a
change in the code, never noise. Saved runs are paired only within one storage folder
(one pytest-benchmark machine id), and any two runs only when OS, architecture, torch
version, threads and device agree.

Exit status: 0 nothing grew; 1 something grew (each listed); 2 nothing to compare against
(fewer than two saved runs, a baseline or candidate with no measured benchmark, or no
benchmark in common: the gate never passes without having compared something) or the runs
are not comparable.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from playground.errors import PlaygroundError
from playground.report.bench_history import (
    SavedRun,
    load_saved_runs,
    newest_baseline,
    read_saved_run,
)

COMPARABLE = ("system", "machine", "torch_version", "torch_threads", "device", "device_name")
"""machine_info keys that must agree: each changes what the allocator is asked for."""


@dataclass(frozen=True)
class Change:
    benchmark: str
    before: int
    after: int

    def describe(self) -> str:
        delta = self.after - self.before
        return (
            f"{self.benchmark}: {self.before:,} -> {self.after:,} bytes "
            f"({delta:+,}, {delta / self.before:+.1%})"
        )


def peak_memory(run: SavedRun) -> dict[str, int]:
    """Benchmark name -> saved peak memory in bytes, for every benchmark that has one."""
    return {
        benchmark["name"]: int(benchmark["extra_info"]["peak_memory_bytes"])
        for benchmark in run.measured_benchmarks()
        if "peak_memory_bytes" in benchmark["extra_info"]
    }


def changes(previous: SavedRun, latest: SavedRun) -> list[Change]:
    """Every benchmark present in both runs whose peak memory differs."""
    before, after = peak_memory(previous), peak_memory(latest)
    return [
        Change(name, before[name], after[name])
        for name in sorted(before.keys() & after.keys())
        if before[name] != after[name]
    ]


def incomparable(previous: SavedRun, latest: SavedRun) -> list[str]:
    """The COMPARABLE machine_info keys on which the two runs differ."""
    return [
        f"{key} {previous.machine_info.get(key)!r} -> {latest.machine_info.get(key)!r}"
        for key in COMPARABLE
        if previous.machine_info.get(key) != latest.machine_info.get(key)
    ]


def baseline_and_latest(runs: Sequence[SavedRun]) -> tuple[SavedRun, SavedRun]:
    """The newest run and the one saved before it in the same storage folder."""
    if not runs:
        raise PlaygroundError("no saved benchmark runs: run `nox -s bench` first")
    latest = runs[-1]
    same_machine = [run for run in runs if run.path.parent == latest.path.parent]
    if len(same_machine) < 2:
        raise PlaygroundError(
            f"only one saved run in {latest.path.parent}, so there is no baseline: run "
            f"`nox -s bench` on the baseline code first, then `nox -s bench_compare`"
        )
    return same_machine[-2], latest


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("benchmark_dir", nargs="?", default=".benchmarks", help="storage")
    parser.add_argument(
        "--candidate",
        metavar="JSON",
        help="a run written with --benchmark-json, checked against the newest saved run",
    )
    arguments = parser.parse_args(argv)
    try:
        if arguments.candidate:
            previous = newest_baseline(arguments.benchmark_dir)
            latest = read_saved_run(Path(arguments.candidate))
            latest.require_measured(
                "candidate run",
                "measure the working tree with `nox -s bench_compare`, which runs the "
                "benchmarks without pytest-xdist",
            )
        else:
            previous, latest = baseline_and_latest(load_saved_runs(arguments.benchmark_dir))
            for role, run in (("baseline", previous), ("newest saved run", latest)):
                run.require_measured(role, "save a run with `nox -s bench`")
    except PlaygroundError as error:
        print(f"memory gate: {error}", file=sys.stderr)
        return 2
    print(f"memory gate: {latest.path} against {previous.path}")
    differences = incomparable(previous, latest)
    if differences:
        print(
            f"memory gate: runs not comparable ({'; '.join(differences)}); save a new "
            f"baseline with `nox -s bench`",
            file=sys.stderr,
        )
        return 2
    compared = len(peak_memory(previous).keys() & peak_memory(latest).keys())
    if not compared:
        print(
            "memory gate: the two runs share no benchmark with a peak memory (different "
            "sizes?); run both with the same settings (`nox -s bench`, `nox -s bench_compare`)",
            file=sys.stderr,
        )
        return 2
    found = changes(previous, latest)
    grown = [change for change in found if change.after > change.before]
    for change in found:
        print(f"  {'GREW' if change in grown else 'shrank'}  {change.describe()}")
    if grown:
        print(f"memory gate: FAILED, {len(grown)} of {compared} benchmarks grew", file=sys.stderr)
        return 1
    print(f"memory gate: passed, no growth in {compared} benchmarks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
