"""The time gate: the working tree's benchmarks against the newest saved run's commit,
failing only on a slow-down measured under the same load on both codes.

    python -m playground.gates.time .benchmarks --candidate run.json [--threshold-percent 30]
                                        the benchmarks of a run written with --benchmark-json
                                        against the newest saved run (what `nox -s
                                        bench_compare` does)

What is compared. Not two runs' medians: on a machine shared with other jobs a
benchmark's time follows the load on the cores, which moves by more than any threshold
worth having between one run and the next. The saved baseline names a commit; every
benchmark the two runs share is timed again in paired rounds (paired.py) on that commit's
code (exported from git) and on the working tree, taking turns a fraction of a second
apart, and the gate reads the median of their ratios over blocks of rounds. A benchmark
whose median's confidence interval holds the threshold is measured again, up to
MAX_MEASUREMENTS times, and judged on the median of all its blocks; one more than the
threshold slower fails, in one
line: `SLOWER   test_attention[longformer-n1024-forward]: +48% (median of 15 blocks ...)`.

The candidate run (the suite's run of the working tree) names the benchmarks, and gives
the memory gate its figures; its times are not compared with the saved ones.

Exit status: 0 no slow-down; 1 a slow-down (each listed); 2 nothing to compare against (no
saved baseline, or a baseline or candidate with no measured benchmark: the gate never
passes without having timed something), or the runs are not comparable (machine, torch,
threads or device differ), or the baseline's code cannot be timed again (saved from
uncommitted code, or from a commit without this package's paired rounds,
playground/gates/paired.py, which its worker runs): each says what to do.
"""

from __future__ import annotations

import argparse
import io
import math
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from playground.errors import PlaygroundError
from playground.gates.memory import incomparable
from playground.gates.paired import WORKER_FILE, PairedMeasurer, PairedRounds
from playground.report.bench_history import SavedRun, newest_baseline, read_saved_run

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_THRESHOLD_PERCENT = 30
MAX_MEASUREMENTS = 4
"""A benchmark is measured again, up to this many times in all, while the 95 % confidence
interval of its blocks' median holds the threshold: a burst of load on a few rounds can
push a median across the threshold either way, and more blocks pull it back to what the
code does. Judged, in the end, on the median of all its blocks."""
CONFIDENCE_Z = 1.96

CANDIDATE_REMEDY = (
    "measure the working tree with `nox -s bench_compare`, which runs the benchmarks "
    "without pytest-xdist"
)

Measure = Callable[[dict[str, Any]], "PairedRounds | str"]
"""Times one saved benchmark in paired rounds on both codes, or says why it cannot."""


def refusal(baseline: SavedRun, candidate: SavedRun) -> str | None:
    """Why the two runs' times cannot be compared, or None when they can."""
    differences = incomparable(baseline, candidate)
    if differences:
        return (
            f"runs not comparable ({'; '.join(differences)}); save a new baseline with "
            f"`nox -s bench`"
        )
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
    if not isinstance(before, int) or before < 1:
        return (
            f"{baseline.path} does not record the threads it was timed with; save a new "
            f"baseline with `nox -s bench`"
        )
    return None


def _threads(run: SavedRun) -> Any:
    benchmarks = run.attention_benchmarks()
    return benchmarks[0]["extra_info"].get("threads") if benchmarks else None


def shared_benchmarks(baseline: SavedRun, candidate: SavedRun) -> list[dict[str, Any]]:
    """The candidate's entries of the benchmarks both runs have, by name."""
    before = {entry["name"] for entry in baseline.measured_benchmarks()}
    after = {entry["name"]: entry for entry in candidate.measured_benchmarks()}
    return [after[name] for name in sorted(before & after.keys())]


def export_commit(commit: str | None, saved_as: str, folder: Path, root: Path = ROOT) -> Path:
    """The baseline's code, exported from git into `folder`; PlaygroundError saying what
    to do when it cannot be had."""
    if commit is None:
        raise PlaygroundError(
            f"the baseline was saved from uncommitted code ({saved_as}), which cannot be "
            f"timed again; commit, then save a new baseline with `nox -s bench`"
        )
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", "--format=tar", commit], capture_output=True
    )
    if archive.returncode != 0:
        raise PlaygroundError(
            f"git could not export the baseline's commit {commit[:7]} "
            f"({archive.stderr.decode(errors='replace').strip()}); save a new baseline "
            f"with `nox -s bench` in this checkout"
        )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(folder, filter="data")
    # The worker runs the baseline's own copy of this module: a commit from before the
    # gates lived there (or before the paired rounds) has none, and cannot be timed.
    if not (folder / WORKER_FILE).is_file():
        raise PlaygroundError(
            f"the baseline's commit {commit[:7]} predates the paired rounds this gate times "
            f"with (it has no {WORKER_FILE.as_posix()}); save a new baseline with "
            f"`nox -s bench`"
        )
    return folder


