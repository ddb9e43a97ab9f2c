"""Every figure that draws a hollow marker says in a legend what hollow means (issue 42)."""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from playground.registry import Registry
from playground.report.plots import draw_figures, load_run
from tests.report.test_language_report import language_rows
from tests.report.test_plots import full_rows, write_run


def _hollow(line: Line2D) -> bool:
    face = line.get_markerfacecolor()
    return line.get_marker() not in (None, "None", "", " ") and (
        isinstance(face, str) and face in ("none", "white")
    )


def _legend_handles(figure: Figure) -> list:
    legends = [*figure.legends, *(axes.get_legend() for axes in figure.axes)]
    return [handle for legend in legends if legend for handle in legend.legend_handles]


def _figures_with_hollow_markers(tmp_path) -> dict[str, Figure]:
    rows = full_rows() + language_rows()
    for row in rows:  # flagged timings: drawn hollow in the scaling figures
        if row.get("seq_len") == 128 and row.get("status") == "ok" and "time_ms" in row:
            row["flags"] = ["large spread"]
    figures = draw_figures(load_run(write_run(tmp_path / "run", rows)), Registry.discover())
    return {
        stem: figure
        for stem, figure in figures.items()
        if any(_hollow(line) for axes in figure.axes for line in axes.get_lines())
    }


def test_every_figure_with_hollow_markers_explains_them(tmp_path):
    figures = _figures_with_hollow_markers(tmp_path)
    # the scaling figures (flagged cells, an unsupported cell) and the language cost figure
    # (a setup with model settings of its own)
    assert {"time_vs_n", "efficiency_vs_n", "lm_cost"} <= set(figures), set(figures)
    for stem, figure in figures.items():
        # A flagged cell is white inside, an unsupported cell or a setup of its own
        # settings has no face: each kind drawn needs an entry of its own kind.
        drawn = {
            line.get_markerfacecolor()
            for axes in figure.axes
            for line in axes.get_lines()
            if _hollow(line)
        }
        explained = {
            handle.get_markerfacecolor()
            for handle in _legend_handles(figure)
            if isinstance(handle, Line2D) and _hollow(handle)
        }
        assert drawn <= explained, f"{stem}: hollow markers drawn with no legend entry"
