"""What every figure shares: a variant's colour, a point's shade and marker, the
environment footnote, the markers of failed cells, and saving in several formats.

Figures are `matplotlib.figure.Figure` objects, never pyplot's global state, so plotting
is headless (Agg) and thread-safe by construction.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.colors import to_hex, to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import LogFormatter
from matplotlib.transforms import blended_transform_factory

from playground.report.plots.data import RunData, Series, declared
from playground.run.row_schema import Row

PALETTE = (
    "#1f77b4",  # blue
    "#ff7f0e",  # orange
    "#2ca02c",  # green
    "#d62728",  # red
    "#9467bd",  # purple
    "#8c564b",  # brown
    "#e377c2",  # pink
    "#17becf",  # cyan
    "#bcbd22",  # olive
    "#7f7f7f",  # grey
    "#393b79",  # indigo
    "#637939",  # moss
)
"""Colours of variants that declare none: chosen by a hash of the name (crc32, the same
in every process and run)."""

POINT_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")

STATUS_MARKERS = {"oom": "v", "error": "X", "unsupported": "s", "invalid": "d"}
"""Where a cell failed, a marker at the foot of the axes in the series' colour:
OOM ▽, error ✕, unsupported □ (hollow), invalid ◆ (thin: the call returned something the
contract forbids, such as NaN or a wrong shape)."""

FORMATS = ("png", "svg", "pdf")
DPI = 130
PANEL_SIZE = (5.2, 3.9)
"""Inches per panel; the legend column and footnote add to it."""


WIDE_PALETTE = tuple(
    to_hex(colormaps[name](index))  # an integer picks a listed map's colour `index`
    for name in ("tab20", "tab20b")
    for index in range(colormaps[name].N)
)
"""Forty distinguishable colours, used in order when the hashed colours of a run's
variants collide (a run with many variants), so no two legend entries share a colour."""

_ASSIGNED: dict[str, str] = {}


def assign_colours(variants: Iterable[str]) -> None:
    """Fix the colours of one run's variants before drawing it: declared colours stay;
    the others keep their hashed colour unless two would share one, in which case they
    take unused colours of WIDE_PALETTE in name order."""
    _ASSIGNED.clear()
    names = sorted(set(variants))
    taken = {v: declared(v, "colour") for v in names}
    undeclared = [v for v in names if not taken[v]]
    hashed = {v: PALETTE[zlib.crc32(v.encode()) % len(PALETTE)] for v in undeclared}
    used = {to_hex(c) for c in taken.values() if c}
    if len(set(hashed.values())) == len(hashed) and not used & set(hashed.values()):
        return
    free = [c for c in WIDE_PALETTE if c not in used]
    for index, variant in enumerate(undeclared):
        _ASSIGNED[variant] = free[index % len(free)] if free else hashed[variant]


def variant_colour(variant: str) -> str:
    """A variant's colour, the same in every figure and run: the one its class declares
    (`AttentionVariant.colour`), else one from a hash of its name (also for a variant of
    an old run that is no longer registered), unless `assign_colours` had to separate
    colliding ones for this run."""
    return (
        declared(variant, "colour")
        or _ASSIGNED.get(variant)
        or PALETTE[zlib.crc32(variant.encode()) % len(PALETTE)]
    )


def readable(colour: Any) -> tuple[float, float, float]:
    """`colour` darkened just enough for text on white to have a contrast ratio of at
    least 4.5 (WCAG AA): pale variant colours (light blue, yellow) keep their hue but stay
    legible as panel titles."""
    rgb = to_rgb(colour)
    for _ in range(20):
        if _contrast_on_white(rgb) >= 4.5:
            break
        rgb = (rgb[0] * 0.85, rgb[1] * 0.85, rgb[2] * 0.85)
    return rgb


def _contrast_on_white(rgb: tuple[float, float, float]) -> float:
    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    luminance = 0.2126 * linear(rgb[0]) + 0.7152 * linear(rgb[1]) + 0.0722 * linear(rgb[2])
    return 1.05 / (luminance + 0.05)


def shade(variant: str, index: int, count: int) -> tuple[float, float, float]:
    """The variant's colour, lighter for the first of `count` items and darker for the
    last, so a sweep reads as one hue in order."""
    base = to_rgb(variant_colour(variant))
    if count <= 1:
        return base
    shift = -0.5 + 0.85 * index / (count - 1)  # -0.5 (light) … 0.35 (dark)
    target = (1.0, 1.0, 1.0) if shift < 0 else (0.0, 0.0, 0.0)
    r, g, b = (c + (t - c) * abs(shift) for c, t in zip(base, target, strict=True))
    return (r, g, b)


def series_colour(series: Series) -> tuple[float, float, float]:
    """A setup's colour: its variant's hue, shaded by its place in the sweep."""
    return shade(series.variant, series.point, series.points)


def series_marker(series: Series) -> str:
    return POINT_MARKERS[series.point % len(POINT_MARKERS)]


def new_figure(panels: int, title: str, rows: int = 1, extra_width: float = 2.6) -> Figure:
    """A figure of `rows` × `panels` axes, titled, with room for a legend at the right."""
    width = PANEL_SIZE[0] * panels + extra_width
    figure = Figure(figsize=(width, PANEL_SIZE[1] * rows + 0.9), layout="constrained")
    figure.subplots(rows, panels, squeeze=False)
    figure.suptitle(title, fontsize=12)
    return figure


def finish(figure: Figure, run: RunData, notes: Sequence[str] = (), max_notes: int = 6) -> None:
    """The footnote: the environment line, then up to `max_notes` notes (failed cells,
    points left out) and how many more the report lists."""
    lines = [run.environment_note()]
    lines.extend(notes[:max_notes])
    if len(notes) > max_notes:
        lines.append(f"… and {len(notes) - max_notes} more (see report.html)")
    figure.supxlabel("\n".join(lines), fontsize=7, color="0.35", ha="left", x=0.01)


def legend(figure: Figure, extra: Sequence[Any] = (), title: str | None = None) -> None:
    """One legend for the whole figure, outside the axes on the right: every labelled
    artist once (the first axes that has it), then `extra` handles (failure markers)."""
    seen: dict[str, Any] = {}
    for axes in figure.axes:
        handles, labels = axes.get_legend_handles_labels()
        for handle, label in zip(handles, labels, strict=True):
            seen.setdefault(label, handle)
    handles = [*seen.values(), *extra]
    labels = [*seen, *(handle.get_label() for handle in extra)]
    if handles:
        figure.legend(handles, labels, loc="outside right center", fontsize=8, title=title)


def status_handles(statuses: Iterable[str]) -> list[Line2D]:
    """Legend entries explaining the failure markers that appear."""
    present = [s for s in STATUS_MARKERS if s in set(statuses)]
    return [
        Line2D(
            [],
            [],
            linestyle="none",
            marker=STATUS_MARKERS[status],
            color="0.2",
            markerfacecolor="none" if status == "unsupported" else "0.2",
            label=f"{status} (not measured)",
        )
        for status in present
    ]


def mark_failures(
    axes: Axes, points: list[tuple[float, str]], colour: Any, stack: dict[float, int] | None = None
) -> None:
    """Failed cells at their x, on the foot of the axes (they have no y to plot). `stack`
    counts the markers already at each x of these axes, so a second one sits above the
    first instead of hiding it."""
    stack = {} if stack is None else stack
    transform = blended_transform_factory(axes.transData, axes.transAxes)
    for x, status in points:
        level = stack.get(x, 0)
        stack[x] = level + 1
        marker = STATUS_MARKERS.get(status, "X")
        axes.plot(
            [x],
            [0.03 + 0.06 * level],
            transform=transform,
            linestyle="none",
            marker=marker,
            markersize=8,
            color=colour,
            markerfacecolor="none" if status == "unsupported" else colour,
            clip_on=False,
            zorder=5,
        )


def failure_note(row: Row, legend: str) -> str:
    """One line for a failed cell: where, what status, the first line of its error."""
    where = [legend]
    if "seq_len" in row:
        where.append(f"n={row['seq_len']}")
    if row.get("pass"):
        where.append(row["pass"])
    if row.get("task"):
        where.append(str(row.get("task_label") or row["task"]))
    message = (row.get("error") or "").strip().splitlines()
    detail = f": {message[0][:110]}" if message else ""
    return f"{row.get('status', '?')}: {' '.join(where)}{detail}"


def log_axis(axes: Axes, values: Sequence[float], which: str = "y") -> None:
    """Log axis (y, or x with which="x") labelled in plain numbers (30, not 3×10¹);
    within two decades the minor ticks are labelled too, as matplotlib chooses them."""
    axis = axes.yaxis if which == "y" else axes.xaxis
    (axes.set_yscale if which == "y" else axes.set_xscale)("log")
    axis.set_major_formatter(LogFormatter())
    positive = [v for v in values if v > 0]
    if positive and max(positive) < 100 * min(positive):
        axis.set_minor_formatter(PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(2, 1)))


class PlainLogFormatter(LogFormatter):
    """LogFormatter's choice of which ticks to label, written as plain numbers (0.3, not
    3e-01)."""

    def _num_to_string(self, x: float, vmin: float, vmax: float) -> str:
        return f"{x:g}"


def save(figure: Figure, out_dir: Path, stem: str, formats: Sequence[str]) -> list[Path]:
    """Write the figure once per format; returns the files written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        path = out_dir / f"{stem}.{fmt}"
        figure.savefig(path, dpi=DPI, bbox_inches="tight")  # long footnotes and legends too
        paths.append(path)
    return paths
