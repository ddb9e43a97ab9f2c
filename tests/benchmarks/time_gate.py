"""The time gate: a benchmark run against a saved baseline, failing only on a slow-down
that survives the machine's own speed changes and a re-measurement.

    python -m tests.benchmarks.time_gate .benchmarks --candidate run.json [--threshold-percent 30]
                                        a run written with --benchmark-json against the
                                        newest saved run (what `nox -s bench_compare` does)

What is compared. Not a raw median: on a machine shared with other jobs a benchmark's
time moves with the load on the cores, by far more than any threshold worth having.
Each benchmark round is timed right after a fixed reference matmul (reference.py), and
the gate compares `normalised_time` (playground.bench_history): the median over rounds of
the round's time over its reference's, a figure of the code that a uniformly slower
machine leaves unchanged and that pairs each round with the load of its own moment.

What fails. A benchmark whose normalised time exceeds the baseline's by more than the
threshold is only a suspect. The suspects alone are measured again (pytest with their
node ids), up to CONFIRMATIONS times; each re-measurement that comes back under the
threshold clears it. A benchmark fails only if every measurement of it was slower, and
then it is reported in one line: its slow-down, each measurement's, and the raw times.

Exit status: 0 no confirmed slow-down; 1 a confirmed slow-down (each listed); 2 nothing to
compare against or the runs are not comparable (machine, torch, threads or device differ,
or the baseline was saved without the reference timings: save a new one).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from playground.bench_history import SavedRun, load_saved_runs, normalised_time, read_saved_run
from playground.errors import PlaygroundError
from tests.benchmarks.memory_gate import incomparable

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_THRESHOLD_PERCENT = 30
CONFIRMATIONS = 2
"""Re-measurements of a suspect before it fails; one that is not slower clears it."""
REMEASURE_MAX_TIME_S = 2.0
"""A re-measured benchmark runs rounds for this long (the suite's default is 1 s): more
rounds for the median, and a few suspects cost little."""

Remeasure = Callable[[Sequence[dict[str, Any]]], SavedRun]
"""Measures the given benchmarks (saved-run entries) again and returns the new run."""


@dataclass
class Verdict:
    """One benchmark's measurements against its baseline."""

    benchmark: str
    baseline: dict[str, Any]
    measurements: list[dict[str, Any]]
    """The candidate's entry, then each re-measurement's."""

    @property
    def slowdowns(self) -> list[float]:
        """Each measurement's normalised time over the baseline's (1.5 = 50 % slower)."""
        before = normalised_time(self.baseline)
        return [normalised_time(entry) / before for entry in self.measurements]

    @property
    def slowdown(self) -> float:
        """The least slow-down measured: the slow-down every measurement agrees on."""
        return min(self.slowdowns)

    def describe(self, threshold: float) -> str:
        """`+52% in every measurement (normalised time +50%, +55%, +52% against the
        baseline; threshold +30%; fastest round 150.0 ms -> 225.0, 232.5, 228.0 ms)`."""
        verdict = "in every measurement" if self.slowdown > 1 + threshold else "measured again"
        each = ", ".join(f"{s - 1:+.0%}" for s in self.slowdowns)
        raw = ", ".join(f"{entry['stats']['min'] * 1e3:.1f}" for entry in self.measurements)
        return (
            f"{self.benchmark}: {self.slowdown - 1:+.0%} {verdict} (normalised time {each} "
            f"against the baseline; threshold {threshold:+.0%}; fastest round "
            f"{self.baseline['stats']['min'] * 1e3:.1f} ms -> {raw} ms)"
        )


def refusal(baseline: SavedRun, candidate: SavedRun) -> str | None:
    """Why the two runs' times cannot be compared, or None when they can."""
    differences = incomparable(baseline, candidate)
    if differences:
        return f"runs not comparable ({'; '.join(differences)}); save a new baseline with `nox -s bench`"
    for run in (baseline, candidate):
        threads = {entry["extra_info"].get("threads") for entry in run.attention_benchmarks()}
        if len(threads) > 1:
            return f"{run.path} mixes thread counts {sorted(threads, key=str)}; measure it again"
    before, after = _threads(baseline), _threads(candidate)
    if before != after:
        return (
            f"runs timed with different thread counts ({before} -> {after}); set "
            f"PLAYGROUND_BENCH_THREADS={before} or save a new baseline with `nox -s bench`"
        )
    unreferenced = [
        run.path
        for run in (baseline, candidate)
        if any(normalised_time(entry) is None for entry in run.attention_benchmarks())
    ]
    if unreferenced:
        return (
            f"{unreferenced[0]} was saved without the reference timings the gate divides by "
            f"(saved by an older suite, or a smoke run); save a new baseline with `nox -s bench`"
        )
    return None


def _threads(run: SavedRun) -> object:
    benchmarks = run.attention_benchmarks()
    return benchmarks[0]["extra_info"].get("threads") if benchmarks else None


def judge(
    baseline: SavedRun,
    candidate: SavedRun,
    threshold: float,
    remeasure: Remeasure,
    confirmations: int = CONFIRMATIONS,
) -> list[Verdict]:
    """Every benchmark in both runs, with its re-measurements if it was a suspect."""
    before = {entry["name"]: entry for entry in baseline.attention_benchmarks()}
    after = {entry["name"]: entry for entry in candidate.attention_benchmarks()}
    verdicts = [
        Verdict(name, before[name], [after[name]]) for name in sorted(before.keys() & after.keys())
    ]
    for _ in range(confirmations):
        suspects = [verdict for verdict in verdicts if verdict.slowdown > 1 + threshold]
        if not suspects:
            break
        again = {
            entry["name"]: entry
            for entry in remeasure([v.measurements[0] for v in suspects]).attention_benchmarks()
        }
        for verdict in suspects:
            if verdict.benchmark not in again:
                raise PlaygroundError(
                    f"the re-measurement did not run {verdict.benchmark}; run "
                    f"`nox -s bench_compare` again"
                )
            verdict.measurements.append(again[verdict.benchmark])
    return verdicts


def remeasure_with_pytest(
    entries: Sequence[dict[str, Any]], max_time_s: float = REMEASURE_MAX_TIME_S
) -> SavedRun:
    """Run the given benchmarks again, alone, the way bench_compare ran them."""
    seq_lens = sorted({int(entry["extra_info"]["seq_len"]) for entry in entries})
    with tempfile.TemporaryDirectory(prefix="time-gate-") as directory:
        out = Path(directory) / "remeasured.json"
        command = [
            sys.executable,
            "-m",
            "pytest",
            *(entry["fullname"] for entry in entries),
            "--bench-seq-lens",
            ",".join(map(str, seq_lens)),
            "--benchmark-enable",
            f"--benchmark-max-time={max_time_s}",
            f"--benchmark-json={out}",
            "-q",
            "-p",
            "no:cacheprovider",
        ]
        completed = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, env=os.environ
        )
        if completed.returncode != 0 or not out.is_file():
            raise PlaygroundError(
                f"re-measuring the suspects failed (exit {completed.returncode}):\n"
                f"{completed.stdout[-2000:]}{completed.stderr[-2000:]}"
            )
        return read_saved_run(out)


