"""Passkey retrieval as needle-in-a-haystack reports draw it (Kamradt 2023; RULER, Hsieh
et al. 2024, whose single-needle tasks these are; the probe itself is Mohtashami & Jaggi
2023's passkey retrieval, "Landmark Attention", §4.2): one heatmap per setup, context
length across, the needle's depth in its filler down (0 % = where the filler starts), each
cell coloured by exact match from 0 to 1 and annotated with it and, smaller, the key's
mean log-likelihood in bits.

Setups and panels are named as the bits-per-byte figure names them (its `language_panels`
and setups: the task less the model settings, the training length, the setup's label and
own settings). The training length's column is framed; a length a setup could not run at
(unsupported, error) is a grey hatched column naming its status; the chance level is in
the footnote.

The rows are the language rows (one per setup, task and evaluation length) with the
fields the runner writes for the probe: `passkey_depths`, `passkey_exact` and
`passkey_log_likelihood` (per depth, means over seeds), `passkey_exact_per_seed`,
`passkey_chance_log_likelihood` and `passkey_trials`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Colormap, Normalize, to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from playground.report.plots.bits_per_byte import (
    language_failure_note,
    language_panels,
    language_setups,
)
from playground.report.plots.data import RunData
from playground.report.plots.style import finish, new_figure, readable, variant_colour
from playground.report.task_rows import OK
from playground.run.row_schema import Row

COLOURMAP = "viridis"
"""Sequential, dark (0: never retrieved) to bright (1: always)."""
COLUMNS = 3
"""Panels per line of the figure."""
NOT_SCORED_GREY = "0.86"
TRAINING_LENGTH_FRAME = "0.1"


@dataclass(frozen=True)
class Panel:
    """One setup's heatmap: its rows by evaluation length, on its task's lengths and depths."""

    task: str
    train_length: Any
    setup: str
    variant: str
    rows: dict[int, Row]
    lengths: list[int]
    depths: list[float]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def probed(row: Row) -> bool:
    """Whether `row` holds a passkey score: depths, and an exact match and a log-likelihood
    per depth, every one a finite number."""
    if row.get("status", OK) != OK:
        return False
    depths = row.get("passkey_depths")
    fields = [depths, row.get("passkey_exact"), row.get("passkey_log_likelihood")]
    lists = [each for each in fields if isinstance(each, list)]
    return (
        len(lists) == len(fields)
        and bool(lists[0])
        and all(len(each) == len(lists[0]) for each in lists)
        and all(_is_number(value) for each in lists for value in each)
    )


def passkey_panels(run: RunData) -> list[Panel]:
    """One panel per setup of every (task, training length) that has a probed row, in the
    bits-per-byte figure's order; a task's panels share its lengths and depths."""
    panels = []
    for (task, train_length), rows in language_panels(run).items():
        scored = [row for row in rows if probed(row)]
        if not scored:
            continue
        lengths = {r["eval_length"] for r in rows if isinstance(r.get("eval_length"), int)}
        if isinstance(train_length, int):
            lengths.add(train_length)
        depths = sorted({float(depth) for row in scored for depth in row["passkey_depths"]})
        for setup, setup_rows in language_setups(run, rows).items():
            by_length = {
                r["eval_length"]: r for r in setup_rows if isinstance(r.get("eval_length"), int)
            }
            variant = str(setup_rows[0].get("variant", setup))
            panels.append(
                Panel(task, train_length, setup, variant, by_length, sorted(lengths), depths)
            )
    return panels


def _text_colour(face: Any) -> str:
    """Black on a light cell, white on a dark one."""
    red, green, blue = to_rgb(face)
    return "black" if 0.299 * red + 0.587 * green + 0.114 * blue > 0.5 else "white"


def _cells(axes: Axes, panel: Panel, column: int, row: Row, colours: Colormap) -> None:
    """The probed row's column: a cell per depth, coloured by exact match, annotated."""
    scores = {
        float(depth): (exact, bits)
        for depth, exact, bits in zip(
            row["passkey_depths"], row["passkey_exact"], row["passkey_log_likelihood"], strict=True
        )
    }
    for line, depth in enumerate(panel.depths):
        if depth not in scores:
            continue
        exact, bits = scores[depth]
        face = colours(min(1.0, max(0.0, exact)))
        axes.add_patch(
            Rectangle(
                (column, line),
                1,
                1,
                facecolor=face,
                edgecolor="white",
                gid=f"passkey:{panel.lengths[column]}:{depth:g}",
            )
        )
        ink = _text_colour(face)
        axes.text(column + 0.5, line + 0.4, f"{exact:.2f}", ha="center", va="center", fontsize=8, color=ink)  # fmt: skip
        axes.text(column + 0.5, line + 0.75, f"{bits:.1f} bits", ha="center", va="center", fontsize=6, color=ink)  # fmt: skip


