"""Cost against sequence length: time, peak memory and efficiency vs n, one panel per
pass, one line per setup, fitted exponents in the legend. The decode pass has figures of
its own: the time of one generated token against the context length, beside (dashed) the
time to read the variant's state once at the measured memory bandwidth, and the bytes of
the decoding state per sequence against the context length."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, TypeGuard

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

from playground.report.plots.data import OK, RunData
from playground.report.plots.style import (
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
from playground.report.summary import PASS_TITLES, exponents
from playground.run.instruments import LIMIT_FLAGS
from playground.run.row_schema import Row
from playground.run.spec import DECODE

MeasuredField = Literal[
    "time_ms", "peak_memory_bytes", "efficiency", "state_bytes", "read_limit_ms"
]
"""The fields of a cost row the figures draw against n."""


@dataclass(frozen=True)
class Metric:
    stem: str
    key: MeasuredField
    title: str
    axis_label: str
    scale: float = 1.0
    log_y: bool = True
    exponent: int | None = None
    """Index into summary.exponents(): 0 time, 1 memory; None: no fit shown."""
    decode: bool = False
    """Drawn from the decode pass's rows only (x: the context length); else from the
    whole passes' (forward, forward + backward)."""
    limit_key: MeasuredField | None = None
    """A row's floor for `key`, drawn dashed in the setup's colour (decode: reading the
    state once at the measured bandwidth)."""
    timed: bool = True
    """Whether `key` depends on a timing, so that a flagged row's point is drawn hollow;
    a state's bytes are counted, not timed, and no timing flag doubts them."""

    def shows(self, pass_name: str) -> bool:
        return (pass_name == DECODE) == self.decode


TIME = Metric(
    "time_vs_n", "time_ms", "Time vs sequence length", "median time per call (ms)", exponent=0
)
MEMORY = Metric(
    "memory_vs_n",
    "peak_memory_bytes",
    "Peak memory vs sequence length",
    "peak memory above the inputs (MiB)",
    scale=1 / 2**20,
    exponent=1,
)
EFFICIENCY = Metric(
    "efficiency_vs_n",
    "efficiency",
    "Efficiency vs sequence length",
    "useful FLOP/s ÷ measured GEMM FLOP/s",
    log_y=False,
)
DECODE_TIME = Metric(
    "decode_time_vs_n",
    "time_ms",
    "Decoding: time per generated token vs context length",
    "median time per token (ms)",
    exponent=0,
    decode=True,
    limit_key="read_limit_ms",
)
STATE = Metric(
    "decode_state_vs_n",
    "state_bytes",
    "Decoding state vs context length",
    "decoding state per sequence (MiB)",
    scale=1 / 2**20,
    exponent=1,
    decode=True,
    timed=False,
)
METRICS = (TIME, MEMORY, EFFICIENCY, DECODE_TIME, STATE)


def set_length_axis(axes: Axes, lengths: list[int], decode: bool = False) -> None:
    """Log₂ x axis with a tick at every measured n, written as integers."""
    axes.set_xscale("log", base=2)
    axes.xaxis.set_major_locator(FixedLocator(sorted(set(lengths))))
    axes.xaxis.set_major_formatter(lambda value, _: f"{value:.0f}")
    axes.xaxis.set_minor_locator(NullLocator())
    axes.xaxis.set_minor_formatter(NullFormatter())
    low, high = min(lengths), max(lengths)
    axes.set_xlim(low / 1.3, high * 1.3)
    axes.set_xlabel(f"{'context' if decode else 'sequence'} length n (tokens)")


