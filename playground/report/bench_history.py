"""The history of saved pytest-benchmark runs (`nox -s bench` saves one per call into
`.benchmarks/<machine>/NNNN_<commit>_<date>.json`): reading them, and a figure of every
variant's median time across runs.

    plot_history(".benchmarks", HISTORY_FIGURE) -> Path
    python -m playground.report.bench_history [.benchmarks] [--out FILE]

The figure goes to `HISTORY_FIGURE`, results/benchmarks/bench_history.png, beside the other
generated output (never the checkout's root).
    python -m playground.report.bench_history [.benchmarks] --noise

`--noise` prints, per benchmark, the largest slow-down from one saved run to the next of
its raw median and of the figure the time gate compares (`normalised_time`): save a few
runs of unchanged code (`nox -s bench` three to five times) and it tells how large the
gate's threshold (PLAYGROUND_BENCH_FAIL_PERCENT) must be on this machine for unchanged
code to raise no suspect.

Only benchmarks of tests/benchmarks (those whose `extra_info` names a variant, a sequence
length and a pass) are drawn; anything else saved in the same storage is ignored.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from matplotlib.artist import Artist
from matplotlib.figure import Figure

from playground.errors import PlaygroundError
from playground.report.plots.style import log_axis, variant_colour
from playground.report.summary import PASS_TITLES

HISTORY_FIGURE = Path("results") / "benchmarks" / "bench_history.png"
"""Where the history figure is written unless told (relative to the working directory,
as the storage `.benchmarks` is): with the runs' results, which git ignores."""


@dataclass(frozen=True)
class SavedRun:
    """One saved pytest-benchmark JSON file."""

    path: Path
    saved_at: str
    """ISO date and time of the run (pytest-benchmark's `datetime`)."""
    commit: str
    """Short commit id, with `*` when the working tree had uncommitted changes."""
    machine_info: dict[str, Any]
    benchmarks: list[dict[str, Any]]
    clean_commit: str | None = None
    """The full commit id when the working tree had no uncommitted changes (the code of the
    run can then be checked out again), else None."""

    @property
    def label(self) -> str:
        """`0003 1a2b3c4*`: the storage's run number and the commit."""
        return f"{self.path.name.split('_', 1)[0]} {self.commit}"

    def attention_benchmarks(self) -> list[dict[str, Any]]:
        """The benchmarks of tests/benchmarks: those with variant, seq_len and pass."""
        keys = ("variant", "seq_len", "pass_name")
        return [b for b in self.benchmarks if all(k in b.get("extra_info", {}) for k in keys)]

    def measured_benchmarks(self) -> list[dict[str, Any]]:
        """The attention benchmarks that hold a measurement: timing statistics with a
        positive, finite median. A benchmark run while pytest-benchmark was disabled (by
        pytest-xdist, or `--benchmark-disable`) has none, and a gate must not compare it."""
        return [b for b in self.attention_benchmarks() if is_measured(b)]

    def require_measured(self, role: str, remedy: str) -> None:
        """Raise PlaygroundError naming this run, `role` ("baseline", "candidate") and what
        to run (`remedy`) when it holds no measured benchmark: a gate that compared nothing
        would pass without having looked."""
        if self.measured_benchmarks():
            return
        if not self.benchmarks:
            what = "its 'benchmarks' list is empty"
        elif not self.attention_benchmarks():
            what = "none of its benchmarks is one of tests/benchmarks"
        else:
            what = (
                f"none of its {len(self.attention_benchmarks())} attention benchmarks has "
                f"timing statistics"
            )
        raise PlaygroundError(
            f"the {role} {self.path} holds no measured benchmark ({what}): benchmarks are "
            f"disabled under pytest-xdist (`-n`), by --benchmark-disable, or when every one "
            f"is skipped; {remedy}"
        )


def is_measured(benchmark: dict[str, Any]) -> bool:
    """True when a saved benchmark has timing statistics with a positive, finite median."""
    stats = benchmark.get("stats")
    if not isinstance(stats, dict):
        return False
    median = stats.get("median")
    return (
        isinstance(median, int | float)
        and not isinstance(median, bool)
        and math.isfinite(median)
        and median > 0
    )


def read_saved_run(path: Path) -> SavedRun:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        commit = data.get("commit_info", {})
        return SavedRun(
            path=path,
            saved_at=data["datetime"],
            commit=str(commit.get("id") or "unknown")[:7] + ("*" if commit.get("dirty") else ""),
            machine_info=data.get("machine_info", {}),
            benchmarks=data["benchmarks"],
            clean_commit=None if commit.get("dirty") or not commit.get("id") else commit["id"],
        )
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise PlaygroundError(
            f"{path} is not a saved pytest-benchmark run ({type(error).__name__}: {error}); "
            f"move it out of the benchmark storage"
        ) from None


