"""Accuracy: grouped bars per task (mean and 95% interval over seeds (stays inside [0, 1]), each seed a
dot, chance drawn),
and cost against accuracy, one panel per task, the trade-off in one picture."""

from __future__ import annotations

import math
import textwrap
from typing import Any, Literal

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from playground.report.plots.data import OK, RunData
from playground.report.plots.style import (
    PANEL_SIZE,
    failure_note,
    finish,
    legend,
    log_axis,
    mark_failures,
    new_figure,
    series_colour,
    series_marker,
    status_handles,
)
from playground.run.row_schema import Row
from playground.run.stats import accuracy_error_bar

CHANCE_STYLE: dict[str, Any] = dict(color="0.15", linestyle="--", linewidth=1.2)  # line kwargs


def task_name(row: Row) -> str:
    """The task as figures show it: its label when the row has one."""
    return str(row.get("task_label") or row["task"])


def _chance_handle() -> Line2D:
    return Line2D([], [], label="chance level", **CHANCE_STYLE)


def accuracy_figure(run: RunData) -> Figure | None:
    """Grouped bars: one group per task, one bar per setup; None without
    accuracy rows."""
    rows = run.accuracy
    if not rows:
        return None
    tasks = list(dict.fromkeys(task_name(r) for r in rows))
    labels = run.labels(rows)
    figure = new_figure(1, "Accuracy per task")
    figure.set_size_inches(max(PANEL_SIZE[0], 1.0 + 0.45 * len(tasks) * len(labels)) + 2.6, 4.8)
    axes = figure.axes[0]
    width = 0.8 / len(labels)
    statuses: set[str] = set()
    notes = []
    for group, task in enumerate(tasks):
        task_rows = {r["label"]: r for r in rows if task_name(r) == task}
        for index, label in enumerate(labels):
            row = task_rows.get(label)
            if row is None:
                continue
            series = run.series[label]
            x = group + (index - (len(labels) - 1) / 2) * width
            colour = series_colour(series)
            mean = row.get("accuracy_mean")
            if row.get("status", OK) != OK or mean is None:
                status = row.get("status", "error")
                mark_failures(axes, [(x, status)], colour)
                statuses.add(status)
                notes.append(failure_note(row, series.legend))
                continue
            axes.bar(
                x,
                mean,
                width * 0.92,
                yerr=[[part] for part in accuracy_error_bar(row)],
                color=colour,
                edgecolor="0.2",
                linewidth=0.5,
                capsize=3,
                label=series.legend,
            )
            seeds = row.get("accuracy_per_seed") or []
            axes.plot([x] * len(seeds), seeds, "o", color="0.1", markersize=2.5, alpha=0.7)
        chances = {r["chance"] for r in task_rows.values() if r.get("chance") is not None}
        for chance in chances:
            axes.hlines(chance, group - 0.45, group + 0.45, **CHANCE_STYLE)
    # Long labels (options, width, curriculum) wrap onto lines of their own words.
    axes.set_xticks(
        range(len(tasks)), [textwrap.fill(task, 24, break_long_words=False) for task in tasks]
    )
    axes.set_xlim(-0.6, len(tasks) - 0.4)
    axes.set_ylim(0, 1.05)
    axes.set_ylabel("accuracy (mean, 95% interval over seeds; dots: seeds)")
    axes.grid(True, axis="y", alpha=0.3)
    legend(figure, [_chance_handle(), *status_handles(statuses)])
    finish(figure, run, notes + _training_notes(rows))
    return figure


def _training_notes(rows: list[Row]) -> list[str]:
    """What the bars were trained with: steps and seeds per task."""
    notes: dict[str, str] = {}  # one note per task
    for row in rows:
        if row.get("status", OK) == OK:
            seeds = len(row.get("accuracy_per_seed") or [])
            notes.setdefault(
                task_name(row), f"{task_name(row)}: {row.get('steps')} steps, {seeds} seeds"
            )
    return list(notes.values())


def _cost_rows(
    run: RunData, labels: list[str], seq_len: int | None
) -> tuple[dict[str, Row], int | None]:
    """accuracy label -> its forward measurement row at one n, and that n: the given one,
    or the n at which the most of these labels were measured (the longest on a tie)."""
    first_pass = run.passes[0] if run.passes else None
    measured = [r for r in run.measurements if r.get("pass") == first_pass]

    def match(label: str, n: int) -> Row | None:
        exact = [r for r in measured if r["label"] == label and r["seq_len"] == n]
        if exact:
            return exact[0]
        if any(r["label"] == label for r in measured):
            return None  # measured, but not at this n
        # An accuracy run may build a variant with other options than the speed run did;
        # a variant with a single measured point still matches by name.
        variant = run.series[label].variant
        same = [r for r in measured if r["variant"] == variant]
        if len({r["label"] for r in same}) == 1:
            return next((r for r in same if r["seq_len"] == n), None)
        return None

    lengths = sorted({r["seq_len"] for r in measured})
    if seq_len is None and lengths:

        def timed(n: int) -> tuple[int, int]:
            found = [match(label, n) for label in labels]
            return sum(bool(r and r["status"] == OK and r.get("time_ms")) for r in found), n

        seq_len = max(lengths, key=timed)
    if seq_len is None:
        return {}, None
    found = {label: match(label, seq_len) for label in labels}
    return {label: row for label, row in found.items() if row is not None}, seq_len


