"""Fidelity to exact attention: relative error and cosine, on random and on local inputs,
against each swept option (Linformer's k, Longformer's window), or against n when the
run sweeps nothing."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, NullLocator
from matplotlib.typing import LineStyleType

from playground.report.plots.data import OK, RunData, format_value, swept_options
from playground.report.plots.scaling import set_length_axis
from playground.report.plots.style import (
    finish,
    legend,
    log_axis,
    new_figure,
    series_colour,
    shade,
)
from playground.run.row_schema import Row

ErrorField = Literal["fidelity_rel_error", "fidelity_local_rel_error"]
CosineField = Literal["fidelity_cosine", "fidelity_local_cosine"]
INPUTS: tuple[tuple[ErrorField, CosineField, str, LineStyleType, str], ...] = (
    ("fidelity_rel_error", "fidelity_cosine", "random inputs", "-", "o"),
    ("fidelity_local_rel_error", "fidelity_local_cosine", "local inputs", "--", "s"),
)
"""(row's error field, its cosine field, legend text, line style, marker) of the two
fidelity cases."""


def _measured(run: RunData) -> list[Row]:
    return [
        row
        for row in run.measurements
        if row.get("status") == OK and row.get("fidelity_rel_error") is not None
    ]


def _input_handles() -> list[Line2D]:
    return [
        Line2D([], [], color="0.2", linestyle=style, marker=marker, label=text)
        for _, _, text, style, marker in INPUTS
    ]


def _frame(figure: Figure) -> tuple[Axes, Axes]:
    error_axes, cosine_axes = figure.axes[:2]
    error_axes.set_ylabel("relative error ‖y − y*‖ / ‖y*‖")
    error_axes.set_title("relative error (lower is better)", fontsize=10)
    cosine_axes.set_ylabel("cosine similarity to exact attention")
    cosine_axes.set_title("cosine (higher is better; 1 = exact)", fontsize=10)
    cosine_axes.axhline(1.0, color="0.5", linewidth=0.8, linestyle=":")
    for axes in figure.axes:
        axes.grid(True, alpha=0.3)
    return error_axes, cosine_axes


def _log_errors(error_axes: Axes) -> None:
    """The error axis is logarithmic (errors span decades between variants)."""
    log_axis(error_axes, _plotted(error_axes))


def _plotted(axes: Axes) -> list[float]:
    """Every y value the lines of `axes` draw."""
    return [y for line in axes.lines for y in np.asarray(line.get_ydata(), float).tolist()]


def _cost_panel(axes: Axes, xs: Sequence[float], rows: Sequence[Row], colour: Any) -> None:
    """What the option costs: median time of the same cells."""
    points = [(x, time) for x, r in zip(xs, rows, strict=True) if (time := r.get("time_ms"))]
    if points:
        axes.plot(*zip(*points, strict=True), color=colour, marker="o", markersize=5)


def _draw(
    axes_pair: tuple[Axes, Axes],
    xs: Sequence[float],
    rows: Sequence[Row],
    colour: Any,
    label: str,
) -> list[str]:
    """Both inputs' error and cosine over xs; notes for zero errors (off a log axis)."""
    notes = []
    error_axes, cosine_axes = axes_pair
    for error_field, cosine_field, _, style, marker in INPUTS:
        errors = [(x, r.get(error_field)) for x, r in zip(xs, rows, strict=True)]
        cosines = [(x, r.get(cosine_field)) for x, r in zip(xs, rows, strict=True)]
        positive = [(x, e) for x, e in errors if e is not None and e > 0]
        if any(e == 0 for _, e in errors):
            notes.append(f"{label}: relative error 0 (exact), not drawn on the log axis")
        kwargs = dict(color=colour, linestyle=style, marker=marker, markersize=5)
        if positive:
            error_axes.plot(*zip(*positive, strict=True), label=label, **kwargs)
        measured = [(x, c) for x, c in cosines if c is not None]
        if measured:
            cosine_axes.plot(*zip(*measured, strict=True), label=label, **kwargs)
    return list(dict.fromkeys(notes))


def _locality_note(rows: Sequence[Row]) -> str | None:
    """How local exact attention was on the local inputs, per n."""
    distances: dict[int, float] = {}
    for row in rows:
        distance = row.get("fidelity_local_attention_distance")
        if distance is not None:
            distances.setdefault(row["seq_len"], distance)
    if not distances:
        return None
    shown = ", ".join(f"{distances[n]:.1f} at n={n}" for n in sorted(distances))
    return f"local inputs: exact attention's mean distance |i − j| is {shown} tokens"


def _option_axis(axes: Axes, values: list[Any], option: str) -> Callable[[Any], float]:
    """Set up the x axis for an option's values; returns value -> x position. Log₂ for
    positive numbers spanning 4× or more, linear for other numbers, evenly spaced
    categories for anything else."""
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    axes.set_xlabel(option)
    if numeric:
        if min(values) > 0 and max(values) >= 4 * min(values):
            axes.set_xscale("log", base=2)
        axes.xaxis.set_major_locator(FixedLocator(sorted(set(values))))
        axes.xaxis.set_major_formatter(lambda value, _: f"{value:g}")
        axes.xaxis.set_minor_locator(NullLocator())
        return float
    categories = list(dict.fromkeys(format_value(v) for v in sorted(values, key=_sort_key)))
    axes.set_xticks(range(len(categories)), categories)
    return lambda value: float(categories.index(format_value(value)))


def fidelity_vs_option(run: RunData, variant: str, option: str) -> Figure:
    """One variant's fidelity against one swept option, a line per n (shaded)."""
    rows = [r for r in _measured(run) if r["variant"] == variant and option in r["options"]]
    timed = any(r.get("time_ms") for r in rows)
    figure = new_figure(3 if timed else 2, f"Fidelity of {variant} vs {option}")
    axes_pair = _frame(figure)
    values = [r["options"][option] for r in rows]
    position = _option_axis(axes_pair[0], values, option)
    for axes in figure.axes[1:]:
        _option_axis(axes, values, option)
    # Other swept options split the lines too, e.g. k swept with sharing.
    others = [o for o in swept_options(rows).get(variant, []) if o != option]
    groups: dict[tuple, list[Row]] = {}
    for row in rows:
        rest = tuple(format_value(row["options"].get(o)) for o in others)
        groups.setdefault((row["seq_len"], rest), []).append(row)
    notes = []
    for index, ((n, rest), group) in enumerate(sorted(groups.items())):
        group.sort(key=lambda r: _sort_key(r["options"][option]))
        xs = [position(r["options"][option]) for r in group]
        label = f"n={n}" + "".join(f" {o}={v}" for o, v in zip(others, rest, strict=True))
        colour = shade(variant, index, len(groups))
        notes += _draw(axes_pair, xs, group, colour, label)
        if timed:
            _cost_panel(figure.axes[2], xs, group, colour)
    _log_errors(axes_pair[0])
    if timed:
        cost = figure.axes[2]
        log_axis(cost, _plotted(cost))
        cost.set_ylabel(f"median {group[0].get('pass', 'forward')} time (ms)")
        cost.set_title("cost (lower is better)", fontsize=10)
    locality = _locality_note(rows)
    legend(figure, _input_handles(), title=variant)
    finish(figure, run, ([locality] if locality else []) + notes)
    return figure


def fidelity_vs_length(run: RunData) -> Figure:
    """Every setup's fidelity against n (for runs that sweep no option)."""
    rows = _measured(run)
    figure = new_figure(2, "Fidelity to exact attention vs sequence length")
    axes_pair = _frame(figure)
    notes = []
    for label in run.labels(rows):
        series = run.series[label]
        group = sorted((r for r in rows if r["label"] == label), key=lambda r: r["seq_len"])
        notes += _draw(
            axes_pair, [r["seq_len"] for r in group], group, series_colour(series), series.legend
        )
    for axes in axes_pair:
        set_length_axis(axes, [r["seq_len"] for r in rows])
    _log_errors(axes_pair[0])
    locality = _locality_note(rows)
    legend(figure, _input_handles())
    finish(figure, run, ([locality] if locality else []) + notes)
    return figure


def _sort_key(value: Any) -> tuple[int, Any]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value)
    return (1, format_value(value))


def fidelity_figures(run: RunData) -> dict[str, Figure]:
    """stem -> figure: one per swept (variant, option) with fidelity rows, or one against
    n when nothing is swept; empty when the run measured no fidelity."""
    rows = _measured(run)
    if not rows:
        return {}
    figures = {}
    for variant, options in swept_options(rows).items():
        for option in options:
            if all(option in r["options"] for r in rows if r["variant"] == variant):
                figures[f"fidelity_vs_{variant}_{option}"] = fidelity_vs_option(
                    run, variant, option
                )
    if not figures:
        figures["fidelity_vs_n"] = fidelity_vs_length(run)
    return figures
