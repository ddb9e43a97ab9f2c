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

What fails. The load does not slow every workload alike (a small matmul far more than a
long attention call), so against a baseline saved under another load the normalised time
still moves, and a benchmark more than the threshold slower is only a suspect. The
suspects alone are measured again, on the baseline's code (its commit, exported from git)
and on the working tree one right after the other (SideBySide), up to CONFIRMATIONS
times; such a measurement counts as slower only when both the normalised time and the
fastest round are, and one that is not clears the suspect. A benchmark fails only if
every measurement of it was slower, and is reported in one line: the slow-down all its
measurements agree on and each one's figures. A baseline saved from
uncommitted code cannot be measured again: then the working tree is re-measured alone
against the saved figures, which a change of load can fool (the gate says so).

Exit status: 0 no confirmed slow-down; 1 a confirmed slow-down (each listed); 2 nothing to
compare against or the runs are not comparable (machine, torch, threads or device differ,
or the baseline was saved without the reference timings: save a new one).
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from playground.bench_history import SavedRun, load_saved_runs, normalised_time, read_saved_run
from playground.errors import PlaygroundError
from tests.benchmarks.memory_gate import incomparable
from tests.benchmarks.slowdown import SLOWDOWN_ENV

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_THRESHOLD_PERCENT = 30
CONFIRMATIONS = 2
"""Re-measurements of a suspect before it fails; one that is not slower clears it."""
REMEASURE_MAX_TIME_S = 2.0
"""A re-measured benchmark runs rounds for this long (the suite's default is 1 s): more
rounds for the median, and a few suspects cost little."""

Remeasure = Callable[[Sequence[dict[str, Any]]], tuple[SavedRun | None, SavedRun]]
"""Measures the given benchmarks (saved-run entries) again: on the baseline's code (None
when that code cannot be had) and on the candidate's, one right after the other."""


@dataclass(frozen=True)
class Measurement:
    """One benchmark measured on the baseline's code and on the candidate's."""

    baseline: dict[str, Any]
    candidate: dict[str, Any]
    side_by_side: bool
    """Both measured in this session, one right after the other (not the saved baseline)."""

    @property
    def normalised(self) -> float:
        """Candidate's normalised time over the baseline's (1.5 = 50 % slower)."""
        return normalised_time(self.candidate) / normalised_time(self.baseline)

    @property
    def fastest(self) -> float:
        """Candidate's fastest round over the baseline's."""
        return self.candidate["stats"]["min"] / self.baseline["stats"]["min"]

    @property
    def slowdown(self) -> float:
        """What this measurement says. Against the saved baseline, the normalised time
        (a raw time there mostly measures the change of load). Side by side, where both
        codes met nearly the same load, the lesser of the normalised time and the fastest
        round: the load fools each now and then, rarely both at once (the README has the
        measurements)."""
        if not self.side_by_side:
            return self.normalised
        return min(self.normalised, self.fastest)

    def describe(self) -> str:
        if not self.side_by_side:
            return f"{self.normalised - 1:+.0%}"
        return f"{self.normalised - 1:+.0%} / {self.fastest - 1:+.0%}"


@dataclass
class Verdict:
    """One benchmark's measurements: against the saved baseline, then any re-measurements."""

    benchmark: str
    measurements: list[Measurement]

    @property
    def slowdown(self) -> float:
        """The least slow-down measured: the slow-down every measurement agrees on."""
        return min(measurement.slowdown for measurement in self.measurements)

    def describe(self, threshold: float) -> str:
        """`+45% in every measurement (against the saved baseline: normalised time +50%;
        side by side, normalised time / fastest round: +48% / +45%, +52% / +47%;
        threshold +30%)`."""
        verdict = "in every measurement" if self.slowdown > 1 + threshold else "measured again"
        first, *again = self.measurements
        parts = [f"against the saved baseline: normalised time {first.describe()}"]
        alone = [m.describe() for m in again if not m.side_by_side]
        if alone:
            parts.append(f"working tree re-measured against it: {', '.join(alone)}")
        paired = [m.describe() for m in again if m.side_by_side]
        if paired:
            parts.append(f"side by side, normalised time / fastest round: {', '.join(paired)}")
        return (
            f"{self.benchmark}: {self.slowdown - 1:+.0%} {verdict} "
            f"({'; '.join(parts)}; threshold {threshold:+.0%})"
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
        Verdict(name, [Measurement(before[name], after[name], side_by_side=False)])
        for name in sorted(before.keys() & after.keys())
    ]
    for _ in range(confirmations):
        suspects = [verdict for verdict in verdicts if verdict.slowdown > 1 + threshold]
        if not suspects:
            break
        old_code, new_code = remeasure([after[verdict.benchmark] for verdict in suspects])
        again_before = _by_name(old_code) if old_code else before
        again_after = _by_name(new_code)
        for verdict in suspects:
            name = verdict.benchmark
            if name not in again_after or name not in again_before:
                raise PlaygroundError(
                    f"the re-measurement did not run {name}; run `nox -s bench_compare` again"
                )
            verdict.measurements.append(
                Measurement(again_before[name], again_after[name], side_by_side=bool(old_code))
            )
    return verdicts