def load_saved_runs(benchmark_dir: str | os.PathLike[str]) -> list[SavedRun]:
    """Every saved run of tests/benchmarks under `benchmark_dir`, oldest first (runs of
    other suites saved in the same storage are skipped)."""
    directory = Path(benchmark_dir)
    if not directory.is_dir():
        raise PlaygroundError(
            f"no benchmark storage at {directory}: save runs with `nox -s bench` (or "
            f"`pytest tests/benchmarks --bench-seq-lens 512,1024 --benchmark-autosave`)"
        )
    runs = [read_saved_run(path) for path in directory.rglob("*.json")]
    runs = [run for run in runs if run.attention_benchmarks()]
    return sorted(runs, key=lambda run: (run.saved_at, run.path.name))


def newest_baseline(benchmark_dir: str | os.PathLike[str]) -> SavedRun:
    """The newest saved run of tests/benchmarks, which the gates compare against, checked
    to hold measured benchmarks. A saved run with an empty 'benchmarks' list counts as the
    newest too (nothing else writes one to this storage), so that it fails here instead of
    an older run being compared in its place. PlaygroundError, saying what to run, when
    there is none or it measured nothing."""
    directory = Path(benchmark_dir)
    remedy = (
        "commit the code you trust, then save a baseline with `nox -s bench` (it runs "
        "without pytest-xdist)"
    )
    if not directory.is_dir():
        raise PlaygroundError(f"no benchmark storage at {directory}, so no baseline: {remedy}")
    runs = [read_saved_run(path) for path in directory.rglob("*.json")]
    runs = [run for run in runs if run.attention_benchmarks() or not run.benchmarks]
    if not runs:
        raise PlaygroundError(f"no saved benchmark run in {directory}, so no baseline: {remedy}")
    newest = max(runs, key=lambda run: (run.saved_at, run.path.name))
    newest.require_measured("baseline", remedy)
    return newest


