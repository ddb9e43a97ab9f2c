"""Language models: bits per byte against evaluation length, the "Train Short, Test Long"
picture (Press et al. 2022, Figure 1), one line per setup with its 95% interval over seeds,
the training length marked and the unigram and bigram baselines drawn; and bits per byte
at the training length against training time, quality against cost.

One panel per task (its label less the model settings), training length and corpus. A
setup with model settings of its own (`vanilla positional_encoding=none`) shares its
task's panel in its variant's colour, with a line style (or a hollow marker) of its own.
A length a setup could not run at is left out of its line, marked at the foot of the axes
like every failed cell, and named in the footnote.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import NullLocator
from matplotlib.transforms import blended_transform_factory

from playground.report.plots.data import RunData
from playground.report.plots.style import (
    finish,
    legend,
    log_axis,
    mark_failures,
    new_figure,
    series_colour,
    series_marker,
    status_handles,
)
from playground.report.task_rows import OK, language_rows, model_settings, setup_name, task_base
from playground.run.row_schema import Row

SETTINGS_STYLES = ("--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)))
"""Line styles of setups with model settings, in the order of their settings; a setup
without any is drawn solid."""
TRAINING_LENGTH_GREY = "0.3"
BaselineField = Literal["unigram_bits_per_byte", "bigram_bits_per_byte"]
BASELINES: tuple[tuple[str, BaselineField, str], ...] = (
    ("unigram", "unigram_bits_per_byte", "0.6"),
    ("bigram", "bigram_bits_per_byte", "0.45"),
)
"""(name, row field, grey) of the n-gram baselines drawn as horizontal lines."""

Rows = list[Row]


def language_panels(run: RunData) -> dict[tuple[str, Any], Rows]:
    """(task less model settings, training length) -> its rows, in `language_rows` order.
    The corpus needs no place in the key: `language_rows` refuses (MixedCorpora) a task
    whose rows were scored on different text."""
    panels: dict[tuple[str, Any], Rows] = {}
    for row in language_rows(run.language):
        if row.get("train_length") is not None:  # else refused before training: a note
            panels.setdefault((task_base(row), row.get("train_length")), []).append(row)
    return panels


def untrained_notes(run: RunData) -> list[str]:
    """Notes for the setups refused before training (no length of their own)."""
    return [language_failure_note(row) for row in run.language if row.get("train_length") is None]


def scored_row(row: Row) -> bool:
    mean = row.get("bits_per_byte_mean")
    usable = isinstance(mean, int | float) and not isinstance(mean, bool) and math.isfinite(mean)
    return row.get("status", OK) == OK and usable


def _error_bar(row: Row) -> tuple[float, float]:
    """How far the row's 95% interval reaches below and above its mean; (0, 0) for one seed."""
    mean = row["bits_per_byte_mean"]
    low, high = row.get("bits_per_byte_ci95_low"), row.get("bits_per_byte_ci95_high")
    if low is None or high is None:
        half = row.get("bits_per_byte_ci95") or 0.0
        return (half, half)
    return (max(0.0, mean - low), max(0.0, high - mean))


def shared_settings(rows: Rows) -> list[str]:
    """The model settings every row of `rows` has (`d_model=128` when all trained at that
    width): said once in the panel's title rather than in every setup's name."""
    each = [set(model_settings(row).split()) for row in rows]
    common = set.intersection(*each) if each else set()
    return [token for token in model_settings(rows[0]).split() if token in common] if rows else []


def own_settings(row: Row, shared: list[str]) -> str:
    """The row's model settings less the shared ones (`positional_encoding=none`)."""
    return " ".join(token for token in model_settings(row).split() if token not in shared)


def language_setups(run: RunData, rows: Rows) -> dict[str, Rows]:
    """setup (its label and own settings) -> its rows, the run's series order (baseline
    first, then by variant), a setup without settings of its own before those with."""
    order = {label: index for index, label in enumerate(run.labels(rows))}
    shared = shared_settings(rows)
    by_setup: dict[str, Rows] = {}
    for row in sorted(rows, key=lambda r: (order[r["label"]], model_settings(r), setup_name(r))):
        name = " ".join(part for part in (str(row["label"]), own_settings(row, shared)) if part)
        by_setup.setdefault(name, []).append(row)
    return by_setup