def _reference_slopes(axes: Axes, anchors: list[tuple[int, float]]) -> None:
    """Faint n and n² through the geometric mean of the shortest length's values."""
    shortest = min(n for n, _ in anchors)
    values = [v for n, v in anchors if n == shortest]
    start = math.exp(sum(math.log(v) for v in values) / len(values))
    longest = max(n for n, _ in anchors)
    for power, text in ((1, "∝ n"), (2, "∝ n²")):
        end = start * (longest / shortest) ** power
        axes.plot(
            [shortest, longest], [start, end], color="0.6", linestyle=":", linewidth=1, zorder=0
        )
        axes.annotate(
            text,
            (longest, end),
            xytext=(3, 0),
            textcoords="offset points",
            color="0.5",
            fontsize=8,
            va="center",
        )


def _exponent_text(run: RunData, label: str, metric: Metric, passes: list[str]) -> str:
    """`n^1.98 | n^1.95` (mathtext): the fitted exponent per pass of `passes`, '–' where
    none can be shown (fewer than three lengths, or a doubtful fit: summary.exponents);
    empty when no pass has one."""
    if metric.exponent is None:
        return ""
    fitted = []
    for pass_name in passes:
        rows = [r for r in run.measurements if r["label"] == label and r["pass"] == pass_name]
        fitted.append(exponents(rows)[metric.exponent] if rows else None)
    if all(value is None for value in fitted):
        return ""
    return "  " + " | ".join("–" if v is None else f"$n^{{{v:.2f}}}$" for v in fitted)


def scaling_figure(run: RunData, metric: Metric) -> Figure | None:
    """One metric vs n; None when no row of the passes it shows measured it."""
    rows = [row for row in run.measurements if metric.shows(row.get("pass") or "")]
    if not any(row.get(metric.key) is not None for row in rows):
        return None
    # Only the passes that measure it: a forward_backward row may have no fidelity, say.
    passes = [
        p for p in run.passes if any(r.get(metric.key) is not None for r in rows if r["pass"] == p)
    ]
    figure = new_figure(len(passes), metric.title)
    lengths = [row["seq_len"] for row in rows]
    fitted = {label: _exponent_text(run, label, metric, passes) for label in run.labels(rows)}
    statuses: set[str] = set()
    notes: list[str] = []
    any_flagged = False
    floors: list[float] = []
    for axes, pass_name in zip(figure.axes, passes, strict=True):
        anchors: list[tuple[int, float]] = []
        stack: dict[float, int] = {}
        for label in run.labels(rows):
            series = run.series[label]
            cells = sorted(
                (r for r in rows if r["label"] == label and r["pass"] == pass_name),
                key=lambda r: r["seq_len"],
            )
            points = [
                (r["seq_len"], value * metric.scale)
                for r in cells
                if r["status"] == OK and _positive(value := r.get(metric.key), metric.log_y)
            ]
            colour = series_colour(series)
            if points:
                axes.plot(
                    *zip(*points, strict=True),
                    color=colour,
                    marker=series_marker(series),
                    markersize=5,
                    label=series.legend + fitted[label],
                )
                anchors.extend(points)
            limits = [
                (r["seq_len"], limit * metric.scale)
                for r in cells
                if metric.limit_key
                and r["status"] == OK
                and _positive(r.get(metric.key), metric.log_y)
                and _positive(limit := r.get(metric.limit_key), metric.log_y)
            ]
            if limits:
                axes.plot(
                    *zip(*limits, strict=True),
                    color=colour,
                    linestyle="--",
                    linewidth=1,
                    alpha=0.7,
                )
                floors.extend(value for _, value in limits)
            flagged = [
                (r["seq_len"], value * metric.scale)
                for r in cells
                if metric.timed
                and r["status"] == OK
                and set(r.get("flags") or []) - set(LIMIT_FLAGS)
                and _positive(value := r.get(metric.key), metric.log_y)
            ]
            if flagged:  # measured, but not to be trusted as drawn: hollow
                axes.plot(
                    *zip(*flagged, strict=True),
                    linestyle="none",
                    marker=series_marker(series),
                    markersize=7,
                    markerfacecolor="white",
                    markeredgecolor=colour,
                )
                any_flagged = True
            failed: list[tuple[float, str]] = [
                (r["seq_len"], r["status"]) for r in cells if r["status"] != OK
            ]
            mark_failures(axes, failed, colour, stack)
            statuses.update(status for _, status in failed)
            notes.extend(failure_note(r, series.legend) for r in cells if r["status"] != OK)
        set_length_axis(axes, lengths, metric.decode)
        axes.set_title(PASS_TITLES.get(pass_name, pass_name), fontsize=10)
        axes.set_ylabel(metric.axis_label)
        axes.grid(True, which="major", alpha=0.3)
        if metric.log_y:
            log_axis(axes, [v for _, v in anchors] + floors)
            if len({n for n, _ in anchors}) > 1:
                _reference_slopes(axes, anchors)
        else:
            _efficiency_limit(axes, anchors)
    title = None
    if any(fitted.values()):  # promise exponents only where a legend entry shows one
        title = "fitted exponent: " + " | ".join(PASS_TITLES.get(p, p) for p in passes)
        notes.append(
            "fitted exponent: from three or more lengths; none (or '–' for a pass) where "
            "fewer were measured or the fit is doubtful (the report's scaling table has every "
            "slope)"
        )
    extra = status_handles(statuses)
    if any_flagged:
        extra.append(_FLAGGED_HANDLE)
    if floors:
        extra.insert(0, _read_limit_handle(run, rows))
    if not metric.log_y:
        extra.insert(0, _limit_handle(run))
        ok_values = [r.get(metric.key) for r in rows if r["status"] == OK]
        if any(_positive(value, False) and value > 1 for value in ok_values):
            notes.insert(0, _ABOVE_ONE)
    legend(figure, extra, title=title)
    finish(figure, run, notes)
    return figure