def _median_ms(
    runs: Sequence[SavedRun],
) -> dict[tuple[str, int], dict[str, list[tuple[int, float]]]]:
    """(pass, seq_len) -> variant -> [(run index, median ms)]."""
    panels: dict[tuple[str, int], dict[str, list[tuple[int, float]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for index, run in enumerate(runs):
        for benchmark in run.measured_benchmarks():
            info = benchmark["extra_info"]
            label = benchmark.get("params", {}).get("variant", info["variant"])
            median_ms = benchmark["stats"]["median"] * 1e3
            panels[(info["pass_name"], int(info["seq_len"]))][label].append((index, median_ms))
    return panels


def normalised_time(benchmark: dict[str, Any]) -> float | None:
    """A saved benchmark's time in units of the reference matmul timed just before each of
    its rounds (tests/benchmarks/reference.py): the median over rounds of round time over
    reference time, so that the load on a shared machine, which slows both, divides out.
    None for a run saved without reference timings."""
    info = benchmark.get("extra_info", {})
    rounds, references = info.get("round_times_s"), info.get("reference_times_s")
    if not rounds or not references or len(rounds) != len(references):
        return None
    return statistics.median(r / reference for r, reference in zip(rounds, references, strict=True))


def largest_steps(
    runs: Sequence[SavedRun], figure: Callable[[dict[str, Any]], float | None]
) -> dict[str, float]:
    """Per benchmark, the largest relative increase of `figure` from one saved run to the
    next (0.25 = 25 % slower); benchmarks with the figure in fewer than two runs are left out."""
    values: dict[str, list[float]] = defaultdict(list)
    for run in runs:
        for benchmark in run.measured_benchmarks():
            value = figure(benchmark)
            if value is not None:
                values[benchmark["name"]].append(value)
    return {
        name: max(after / before - 1 for before, after in pairwise(series))
        for name, series in values.items()
        if len(series) >= 2
    }


def median_steps(runs: Sequence[SavedRun]) -> dict[str, float]:
    """Per benchmark, the largest step of its raw median between consecutive runs."""
    return largest_steps(runs, lambda benchmark: benchmark["stats"]["median"])


def print_noise(runs: Sequence[SavedRun]) -> None:
    """The largest steps between consecutive runs of the raw median and of the figure the
    time gate compares (`normalised_time`), per benchmark, worst first."""
    medians, normalised = median_steps(runs), largest_steps(runs, normalised_time)
    if not medians:
        raise PlaygroundError("the noise needs at least two saved runs of the same benchmarks")
    print("  median  normalised  benchmark")
    for name, step in sorted(medians.items(), key=lambda item: -normalised.get(item[0], item[1])):
        gated = f"{normalised[name]:+10.0%}" if name in normalised else f"{'-':>10}"
        print(f"{step:+8.0%}  {gated}  {name}")
    for label, steps in (("median", medians), ("normalised time", normalised)):
        if steps:
            ordered = sorted(steps.values())
            worst = max(steps, key=steps.__getitem__)
            print(
                f"{label}: largest step between consecutive runs ({len(runs)} runs, "
                f"{len(steps)} benchmarks) {ordered[-1]:+.0%} ({worst}); median over "
                f"benchmarks {ordered[len(ordered) // 2]:+.0%}"
            )
    print(
        "A time gate threshold above the largest normalised step would not have flagged a "
        "suspect on these runs (the gate re-measures suspects before failing)."
    )


def plot_history(benchmark_dir: str | os.PathLike[str], out_path: str | os.PathLike[str]) -> Path:
    """Write `history_figure` of the saved runs to `out_path` (its folder is created)."""
    figure = history_figure(benchmark_dir)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out)
    return out


def history_figure(benchmark_dir: str | os.PathLike[str]) -> Figure:
    """The median time of every variant across the saved runs: one panel per pass (rows)
    and sequence length (columns), runs in the order they were saved."""
    runs = load_saved_runs(benchmark_dir)
    panels = _median_ms(runs)
    if not panels:
        raise PlaygroundError(
            f"{benchmark_dir} holds no saved run of the attention benchmarks; save some "
            f"with `nox -s bench`"
        )
    passes = [p for p in PASS_TITLES if any(key[0] == p for key in panels)]
    seq_lens = sorted({key[1] for key in panels})
    figure = Figure(
        figsize=(2.6 + 4.2 * len(seq_lens), 1.4 + 3.4 * len(passes)), dpi=120, layout="constrained"
    )
    grid = figure.subplots(len(passes), len(seq_lens), squeeze=False, sharex=True)
    for row, pass_name in enumerate(passes):
        for column, seq_len in enumerate(seq_lens):
            axes = grid[row][column]
            medians = panels.get((pass_name, seq_len), {})
            for variant, points in sorted(medians.items()):
                xs, ys = zip(*points, strict=True)
                axes.plot(xs, ys, marker="o", label=variant, color=variant_colour(variant))
            if medians:
                log_axis(axes, [ms for points in medians.values() for _, ms in points])
            else:
                axes.text(
                    0.5,
                    0.5,
                    "not in any saved run",
                    ha="center",
                    va="center",
                    transform=axes.transAxes,
                    color="0.4",
                )
                axes.set_yticks([])
            axes.set_title(f"{PASS_TITLES[pass_name]}, n = {seq_len}", fontsize=10)
            axes.grid(True, which="both", alpha=0.3)
            axes.set_xlim(-0.5, len(runs) - 0.5)  # one run: a point in the middle
            if column == 0:
                axes.set_ylabel("median time (ms)")
            if row == len(passes) - 1:
                axes.set_xticks(range(len(runs)), [run.label for run in runs], rotation=60)
                axes.tick_params(axis="x", labelsize=7)
                axes.set_xlabel("saved run (number, commit), oldest first")
    handles: dict[str, Artist] = {}  # one legend entry per variant, whichever panels it is in
    for axes in grid.flat:
        for handle, label in zip(*axes.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    ordered = sorted(handles)
    # Beside the panels, centred: "upper" put it level with the title, over its end.
    figure.legend(
        [handles[label] for label in ordered],
        ordered,
        loc="outside right center",
        fontsize=8,
        title="variant",
    )
    machines = sorted({run.path.parent.name for run in runs})
    count = f"{len(runs)} saved run{'' if len(runs) == 1 else 's'}"
    figure.suptitle(f"Benchmark history: {count} on {', '.join(machines)}")
    return figure


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m playground.report.bench_history",
        description="Plot the median time of every variant across saved benchmark runs, "
        "or (--noise) measure how much medians and normalised times move between runs.",
    )
    parser.add_argument("benchmark_dir", nargs="?", default=".benchmarks", help="storage")
    parser.add_argument(
        "--out", default=str(HISTORY_FIGURE), help=f"figure file to write ({HISTORY_FIGURE})"
    )
    parser.add_argument(
        "--noise",
        action="store_true",
        help="print each benchmark's largest slow-down between consecutive runs",
    )
    arguments = parser.parse_args(argv)
    try:
        if arguments.noise:
            print_noise(load_saved_runs(arguments.benchmark_dir))
            return 0
        path = plot_history(arguments.benchmark_dir, arguments.out)
    except PlaygroundError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