def _unscored(axes: Axes, panel: Panel, column: int, status: str) -> None:
    """A column the setup has no score for: grey, hatched, its status written down it."""
    axes.add_patch(
        Rectangle(
            (column, 0),
            1,
            len(panel.depths),
            facecolor=NOT_SCORED_GREY,
            edgecolor="0.6",
            hatch="//",
            linewidth=0.5,
            gid=f"passkey:{panel.lengths[column]}:{status}",
        )
    )
    axes.text(
        column + 0.5,
        len(panel.depths) / 2,
        status,
        ha="center",
        va="center",
        rotation=90,
        fontsize=8,
        color="0.25",
        bbox={"facecolor": NOT_SCORED_GREY, "linewidth": 0, "pad": 1},
    )


def _draw(axes: Axes, panel: Panel, colours: Colormap, *, with_task: bool) -> None:
    for column, length in enumerate(panel.lengths):
        row = panel.rows.get(length)
        if row is not None and probed(row):
            _cells(axes, panel, column, row, colours)
        else:
            status = "not run" if row is None else str(row.get("status", "error"))
            _unscored(axes, panel, column, "no probe" if status == OK else status)
    labels = [str(length) for length in panel.lengths]
    if panel.train_length in panel.lengths:
        column = panel.lengths.index(panel.train_length)
        labels[column] = f"L = {panel.train_length}"
        axes.add_patch(
            Rectangle(
                (column, 0),
                1,
                len(panel.depths),
                fill=False,
                edgecolor=TRAINING_LENGTH_FRAME,
                linewidth=2.0,
                zorder=4,
                gid="passkey:training-length",
            )
        )
    axes.set_xlim(0, len(panel.lengths))
    axes.set_ylim(len(panel.depths), 0)  # depth 0 at the top, as the filler is read
    axes.set_xticks([x + 0.5 for x in range(len(panel.lengths))], labels, fontsize=8)
    axes.set_yticks(
        [y + 0.5 for y in range(len(panel.depths))],
        [f"{depth:.0%}" for depth in panel.depths],
        fontsize=8,
    )
    axes.tick_params(length=0)
    axes.set_xlabel("context length (bytes)")
    axes.set_ylabel("needle depth in the filler")
    where = f"\n{panel.task}: trained at L = {panel.train_length}" if with_task else ""
    axes.set_title(
        f"{panel.setup}{where}", fontsize=9, color=readable(variant_colour(panel.variant))
    )


def _reading_notes(panels: list[Panel]) -> list[str]:
    """What the colours and numbers are, then the chance level and the trials behind them."""
    row = next(r for panel in panels for r in panel.rows.values() if probed(r))
    chance = row.get("passkey_chance_log_likelihood")
    per_seed = row.get("passkey_exact_per_seed")
    seeds = len(per_seed) if isinstance(per_seed, list) else len(row.get("seeds") or []) or "?"
    level = "chance not recorded"
    if isinstance(chance, int | float) and _is_number(chance):
        level = (
            f"chance: {chance:.1f} bits (a uniform guess of the key's digits), exact match "
            f"{2.0**chance:.0e}"
        )
    return [
        "passkey retrieval: colour and upper number = exact match (every key digit the "
        "argmax, as greedy decoding writes it), lower = mean log2 P(key) in bits; framed: the "
        "training length; hatched: not scored",
        f"{level}; {row.get('passkey_trials', '?')} prompts per cell, mean over {seeds} seeds",
    ]


def passkey_figure(run: RunData) -> Figure | None:
    """Exact match over depth × context length, one heatmap per setup; None when no
    language row holds a passkey score."""
    panels = passkey_panels(run)
    if not panels:
        return None
    columns = min(COLUMNS, len(panels))
    lines = math.ceil(len(panels) / columns)
    figure = new_figure(
        columns,
        "Passkey retrieval: exact match by needle depth and context length (higher is better)",
        rows=lines,
        extra_width=1.2,
    )
    drawn = figure.axes[: len(panels)]
    for spare in figure.axes[len(panels) :]:
        spare.remove()
    colours = colormaps[COLOURMAP]
    notes = _reading_notes(panels)
    # one task: said once, in a note, since a long task label would overrun the panels
    tasks = {(panel.task, panel.train_length) for panel in panels}
    if len(tasks) == 1:
        notes.insert(0, f"{panels[0].task}: trained at L = {panels[0].train_length}")
    for axes, panel in zip(drawn, panels, strict=True):
        _draw(axes, panel, colours, with_task=len(tasks) > 1)
        notes.extend(
            language_failure_note(row) for row in panel.rows.values() if row.get("status", OK) != OK
        )
    scale = ScalarMappable(norm=Normalize(0.0, 1.0), cmap=colours)
    figure.colorbar(scale, ax=drawn, label="exact match (fraction of prompts)", shrink=0.8)
    finish(figure, run, notes)
    return figure