@dataclass
class Verdict:
    """A benchmark's paired measurements: one, or more while it is in doubt."""

    benchmark: str
    measurements: list[PairedRounds]

    @property
    def blocks(self) -> list[float]:
        return sorted(block for rounds in self.measurements for block in rounds.blocks)

    @property
    def slowdown(self) -> float:
        """The median of every block of every measurement."""
        return statistics.median(self.blocks)

    @property
    def interval(self) -> tuple[float, float]:
        """A distribution-free 95 % confidence interval of that median: the blocks of rank
        (n ∓ z·√n) / 2 (with 5 blocks, the least and the greatest)."""
        blocks = self.blocks
        n = len(blocks)
        k = max(0, math.floor((n - CONFIDENCE_Z * math.sqrt(n)) / 2))
        return blocks[k], blocks[n - 1 - k]

    def settled(self, threshold: float) -> bool:
        """True when the interval lies on one side of the threshold."""
        low, high = self.interval
        return high <= 1 + threshold or low > 1 + threshold

    def describe(self) -> str:
        """`+48% (9 blocks, 1.50x injected)`, or for several measurements
        `+45% (median of 15 blocks in 3 measurements: +52%, +33%, +47%)`."""
        if len(self.measurements) == 1:
            return self.measurements[0].describe()
        blocks = sum(len(rounds.blocks) for rounds in self.measurements)
        each = ", ".join(f"{rounds.slowdown - 1:+.0%}" for rounds in self.measurements)
        injected = self.measurements[0].injected
        return (
            f"{self.slowdown - 1:+.0%} (median of {blocks} blocks in {len(self.measurements)} "
            f"measurements: {each}" + (f"; {injected:.2f}x injected)" if injected else ")")
        )


def judge(
    entries: Sequence[dict[str, Any]],
    threshold: float,
    measure: Measure,
    max_measurements: int = MAX_MEASUREMENTS,
) -> tuple[list[Verdict], list[Verdict], list[str]]:
    """(passed, slower, skipped): every benchmark timed in paired rounds, again while the
    confidence interval of its blocks' median holds the threshold (up to
    `max_measurements` in all), one line printed per benchmark as it is judged."""
    passed: list[Verdict] = []
    slower: list[Verdict] = []
    skipped: list[str] = []
    for number, entry in enumerate(entries, 1):
        prefix = f"  [{number}/{len(entries)}]"
        measured = measure(entry)
        if isinstance(measured, str):
            skipped.append(f"{entry['name']}: {measured}")
            print(f"{prefix} skipped  {entry['name']}: {measured}", flush=True)
            continue
        verdict = Verdict(entry["name"], [measured])
        while not verdict.settled(threshold) and len(verdict.measurements) < max_measurements:
            again = measure(entry)
            if isinstance(again, str):
                raise PlaygroundError(f"timing {entry['name']} again failed: {again}")
            verdict.measurements.append(again)
        if verdict.slowdown > 1 + threshold:
            slower.append(verdict)
            print(f"{prefix} SLOWER   {verdict.benchmark}: {verdict.describe()}", flush=True)
        else:
            passed.append(verdict)
            print(f"{prefix} ok       {verdict.benchmark}: {verdict.describe()}", flush=True)
    return passed, slower, skipped


def main(argv: Sequence[str] | None = None, measure: Measure | None = None) -> int:
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
        help="fail on a slow-down above this (default %(default)s)",
    )
    arguments = parser.parse_args(argv)
    threshold = arguments.threshold_percent / 100
    try:
        baseline = newest_baseline(arguments.benchmark_dir)
        candidate = read_saved_run(Path(arguments.candidate))
        candidate.require_measured("candidate run", CANDIDATE_REMEDY)
        reason = refusal(baseline, candidate)
        if reason:
            raise PlaygroundError(reason)
        entries = shared_benchmarks(baseline, candidate)
        if not entries:
            raise PlaygroundError(
                "the two runs share no benchmark (different sizes?); run both with the same "
                "settings (`nox -s bench`, `nox -s bench_compare`)"
            )
        print(
            f"time gate: {len(entries)} benchmarks in paired rounds, the baseline's commit "
            f"{baseline.commit} ({baseline.path.name}) against the working tree",
            flush=True,
        )
        if measure is not None:
            passed, slower, skipped = judge(entries, threshold, measure)
        else:
            with tempfile.TemporaryDirectory(prefix="time-gate-baseline-") as folder:
                code = export_commit(baseline.clean_commit, baseline.commit, Path(folder))
                device = str(baseline.machine_info.get("device") or "cpu").split(":")[0]
                with PairedMeasurer(code, ROOT, _threads(baseline), device) as paired:
                    passed, slower, skipped = judge(entries, threshold, paired.measure)
    except PlaygroundError as error:
        print(f"time gate: {error}", file=sys.stderr)
        return 2
    if slower:
        print(
            f"time gate: FAILED, {len(slower)} of {len(entries)} benchmarks more than "
            f"{threshold:.0%} slower than on {baseline.commit}:",
            file=sys.stderr,
        )
        for verdict in slower:
            print(f"  SLOWER   {verdict.benchmark}: {verdict.describe()}", file=sys.stderr)
        return 1
    if not passed:
        print(
            f"time gate: no benchmark could be timed on both codes ({'; '.join(skipped)})",
            file=sys.stderr,
        )
        return 2
    worst = max(passed, key=lambda verdict: verdict.slowdown, default=None)
    print(
        f"time gate: passed, no slow-down above {threshold:.0%} in {len(passed)} benchmarks"
        + (f" (slowest {worst.benchmark}: {worst.slowdown - 1:+.0%})" if worst else "")
        + (f"; {len(skipped)} skipped" if skipped else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