def setting_styles(run: RunData) -> dict[str, Any]:
    """a setup's own model settings -> line style, the same in every panel."""
    shared = shared_settings(run.language)
    settings = sorted({own_settings(row, shared) for row in run.language} - {""})
    styles: dict[str, Any] = {"": "-"}
    for index, each in enumerate(settings):
        styles[each] = SETTINGS_STYLES[index % len(SETTINGS_STYLES)]
    return styles


def panel_title(task: str, rows: Rows, train_length: Any) -> str:
    shared = " ".join(shared_settings(rows))
    return f"{task}{' ' + shared if shared else ''}: trained at L = {train_length}"


def language_failure_note(row: Row) -> str:
    message = (row.get("error") or "").strip().splitlines()
    detail = f": {message[0][:110]}" if message else ""
    length = row.get("eval_length")
    where = f"at length {length}" if length is not None else "at every length"
    return f"{row.get('status', '?')}: {setup_name(row)} {where}{detail}"


def corpus_note(task: str, rows: Rows) -> str | None:
    """The corpus and the schedule a panel's numbers rest on."""
    row = next((r for r in rows if r.get("corpus_fingerprint")), None)
    if row is None:
        return None
    corpus = row.get("corpus")
    corpus = corpus if isinstance(corpus, dict) else {}
    files = corpus.get("files")
    files = files if isinstance(files, dict) else {}
    split = "/".join(str(files.get(part, "?")) for part in ("train", "validation", "test"))
    return (
        f"{task}: corpus {corpus.get('source', '?')} ({split} files train/validation/test), "
        f"fingerprint {str(row['corpus_fingerprint'])[:12]}; {row.get('steps', '?')} steps, "
        f"{len(row.get('seeds') or []) or '?'} seeds; bits per byte averaged per position"
    )


def draw_baselines(axes: Axes, rows: Rows) -> None:
    """The unigram and bigram baselines of the panel's corpus, grey, labelled on the line."""
    transform = blended_transform_factory(axes.transAxes, axes.transData)
    for name, key, grey in BASELINES:
        value = next((r[key] for r in rows if isinstance(r.get(key), int | float)), None)
        if value is None or not math.isfinite(value):
            continue
        axes.axhline(value, color=grey, linewidth=1.0, zorder=0)
        axes.text(  # at the right: the training length's label is at the left
            0.99,
            value,
            f"{name} baseline {value:.2f}",
            transform=transform,
            ha="right",
            va="bottom",
            fontsize=7,
            color=grey,
        )


def mark_training_length(axes: Axes, length: int) -> None:
    axes.axvline(length, color=TRAINING_LENGTH_GREY, linestyle="--", linewidth=1.0, zorder=0)
    axes.text(
        length,
        0.97,
        f"trained at L = {length}",
        transform=blended_transform_factory(axes.transData, axes.transAxes),
        rotation=90,
        ha="right",
        va="top",
        fontsize=7,
        color=TRAINING_LENGTH_GREY,
    )


def extrapolation_figure(run: RunData) -> Figure | None:
    """Bits per byte against evaluation length (log2), one line per setup; None without
    language rows. MixedCorpora when a task's rows were scored on different text."""
    panels = language_panels(run)
    if not panels:
        return None
    styles = setting_styles(run)
    figure = new_figure(len(panels), "Bits per byte against evaluation length (lower is better)")
    notes: list[str] = untrained_notes(run)
    statuses: set[str] = set()
    for axes, ((task, train_length), rows) in zip(figure.axes, panels.items(), strict=True):
        stack: dict[float, int] = {}
        for setup, setup_rows in language_setups(run, rows).items():
            series = run.series[setup_rows[0]["label"]]
            colour = series_colour(series)
            points = sorted(
                (r for r in setup_rows if scored_row(r)), key=lambda r: r["eval_length"]
            )
            if points:
                below, above = zip(*(_error_bar(r) for r in points), strict=True)
                axes.errorbar(
                    [r["eval_length"] for r in points],
                    [r["bits_per_byte_mean"] for r in points],
                    yerr=[below, above],
                    color=colour,
                    marker=series_marker(series),
                    markersize=5,
                    linestyle=styles[own_settings(setup_rows[0], shared_settings(run.language))],
                    linewidth=1.5,
                    capsize=3,
                    label=setup,
                )
            failed = [r for r in setup_rows if not scored_row(r)]
            drawn = [r for r in failed if isinstance(r.get("eval_length"), int)]
            mark_failures(
                axes, [(r["eval_length"], r.get("status", "error")) for r in drawn], colour, stack
            )
            statuses.update(r.get("status", "error") for r in drawn)
            notes.extend(language_failure_note(r) for r in failed)
        lengths = sorted({r["eval_length"] for r in rows if isinstance(r.get("eval_length"), int)})
        if isinstance(train_length, int):
            mark_training_length(axes, train_length)
            lengths = sorted({*lengths, train_length})
        draw_baselines(axes, rows)
        axes.set_xscale("log", base=2)
        axes.set_xticks(lengths, [str(n) for n in lengths])
        axes.xaxis.set_minor_locator(NullLocator())
        if lengths:
            axes.set_xlim(lengths[0] / 1.4, lengths[-1] * 1.4)
        axes.set_xlabel("evaluation length (bytes of context)")
        axes.set_ylabel("bits per byte (mean, 95% interval over seeds)")
        axes.set_title(panel_title(task, rows, train_length), fontsize=10)
        axes.grid(True, alpha=0.3)
        note = corpus_note(task, rows)
        if note:
            notes.insert(0, note)
    if len(figure.axes) == 1:  # one panel: the legend inside, where the lines leave room
        figure.axes[0].legend(
            handles=[*figure.axes[0].get_legend_handles_labels()[0], *status_handles(statuses)],
            fontsize=7,
            loc="best",
        )
    else:
        legend(figure, status_handles(statuses), title="setup")
    finish(figure, run, notes)
    return figure


