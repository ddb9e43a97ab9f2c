"""The commands that measure and show runs: run (and --resume), compare, plot and repair."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from pathlib import Path

from rich.markup import escape

from playground.cli.output import console, error_console, warn_failed_plugins
from playground.errors import ConfigError, PlaygroundError
from playground.registry import Registry
from playground.report.bench_history import HISTORY_FIGURE, plot_history
from playground.report.pages import write_report
from playground.report.plots import plot_run
from playground.report.suite_tables import (
    print_sweeps,
    print_task_grid,
)
from playground.report.summary import spec_baseline, write_summary
from playground.report.sweeps import write_sweeps
from playground.report.tables import (
    print_accuracy,
    print_language,
    print_nodes,
    print_summary,
)
from playground.report.verdict import VERDICT, print_verdicts, run_verdicts
from playground.run.cells import pending_cells, plan
from playground.run.context import Executor
from playground.run.executors import executor_for
from playground.run.measurer import check_device
from playground.run.reevaluate import (
    Evaluation,
    evaluate_again,
    missing_evaluations,
    recorded_lengths,
)
from playground.run.resume import LANE_SETTINGS, resume
from playground.run.rows import BadLine
from playground.run.runner import Runner
from playground.run.spec import SIZE_FLAGS
from playground.run.spec_loading import load_spec
from playground.run.spec_overrides import added_baseline, apply_overrides, size_overrides
from playground.run.store import REJECTED, ROWS, RunStore, unwritable


def _interrupted(store: RunStore, count: int | None = None) -> int:
    done = (
        ""
        if count is None
        else f" after {count} new cells; every finished row is in {store.path(ROWS)}"
    )
    console.print(
        f"[yellow]interrupted[/yellow]{escape(done)}. Continue with: "
        f"playground run --resume {escape(str(store.directory))}",
        soft_wrap=True,
    )
    return 130


def _execute(registry: Registry, store: RunStore, spec, overrides: dict, executor: Executor) -> int:
    runner = Runner(spec, registry, store, console)
    try:
        runner.start(overrides)
        pending = len(runner.pending())
        evaluations = _evaluations_said(missing_evaluations(store))
        also = f", and {evaluations} to score again" if evaluations else ""
        console.print(
            f"[bold]{spec.name}[/bold]: {len(plan(spec))} cells ({pending} to run{also}, on "
            f"{runner.threads} threads, {executor.name} executor) → {store.directory}"
        )
    except KeyboardInterrupt:
        return _interrupted(store)
    count, completed = runner.measure_pending(executor)
    if completed and missing_evaluations(store):  # after the cells: one trained again has its row
        lengths = recorded_lengths(store)
        try:
            evaluate_again(store.directory, registry, lengths, announce=_announce)
        except KeyboardInterrupt:
            return _interrupted(store, count)
    try:  # a second Ctrl-C (while the figures are drawn, say) ends with the same hint
        lines = write_summary(store, runner.spec.baseline)
        print_summary(lines, console)
        print_accuracy(store.rows(), console)
        print_language(store.rows(), console)
        print_task_grid(store.rows(), console)
        write_sweeps(store)
        print_sweeps(store.rows(), console)
        print_nodes(store.rows(), console)
        _print_verdict(store, runner.spec.baseline)
        if store.rows():
            _plot_and_report(registry, store.directory, None, ("png",))
    except KeyboardInterrupt:
        return _interrupted(store, count)
    if not completed:
        return _interrupted(store, count)
    console.print(f"results: {store.directory}")
    rows = store.rows()
    errors = sum(row["status"] == "error" for row in rows)
    invalid = sum(row["status"] == "invalid" for row in rows)
    if errors:
        error_console.print(f"[red]{errors} cell(s) raised an error[/red] (see the table above)")
    if invalid:
        error_console.print(
            f"[red]{invalid} cell(s) returned something the contract forbids[/red] (status "
            f"invalid, see the table above; `playground check NAME` tells more)"
        )
    if errors or invalid:
        error_console.print("exit status 1")
        return 1
    return 0


def _integers(text: str, flag: str) -> list[int]:
    """Comma-separated integers, or PlaygroundError naming the flag. --seq-lens is then
    validated as the spec's seq_lens (positive, distinct, long enough for its passes),
    once merged into it."""
    try:
        lengths = [int(n) for n in text.split(",")]
    except ValueError:
        raise PlaygroundError(
            f"{flag} takes comma-separated integers, like 256,512; got {text!r}"
        ) from None
    return lengths


def _lengths(text: str, flag: str) -> list[int]:
    """Comma-separated distinct positive lengths, or PlaygroundError naming the flag."""
    lengths = _integers(text, flag)
    if any(n < 1 for n in lengths) or len(set(lengths)) != len(lengths):
        raise PlaygroundError(f"{flag} takes distinct positive lengths, like 256,512; got {text!r}")
    return lengths


def _overrides(arguments: argparse.Namespace) -> dict:
    seq_lens = None
    if getattr(arguments, "seq_lens", None):
        seq_lens = _integers(arguments.seq_lens, "--seq-lens")
    variants = getattr(arguments, "variants", None)
    plugins_dirs = getattr(arguments, "plugins_dir", None) or []
    return {
        "device": arguments.device,
        "dtype": getattr(arguments, "dtype", None),
        "threads": arguments.threads,
        "accuracy_workers": getattr(arguments, "accuracy_workers", None),
        "executor": getattr(arguments, "executor", None),
        "address": getattr(arguments, "address", None),
        "seq_lens": seq_lens,
        "save_weights": bool(getattr(arguments, "save_weights", False)),
        "variants": variants.split(",") if variants else None,
        "with_baseline": not getattr(arguments, "no_baseline", False),
        **{key: getattr(arguments, key, None) for key in SIZE_FLAGS},
        # absolute, so a resume from another working directory finds the same plugins
        "plugins_dirs": [str(Path(directory).resolve()) for directory in plugins_dirs],
    }


def command_run(registry: Registry, arguments: argparse.Namespace) -> int:
    if not arguments.resume:
        if not arguments.spec:
            raise PlaygroundError(
                "give a spec file (or a shipped spec name such as quick), or --resume RUN_DIR"
            )
        return _start(registry, arguments, arguments.spec)
    given = [
        flag
        for flag, value in (
            ("SPEC", arguments.spec),
            ("--device", arguments.device),
            ("--dtype", arguments.dtype),
            ("--variants", arguments.variants),
            ("--seq-lens", arguments.seq_lens),
            ("--threads", arguments.threads),
            ("--save-weights", arguments.save_weights),
            ("--no-baseline", arguments.no_baseline),
            *((flag, getattr(arguments, key)) for key, flag in SIZE_FLAGS.items()),
        )
        if value is not None and value is not False
    ]
    if given:
        raise PlaygroundError(
            f"--resume runs the cells its run lacks with the spec and options it started "
            f"with; drop {', '.join(given)} (or start a new run without --resume)"
        )
    resumed = resume(
        arguments.resume,
        registry,
        getattr(arguments, "plugins_dir", None) or [],
        lane={key: getattr(arguments, key) for key in LANE_SETTINGS},
        reloaded=lambda loaded: warn_failed_plugins(
            loaded, getattr(arguments, "warned_plugins", None)
        ),
    )
    registry, store, spec = resumed.registry, resumed.store, resumed.spec
    return _execute(registry, store, spec, resumed.overrides, executor_for(spec))


def _start(registry: Registry, arguments: argparse.Namespace, spec_path: str) -> int:
    """A new run of `spec_path` with the command line's overrides."""
    overrides = _overrides(arguments)
    spec = load_spec(spec_path, registry, size_overrides(overrides))
    spec = apply_overrides(spec, registry, overrides)
    check_device(spec.device)
    executor = executor_for(spec)
    store = RunStore.create(arguments.out, spec.name)
    baseline = added_baseline(spec, overrides)
    if baseline:
        console.print(
            f"also running the spec's baseline {escape(baseline)} beside --variants, so that "
            f"speed-ups have a reference (--no-baseline leaves it out)",
            soft_wrap=True,
        )
    return _execute(registry, store, spec, overrides, executor)


