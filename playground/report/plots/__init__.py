"""Figures from any results directory (matplotlib, headless).

    plot_run(run_dir, out_dir=None, formats=("png",)) -> list[Path]

writes, for whatever the run measured: time, peak memory and efficiency vs n (one panel
per pass, fitted exponents in the legend, n and n² for reference); fidelity against each
swept option (or against n); accuracy per task and cost against accuracy (for accuracy
rows); bits per byte against evaluation length and against training time (for
language-model rows: `report.language` tells the kinds of task row apart); the attention
pattern of every variant on a short sequence; and T5's relative bias per head. A variant keeps one colour in every figure
(`variant_colour`); failed, OOM, unsupported and invalid cells are drawn as markers and
listed in each figure's footnote, with the device, dtype and torch version.
"""

from playground.report.plots.data import PlotError, RunData, load_run
from playground.report.plots.figures import FIGURES_DIR, draw_figures, plot_run
from playground.report.plots.style import FORMATS, variant_colour

__all__ = [
    "FIGURES_DIR",
    "FORMATS",
    "PlotError",
    "RunData",
    "draw_figures",
    "load_run",
    "plot_run",
    "variant_colour",
]