def _positive(value: object, log_y: bool) -> TypeGuard[float]:
    """Whether a row's value can be drawn: a finite number (a flagged row may hold None,
    inf or NaN, which would break the axis limits of the whole figure), positive on a
    log axis."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return False
    return value > 0 or not log_y


_ABOVE_ONE = (
    "above 1.0: the FLOP model over-counts (forward + backward is taken as 3 × forward) or the "
    "variant's kernels beat the GEMM measured at the start of the run"
)


_FLAGGED_HANDLE = Line2D(
    [],
    [],
    linestyle="none",
    marker="o",
    markerfacecolor="white",
    markeredgecolor="0.3",
    label="hollow: a flagged cell (its row's flags say why; see the report)",
)


def _read_limit_handle(run: RunData, rows: list[Row]) -> Line2D:
    """The legend entry of the dashed lines: reading the state once at the bandwidth."""
    bandwidth = run.env.get("memory_bandwidth_bytes_per_s") or next(
        (r["bandwidth_bytes_per_s"] for r in rows if r.get("bandwidth_bytes_per_s")), None
    )
    text = "dashed: reading the state once at the\nmeasured memory bandwidth"
    if isinstance(bandwidth, int | float) and bandwidth > 0:
        text += f" ({bandwidth / 1e9:.1f} GB/s)"
    return Line2D([], [], color="0.3", linestyle="--", linewidth=1, label=text)


def _limit_handle(run: RunData) -> Line2D:
    """The legend entry of the 1.0 line: the measured GEMM throughput."""
    gemm = run.env.get("gemm_flops_per_s")
    text = "1.0 = measured GEMM throughput"
    if gemm:
        text += f" ({gemm / 1e9:.0f} GFLOP/s)"
    return Line2D([], [], color="0.3", linestyle="--", linewidth=1, label=text)


def _efficiency_limit(axes: Axes, points: list[tuple[int, float]]) -> None:
    """1.0 is the measured GEMM throughput: the ceiling a variant's useful FLOPs approach."""
    axes.axhline(1.0, color="0.3", linestyle="--", linewidth=1)
    top = max([1.0, *(v for _, v in points)])
    axes.set_ylim(0, top * 1.12)