def _by_name(run: SavedRun) -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in run.attention_benchmarks()}


def measure_with_pytest(
    entries: Sequence[dict[str, Any]],
    code: Path = ROOT,
    env: dict[str, str] | None = None,
    max_time_s: float = REMEASURE_MAX_TIME_S,
) -> SavedRun:
    """Run the given benchmarks again, alone, on the code in `code` (a checkout: pytest
    runs there, so `playground` and the plugins are imported from it)."""
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
            *_time_only(code),
            "--benchmark-enable",
            f"--benchmark-max-time={max_time_s}",
            f"--benchmark-json={out}",
            "-q",
            "-p",
            "no:cacheprovider",
        ]
        completed = subprocess.run(
            command, cwd=code, capture_output=True, text=True, env=env or dict(os.environ)
        )
        if completed.returncode != 0 or not out.is_file():
            raise PlaygroundError(
                f"re-measuring the suspects in {code} failed (exit {completed.returncode}):\n"
                f"{completed.stdout[-2000:]}{completed.stderr[-2000:]}"
            )
        return read_saved_run(out)


def _time_only(code: Path) -> list[str]:
    """--bench-time-only where the checkout's suite has it (a baseline's may predate it)."""
    conftest = code / "tests" / "benchmarks" / "conftest.py"
    return ["--bench-time-only"] if "--bench-time-only" in conftest.read_text() else []


class SideBySide:
    """Re-measures suspects on the baseline's code (its commit, exported from git to a
    temporary folder) and on the working tree, one right after the other, taking turns
    at going first: both meet the same load, which no normalisation fully divides out.
    When the baseline's code cannot be had (it was saved from uncommitted changes, or
    there is no git), the working tree is re-measured alone against the saved baseline."""

    def __init__(self, baseline: SavedRun, root: Path = ROOT) -> None:
        self.baseline = baseline
        self.root = root
        self.turn = 0
        self.folder = tempfile.TemporaryDirectory(prefix="time-gate-baseline-")
        self.code: Path | None = None
        self.note = ""

    def __enter__(self) -> SideBySide:
        return self

    def __exit__(self, *_: object) -> None:
        self.folder.cleanup()

    def _baseline_code(self) -> Path | None:
        if self.code is not None or self.note:
            return self.code
        commit = self.baseline.clean_commit
        if commit is None:
            self.note = (
                f"the baseline was saved from uncommitted code ({self.baseline.commit}), so "
                f"suspects are re-measured on the working tree alone against it; commit before "
                f"`nox -s bench` to have them re-measured side by side with the baseline's code"
            )
            return None
        archive = subprocess.run(
            ["git", "-C", str(self.root), "archive", "--format=tar", commit], capture_output=True
        )
        if archive.returncode != 0:
            self.note = (
                f"git could not export the baseline's commit {commit[:7]} "
                f"({archive.stderr.decode(errors='replace').strip()}), so suspects are "
                f"re-measured on the working tree alone against the saved baseline"
            )
            return None
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(self.folder.name, filter="data")
        self.code = Path(self.folder.name)
        return self.code

    def __call__(self, entries: Sequence[dict[str, Any]]) -> tuple[SavedRun | None, SavedRun]:
        code = self._baseline_code()
        if code is None:
            return None, measure_with_pytest(entries, self.root)
        # The injected slow-down stands for a change in the candidate's code only.
        baseline_env = {k: v for k, v in os.environ.items() if k != SLOWDOWN_ENV}
        self.turn += 1
        if self.turn % 2:
            old = measure_with_pytest(entries, code, baseline_env)
            return old, measure_with_pytest(entries, self.root)
        new = measure_with_pytest(entries, self.root)
        return measure_with_pytest(entries, code, baseline_env), new


def main(argv: Sequence[str] | None = None, remeasure: Remeasure | None = None) -> int:
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
        with SideBySide(baseline) as side_by_side:
            verdicts = judge(baseline, candidate, threshold, remeasure or side_by_side)
        if side_by_side.note:
            print(f"time gate: {side_by_side.note}")
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
