"""Language models: bits per byte at each position of the longest evaluation window, one
line per setup with its 95% interval over seeds, the training length marked.

The extrapolation figure says *that* a model breaks beyond its training length L; this one
says *where*: just past L (sinusoidal positions that never saw position L + 1), gradually
(rotary), or not at all (ALiBi, a window). It reads each setup's row at its longest scored
evaluation length, whose `bits_per_byte_by_position` averages the loss over buckets of
`position_bucket` positions of every held-out window (FLA's evals/ppl.py reports loss per
position bucket the same way). One panel per task and training length, as in the
extrapolation figure; setups with model settings of their own take its line styles.
"""

from __future__ import annotations

import math

from matplotlib.figure import Figure

from playground.report.plots.bits_per_byte import (
    corpus_note,
    draw_baselines,
    language_failure_note,
    language_panels,
    language_setups,
    mark_training_length,
    own_settings,
    panel_title,
    scored_row,
    setting_styles,
    shared_settings,
)
from playground.report.plots.data import RunData
from playground.report.plots.style import finish, legend, new_figure, series_colour
from playground.run.row_schema import Row

CLIP_FACTOR = 1.5
"""The y axis stops at this many times the unigram baseline (a model past it knows less
than byte frequencies): a sinusoidal model's loss far past L would flatten every other
line; clipped lines are named in a note."""


def positions(row: Row) -> tuple[list[float], list[float], list[float]] | None:
    """(bucket centres, bits per byte, 95% half-widths) of a row, None when it has none."""
    values = row.get("bits_per_byte_by_position")
    bucket = row.get("position_bucket")
    length = row.get("eval_length")
    if not values or not isinstance(bucket, int) or not isinstance(length, int):
        return None
    halves = row.get("bits_per_byte_by_position_ci95") or [None] * len(values)
    starts = range(0, length, bucket)
    centres = [start + min(bucket, length - start) / 2 for start in starts]
    return centres, list(values), [half or 0.0 for half in halves]


def longest(rows: list[Row]) -> Row | None:
    """The scored row of the longest evaluation length that has the loss by position."""
    found = [row for row in rows if scored_row(row) and positions(row) is not None]
    return max(found, key=lambda row: row["eval_length"], default=None)


def position_loss_figure(run: RunData) -> Figure | None:
    """Bits per byte against position, one line per setup; None without language rows
    that carry the loss by position (runs from before it was recorded)."""
    panels = {key: rows for key, rows in language_panels(run).items() if longest(rows)}
    if not panels:
        return None
    styles = setting_styles(run)
    figure = new_figure(len(panels), "Bits per byte by position in the window (lower is better)")
    notes: list[str] = []
    for axes, ((task, train_length), rows) in zip(figure.axes, panels.items(), strict=True):
        unigram = next(
            (r["unigram_bits_per_byte"] for r in rows if r.get("unigram_bits_per_byte")), None
        )
        ceiling = CLIP_FACTOR * unigram if isinstance(unigram, float) else math.inf
        top = 0.0
        for setup, setup_rows in language_setups(run, rows).items():
            row = longest(setup_rows)
            if row is None:
                notes.extend(language_failure_note(r) for r in setup_rows if not scored_row(r))
                continue
            drawn = positions(row)
            assert drawn is not None
            centres, values, halves = drawn
            series = run.series[row["label"]]
            colour = series_colour(series)
            style = styles[own_settings(row, shared_settings(run.language))]
            axes.plot(centres, values, color=colour, linestyle=style, linewidth=1.5, label=setup)
            axes.fill_between(
                centres,
                [v - h for v, h in zip(values, halves, strict=True)],
                [v + h for v, h in zip(values, halves, strict=True)],
                color=colour,
                alpha=0.15,
                linewidth=0,
            )
            finite = [v for v in values if math.isfinite(v)]
            top = max(top, *finite) if finite else top
            if any(v > ceiling for v in values):
                notes.append(
                    f"{setup}: above {ceiling:.2f} bits per byte (clipped) from position "
                    f"{centres[next(i for i, v in enumerate(values) if v > ceiling)]:.0f}, "
                    f"peak {max(finite):.2f}"
                )
        if isinstance(train_length, int):
            mark_training_length(axes, train_length)
        draw_baselines(axes, rows)
        axes.set_ylim(0.0, min(top * 1.05, ceiling) if top else None)
        axes.set_xlim(0.0, None)
        axes.set_xlabel(
            f"position in the window (bytes; buckets of {rows[0].get('position_bucket')})"
        )
        axes.set_ylabel("bits per byte (mean, 95% interval over seeds)")
        axes.set_title(panel_title(task, rows, train_length), fontsize=10)
        axes.grid(True, alpha=0.3)
        note = corpus_note(task, rows)
        if note:
            notes.insert(0, note)
    if len(figure.axes) == 1:
        figure.axes[0].legend(fontsize=7, loc="best")
    else:
        legend(figure, title="setup")
    finish(figure, run, notes)
    return figure