def main(argv: Sequence[str] | None = None, remeasure: Remeasure = remeasure_with_pytest) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("benchmark_dir", nargs="?", default=".benchmarks", help="storage")
    parser.add_argument(
        "--candidate",
        metavar="JSON",
        required=True,
        help="a run written with --benchmark-json, checked against the newest saved run",
    )
    parser.add_argument(
        "--threshold-percent",
        type=float,
        default=DEFAULT_THRESHOLD_PERCENT,
        help="fail on a confirmed slow-down above this (default %(default)s)",
    )
    arguments = parser.parse_args(argv)
    threshold = arguments.threshold_percent / 100
    try:
        saved = load_saved_runs(arguments.benchmark_dir)
        if not saved:
            raise PlaygroundError("no saved benchmark runs: run `nox -s bench` first")
        baseline, candidate = saved[-1], read_saved_run(Path(arguments.candidate))
        print(f"time gate: {candidate.path} against {baseline.path}")
        reason = refusal(baseline, candidate)
        if reason:
            raise PlaygroundError(reason)
        verdicts = judge(baseline, candidate, threshold, remeasure)
    except PlaygroundError as error:
        print(f"time gate: {error}", file=sys.stderr)
        return 2
    if not verdicts:
        print(
            "time gate: the two runs share no benchmark (different sizes?); run both with "
            "the same settings (`nox -s bench`, `nox -s bench_compare`)",
            file=sys.stderr,
        )
        return 2
    slower = [verdict for verdict in verdicts if verdict.slowdown > 1 + threshold]
    cleared = [v for v in verdicts if len(v.measurements) > 1 and v not in slower]
    for verdict in cleared:
        print(f"  cleared  {verdict.describe(threshold)}")
    for verdict in slower:
        print(f"  SLOWER   {verdict.describe(threshold)}")
    if slower:
        print(
            f"time gate: FAILED, {len(slower)} of {len(verdicts)} benchmarks slower by more "
            f"than {threshold:.0%} in every measurement",
            file=sys.stderr,
        )
        return 1
    print(
        f"time gate: passed, no confirmed slow-down above {threshold:.0%} in {len(verdicts)} "
        f"benchmarks ({len(cleared)} suspects cleared by re-measuring)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