def command_compare(registry: Registry, arguments: argparse.Namespace) -> int:
    return _start(registry, arguments, "quick")


def _plot_and_report(
    registry: Registry, run_dir: Path, out: Path | None, formats: Sequence[str]
) -> None:
    if out is not None and out.exists() and not out.is_dir():
        raise PlaygroundError(f"--out {out} is a file; give a directory for the figures")
    try:
        figures = plot_run(run_dir, out, formats, registry=registry)
    except OSError as error:
        where = Path(error.filename) if error.filename else out or run_dir
        raise unwritable(where, error, "give --out a directory you can write to") from None
    try:
        html, markdown = write_report(run_dir, figures)
    except OSError as error:
        where = Path(error.filename) if error.filename else run_dir
        raise unwritable(where, error, "check that the run directory is writable") from None
    console.print(f"{len(figures)} figures in {figures[0].parent if figures else run_dir}")
    console.print(f"report: {html} (and {markdown.name})")


def command_plot(registry: Registry, arguments: argparse.Namespace) -> int:
    if arguments.benchmarks:
        out = Path(arguments.out or HISTORY_FIGURE)
        console.print(f"wrote {plot_history(Path(arguments.run_dir or '.benchmarks'), out)}")
        return 0
    if not arguments.run_dir:
        raise PlaygroundError(
            "give a run directory (results/<experiment>/<timestamp>/), or --benchmarks"
        )
    _plot_and_report(
        registry,
        Path(arguments.run_dir),
        Path(arguments.out) if arguments.out else None,
        [arguments.format],
    )
    return 0


