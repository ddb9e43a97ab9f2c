"""Every figure of a run directory, written in the requested formats."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from playground.plots.accuracy import accuracy_figure, cost_accuracy_figure
from playground.plots.data import PlotError, Run, load_run
from playground.plots.fidelity import fidelity_figures
from playground.plots.patterns import attention_pattern_figure, relative_bias_figure
from playground.plots.scaling import METRICS, scaling_figure
from playground.plots.style import FORMATS, save
from playground.registry import Registry

FIGURES_DIR = "figures"
"""Where plot_run writes by default: <run_dir>/figures/."""


def figures(run: Run, registry: Registry | None = None) -> dict[str, Figure]:
    """stem -> figure, for everything this run has data for, in reading order."""
    made: dict[str, Figure | None] = {}
    if run.measurements:
        for metric in METRICS:
            made[metric.stem] = scaling_figure(run, metric)
        made.update(fidelity_figures(run))
    made["accuracy"] = accuracy_figure(run)
    made["cost_vs_accuracy"] = cost_accuracy_figure(run)
    made["attention_patterns"] = attention_pattern_figure(run, registry)
    made["relative_bias"] = relative_bias_figure(run, registry)
    return {stem: figure for stem, figure in made.items() if figure is not None}


def plot_run(
    run_dir: Path,
    out_dir: Path | None = None,
    formats: Sequence[str] = ("png",),
    registry: Registry | None = None,
) -> list[Path]:
    """Draw every figure of a run directory into out_dir (default <run_dir>/figures/),
    once per format (png, svg, pdf); returns the files written, figure by figure.

    Raises PlotError when run_dir holds no rows or a format is unknown."""
    unknown = [fmt for fmt in formats if fmt not in FORMATS]
    if unknown or not formats:
        raise PlotError(
            f"unknown figure format {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(FORMATS)}"
        )
    run = load_run(run_dir)
    out_dir = Path(run_dir) / FIGURES_DIR if out_dir is None else Path(out_dir)
    written: list[Path] = []
    for stem, figure in figures(run, registry).items():
        written.extend(save(figure, out_dir, stem, formats))
    return written
