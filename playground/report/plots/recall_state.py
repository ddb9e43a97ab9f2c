"""Recall against state size (Zoology, Arora et al. 2023, Fig. 2; Based, Arora et al.
2024, Fig. 1): accuracy on each task against the bytes a model keeps per sequence to
decode at the task's length (`playground.run.state_size`), on a log axis, with the Pareto
frontier: the setups that no other setup beats with fewer bytes.

Drawn for accuracy rows that carry `state_bytes`; one panel per task and length, one
colour and marker per variant, each point labelled with the options that set its state
(its swept variant options, and its width where the widths differ). A setup that cannot
decode is placed by exact attention's key/value bytes, drawn hollow and said so.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import NullFormatter

from playground.report.plots.accuracy import CHANCE_STYLE, task_name
from playground.report.plots.data import OK, RunData
from playground.report.plots.style import (
    POINT_MARKERS,
    finish,
    legend,
    log_axis,
    new_figure,
    variant_colour,
)
from playground.run.row_schema import Row
from playground.run.state_size import KEY_VALUE_BYTES, RECOMPUTED_INPUTS
from playground.run.stats import accuracy_error_bar

FRONTIER_STYLE: dict[str, Any] = dict(color="0.25", linewidth=1.4, linestyle="-", zorder=1)


def pareto_frontier(points: Sequence[tuple[float, float]]) -> list[int]:
    """The indices of the (bytes, accuracy) points on the upper-left staircase, by
    increasing bytes: those that no other point matches or beats on both (as few bytes or
    fewer, as accurate or more, better on one). Of identical points the first counts."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1], i))
    front: list[int] = []
    for index in order:
        if not front or points[index][1] > points[front[-1]][1]:
            front.append(index)
    return front


def _panel_key(row: Row) -> str:
    """One panel per task and its options (its length among them): the widths and
    setups of a study share it, whatever their labels append."""
    return json.dumps([row["task"], row.get("task_options") or {}], sort_keys=True)


def _width(row: Row) -> Any:
    return (row.get("model") or {}).get("d_model", row.get("d_model"))


def _point(row: Row) -> tuple[float, float]:
    """(state bytes, accuracy) of a row the figure draws (`recall_state_figure` keeps only
    rows that hold both)."""
    state, accuracy = row.get("state_bytes"), row.get("accuracy_mean")
    assert state is not None and accuracy is not None, "a drawn row holds both"
    return float(state), float(accuracy)


def _point_label(run: RunData, row: Row, swept_widths: set[str]) -> str:
    """What sets this point's state: its variant's swept options, and its width where
    the variant is drawn at several (`swept_widths`: those variants)."""
    series = run.series[row["label"]]
    options = series.legend.split(" ", 1)[1] if " " in series.legend else ""
    shown = series.variant in swept_widths and _width(row) is not None
    width = f"d_model={_width(row)}" if shown else ""
    return " ".join(part for part in (options, width) if part) or series.variant


def recall_state_figure(run: RunData) -> Figure | None:
    """Accuracy against decoding state bytes per sequence, one panel per task, with the
    frontier; None when no ok accuracy row carries `state_bytes`."""
    rows = [
        row
        for row in run.accuracy
        if row.get("status", OK) == OK
        and row.get("accuracy_mean") is not None
        and row.get("state_bytes")
    ]
    if not rows:
        return None
    panels: dict[str, list[Row]] = {}
    for row in rows:
        panels.setdefault(_panel_key(row), []).append(row)
    figure = new_figure(len(panels), "Recall against decoding state (upper left is better)")
    variants = list(dict.fromkeys(run.series[label].variant for label in run.labels(rows)))
    marker = {variant: POINT_MARKERS[i % len(POINT_MARKERS)] for i, variant in enumerate(variants)}
    notes: list[str] = []
    for axes, panel in zip(figure.axes, panels.values(), strict=True):
        widths: dict[str, set[Any]] = {}
        for row in panel:
            widths.setdefault(run.series[row["label"]].variant, set()).add(_width(row))
        swept_widths = {variant for variant, found in widths.items() if len(found - {None}) > 1}
        points = [_point(row) for row in panel]
        for row, (x, y) in zip(panel, points, strict=True):
            variant = run.series[row["label"]].variant
            colour = variant_colour(variant)
            estimated = row.get("state_source") == KEY_VALUE_BYTES
            axes.errorbar(
                x,
                y,
                yerr=[[part] for part in accuracy_error_bar(row)],
                color=colour,
                marker=marker[variant],
                markerfacecolor="white" if estimated else colour,
                markersize=7,
                capsize=3,
                linestyle="none",
                label=variant,
                zorder=3,
            )
            axes.annotate(
                _point_label(run, row, swept_widths),
                (x, y),
                xytext=(4, 4),
                textcoords="offset points",
                fontsize=6.5,
                color="0.25",
            )
        front = pareto_frontier(points)
        axes.step(
            [points[i][0] for i in front],
            [points[i][1] for i in front],
            where="post",
            label="Pareto frontier",
            **FRONTIER_STYLE,
        )
        title = min((task_name(row) for row in panel), key=len)
        length = (panel[0].get("task_options") or {}).get("seq_len")
        members = ", ".join(
            f"{run.series[panel[i]['label']].variant} {_point_label(run, panel[i], swept_widths)}"
            for i in front
        )
        notes.append(f"{title}: frontier {members}")
        chance = panel[0].get("chance")
        if chance is not None:
            axes.axhline(chance, **CHANCE_STYLE)
        log_axis(axes, [x for x, _ in points], which="x")
        axes.xaxis.set_minor_formatter(NullFormatter())  # within two decades they collide
        axes.set_xlabel(f"decoding state per sequence at n={length} (bytes, all layers)")
        axes.set_ylabel("accuracy (mean, 95% interval over seeds)")
        axes.set_ylim(0, 1.05)
        axes.set_title(title, fontsize=10)
        axes.grid(True, alpha=0.3)
    extra = [Line2D([], [], label="chance level", **CHANCE_STYLE)]
    if any(row.get("state_source") == KEY_VALUE_BYTES for row in rows):
        extra.append(
            Line2D(
                [],
                [],
                linestyle="none",
                marker="o",
                color="0.2",
                markerfacecolor="white",
                label="hollow: no decoding state,\nplaced by its key/value bytes",
            )
        )
    recomputed = sorted(
        {run.series[r["label"]].variant for r in rows if r.get("state_source") == RECOMPUTED_INPUTS}
    )
    if recomputed:
        notes.append(
            f"state = inputs kept, attention recomputed per token: {', '.join(recomputed)}"
        )
    legend(figure, extra)
    finish(figure, run, notes)
    return figure