def command_eval(registry: Registry, arguments: argparse.Namespace) -> int:
    lengths = _lengths(arguments.eval_lengths, "--eval-lengths")
    written = evaluate_again(
        arguments.run_dir,
        registry,
        lengths,
        getattr(arguments, "plugins_dir", None) or [],
        announce=lambda text: console.print(escape(text), soft_wrap=True),
    )
    store = RunStore.existing(arguments.run_dir)
    console.print(f"{written} row(s) appended to {escape(str(store.path(ROWS)))}", soft_wrap=True)
    write_summary(store)
    print_language(store.rows(), console)
    _plot_and_report(registry, store.directory, None, ("png",))
    return 0


def _print_verdict(store: RunStore, baseline: str | None) -> None:
    """The scorecard at the end of a run with quality rows; a note instead of a failure when
    it has no baseline to compare with (the run's own tables stand)."""
    try:
        found = run_verdicts(store, baseline)
    except PlaygroundError as exc:
        console.print(f"[yellow]no verdict[/yellow]: {escape(str(exc))}", soft_wrap=True)
        return
    print_verdicts(found, baseline or spec_baseline(store) or "?", console)


def command_verdict(registry: Registry, arguments: argparse.Namespace) -> int:
    store = RunStore.existing(arguments.run_dir)
    at = {}
    for given in arguments.at:
        key, equals, value = given.partition("=")
        if not (equals and key and value):
            raise ConfigError(
                f"--at {given!r}: give a grid point as KEY=VALUE, e.g. learning_rate=0.003"
            )
        at[key] = value
    found = run_verdicts(store, arguments.baseline, at)
    if not found:
        console.print("no quality rows (accuracy or bits per byte) to judge in this run")
        return 0
    baseline = arguments.baseline or spec_baseline(store) or "?"
    print_verdicts(
        found, baseline + (f", every sweep at {', '.join(arguments.at)}" if at else ""), console
    )
    if not at:
        console.print(f"written: {escape(str(store.path(VERDICT)))}", soft_wrap=True)
    return 0


def _announce(text: str) -> None:
    console.print(escape(text), soft_wrap=True)


def _evaluations_said(evaluations: list[Evaluation]) -> str:
    """`playground eval` rows a resume scores again, in words ("" when none)."""
    if not evaluations:
        return ""
    lengths = ",".join(str(n) for n in sorted({each.length for each in evaluations}))
    return f"{len(evaluations)} `playground eval` row(s) at {lengths}"


CELL_IN_LINE = re.compile(rb'"cell": "')
"""Whether a line set aside still names its cell (a cut can end before it)."""


def _after_repair(
    registry: Registry, store: RunStore, lines: list[BadLine], plugins_dirs: Sequence[str]
) -> str:
    """What a resume will do now, in words: the cells it measures again and the
    `playground eval` rows it scores again (said only as far as the run can tell)."""
    unreadable = [line.number for line in lines if not CELL_IN_LINE.search(line.raw)]
    maybe_eval = (
        f"; line(s) {', '.join(map(str, unreadable))} name no cell: if `playground eval` "
        f"wrote them, run it again with the lengths you gave it (it scores only what is "
        f"missing)"
        if unreadable
        else ""
    )
    resume_command = f"playground run --resume {store.directory}"
    try:
        spec = resume(store.directory, registry, plugins_dirs).spec
        cells = pending_cells(spec, store.rows())
    except PlaygroundError as error:  # the spec cannot be read here: say what is known
        return (
            f"resume with: {resume_command} (it measures again every cell without a row, "
            f"and scores again `playground eval`'s lengths; now it cannot read the run: "
            f"{error}){maybe_eval}"
        )
    evaluations = missing_evaluations(store)
    if not cells and not evaluations:
        return (
            f"nothing is missing: every cell of the spec and every `playground eval` length "
            f"the run recorded has its row (the lines set aside repeated rows it has){maybe_eval}"
        )
    named = ", ".join(cell.id for cell in cells[:3]) + (", ..." if len(cells) > 3 else "")
    work = [f"measures {len(cells)} cell(s) again ({named})"] if cells else []
    if evaluations:
        work.append(f"scores {_evaluations_said(evaluations)} again")
    return f"resume with: {resume_command} (it {' and '.join(work)}){maybe_eval}"


def command_repair(registry: Registry, arguments: argparse.Namespace) -> int:
    store = RunStore.existing(arguments.run_dir)
    done = store.repair()
    if not done:
        console.print(f"nothing to repair in {escape(str(store.directory))}", soft_wrap=True)
        return 0
    for source, destination in done.moved:
        console.print(f"moved {escape(str(source))} to {escape(destination.name)}", soft_wrap=True)
    for line in done.lines:
        console.print(f"line {line.number} {escape(line.reason)}", soft_wrap=True)
    if done.lines:
        console.print(
            f"moved {len(done.lines)} line(s) to {escape(str(store.path(REJECTED)))} (kept "
            f"as they were)",
            soft_wrap=True,
        )
    plugins_dirs = getattr(arguments, "plugins_dir", None) or []
    console.print(escape(_after_repair(registry, store, done.lines, plugins_dirs)), soft_wrap=True)
    return 0