def language_cost_figure(run: RunData) -> Figure | None:
    """Bits per byte at the training length against training time, one point per setup;
    None when no setup has both. MixedCorpora when a task's rows were scored on
    different text."""
    notes: list[str] = []
    panels: dict[tuple[str, Any], list[tuple[Row, float]]] = {}
    for (task, train_length), rows in language_panels(run).items():
        for row in (r for r in rows if r.get("eval_length") == train_length):
            seconds = _seconds(row)
            if not scored_row(row):
                notes.append(language_failure_note(row))
            elif seconds is None:
                notes.append(f"{setup_name(row)} on {task}: no training time recorded")
            else:
                panels.setdefault((task, train_length), []).append((row, seconds))
    if not panels:
        return None
    figure = new_figure(
        len(panels), "Bits per byte against training time (lower left is better)", extra_width=0.6
    )
    hollow = False
    for axes, ((task, train_length), points) in zip(figure.axes, panels.items(), strict=True):
        rows = [row for row, _ in points]
        shared = shared_settings(rows)
        setups = language_setups(run, rows)
        seconds_of = {name: _seconds(each[0]) or 0.0 for name, each in setups.items()}
        for setup, (row, *_) in setups.items():
            series = run.series[row["label"]]
            colour = series_colour(series)
            below, above = _error_bar(row)
            axes.errorbar(
                seconds_of[setup],
                row["bits_per_byte_mean"],
                yerr=[[below], [above]],
                color=colour,
                marker=series_marker(series),
                markerfacecolor="none" if own_settings(row, shared) else colour,
                markersize=7,
                capsize=3,
                linestyle="none",
                label=setup,
            )
            axes.annotate(
                setup,
                (seconds_of[setup], row["bits_per_byte_mean"]),
                xytext=(5, 4),
                textcoords="offset points",
                fontsize=7,
                color="0.25",
            )
        times = list(seconds_of.values())
        if len(times) > 1 and max(times) > 3 * min(times):
            log_axis(axes, times, which="x")
        axes.margins(x=0.15)  # room for the labels of the outermost points
        axes.set_xlabel("training time per seed (s)")
        axes.set_ylabel("bits per byte at the training length (mean, 95% interval)")
        axes.set_title(panel_title(task, rows, train_length), fontsize=10)
        axes.grid(True, alpha=0.3)
        hollow = hollow or any(own_settings(row, shared) for row in rows)
    if hollow:  # each point is labelled with its setup: the legend says only what hollow is
        figure.axes[0].legend(handles=[_OWN_SETTINGS_HANDLE], loc="best", fontsize=7)
    finish(figure, run, notes)
    return figure


_OWN_SETTINGS_HANDLE = Line2D(
    [],
    [],
    linestyle="none",
    marker="o",
    markerfacecolor="none",
    markeredgecolor="0.3",
    label="hollow: a setup with model settings of its own",
)


def _seconds(row: Row) -> float | None:
    value = row.get("train_time_s")
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None