def _pareto(axes: Axes, points: list[tuple[float, float]]) -> None:
    """A faint staircase through the points no other point beats on both cost and
    accuracy."""
    front, best = [], float("-inf")
    for cost, accuracy in sorted(points, key=lambda p: (p[0], -p[1])):
        if accuracy > best:
            front.append((cost, accuracy))
            best = accuracy
    if len(front) > 1:
        axes.step(*zip(*front, strict=True), where="post", color="0.6", linewidth=1, zorder=0)


def cost_accuracy_figure(run: RunData, seq_len: int | None = None) -> Figure | None:
    """Per task, accuracy against time and against peak memory at one n (or against
    training time when the run measured no speed); None without accuracy rows."""
    rows = [
        r for r in run.accuracy if r.get("status", OK) == OK and r.get("accuracy_mean") is not None
    ]
    if not rows:
        return None
    tasks = list(dict.fromkeys(task_name(r) for r in rows))
    labels = run.labels(rows)
    cost, n = _cost_rows(run, labels, seq_len)
    metrics: list[tuple[Literal["time_ms", "peak_memory_bytes", "train_time_s"], float, str]]
    if cost:
        metrics = [
            ("time_ms", 1.0, f"median {run.passes[0]} time at n={n} (ms)"),
            ("peak_memory_bytes", 1 / 2**20, f"peak memory at n={n} (MiB)"),
        ]
    else:
        metrics = [("train_time_s", 1.0, "training time (s)")]
    figure = new_figure(len(tasks), "Cost vs accuracy (upper left is better)", rows=len(metrics))
    notes = [
        failure_note(r, run.series[r["label"]].legend)
        for r in run.accuracy
        if r.get("status", OK) != OK
    ]
    grid = [figure.axes[i * len(tasks) : (i + 1) * len(tasks)] for i in range(len(metrics))]
    for column, task in enumerate(tasks):
        for (key, scale, axis_label), axes in zip(
            metrics, [row[column] for row in grid], strict=True
        ):
            points = []
            for row in (r for r in rows if task_name(r) == task):
                mean = row["accuracy_mean"]
                assert mean is not None, "rows holds the scored rows"
                series = run.series[row["label"]]
                source = cost.get(row["label"]) if cost else row
                status = "not measured" if source is None else source.get("status", OK)
                value = source.get(key) if source is not None and status == OK else None
                if not value:
                    why = status if status != OK else "not recorded"
                    notes.append(f"{series.legend} on {task}: no {axis_label} ({why})")
                    continue
                x = value * scale
                axes.errorbar(
                    x,
                    mean,
                    yerr=[[part] for part in accuracy_error_bar(row)],
                    color=series_colour(series),
                    marker=series_marker(series),
                    markersize=7,
                    capsize=3,
                    label=series.legend,
                    linestyle="none",
                )
                points.append((x, mean))
            _pareto(axes, points)
            chance = next(
                (r["chance"] for r in rows if task_name(r) == task and r.get("chance") is not None),
                None,
            )
            if chance is not None:
                axes.axhline(chance, **CHANCE_STYLE)
            if len(points) > 1 and max(p[0] for p in points) > 3 * min(p[0] for p in points):
                log_axis(axes, [p[0] for p in points], which="x")
            axes.set_xlabel(axis_label)
            axes.set_ylabel("accuracy (mean, 95% interval over seeds)")
            axes.set_ylim(0, 1.05)
            task_n = _task_length(rows, task)
            axes.set_title(
                task if task_n is None else f"{task}: accuracy at n={task_n}", fontsize=10
            )
            axes.grid(True, alpha=0.3)
    for task in tasks:
        task_n = _task_length(rows, task)
        for label in dict.fromkeys(r["label"] for r in rows if task_name(r) == task):
            if task_n is not None and _exact_at(run, label, task_n):
                notes.insert(
                    0,
                    f"{run.series[label].legend} is exact attention at n={task_n} (fidelity "
                    f"error ~0 there): its {task} accuracy is exact attention's",
                )
    if cost and any(_task_length(rows, task) not in (None, n) for task in tasks):
        notes.insert(0, f"cost measured at n={n}; accuracy on each task at its own length")
    legend(figure, [_chance_handle()])
    finish(figure, run, list(dict.fromkeys(notes)))
    return figure


EXACT_TOLERANCE = 1e-5
"""Relative fidelity error under which a variant counts as exact attention at a length."""


def _task_length(rows: list[Row], task: str) -> int | None:
    """The sequence length a task trained at, from its rows' task options."""
    for row in rows:
        if task_name(row) == task:
            length = (row.get("task_options") or {}).get("seq_len")
            if isinstance(length, int) and not isinstance(length, bool):
                return length
    return None


def _exact_at(run: RunData, label: str, n: int) -> bool:
    """Whether this setup is exact attention at length n but not everywhere: its
    fidelity error is ~0 at n (a window that covers every token, say) and not at some
    other measured length. Derived from the measurements, so the core names no variant,
    and exact attention itself is not flagged."""
    errors: dict[int, float] = {}
    for row in run.measurements:
        if row.get("label") != label or row.get("status") != OK:
            continue
        error, seq_len = row.get("fidelity_rel_error"), row.get("seq_len")
        if isinstance(error, int | float) and math.isfinite(error) and isinstance(seq_len, int):
            errors[seq_len] = max(errors.get(seq_len, 0.0), error)
    exact_here = n in errors and errors[n] < EXACT_TOLERANCE
    return exact_here and any(e >= EXACT_TOLERANCE for e in errors.values())
