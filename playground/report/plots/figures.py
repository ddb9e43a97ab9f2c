"""Every figure of a run directory, written in the requested formats."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from playground.registry import Registry
from playground.report.plots.accuracy import accuracy_figure, cost_accuracy_figure
from playground.report.plots.bits_per_byte import extrapolation_figure, language_cost_figure
from playground.report.plots.data import PlotError, RunData, load_run
from playground.report.plots.fidelity import fidelity_figures
from playground.report.plots.passkey import passkey_figure
from playground.report.plots.patterns import attention_pattern_figure, relative_bias_figure
from playground.report.plots.position_loss import position_loss_figure
from playground.report.plots.recall_state import recall_state_figure
from playground.report.plots.scaling import METRICS, scaling_figure
from playground.report.plots.style import FORMATS, assign_colours, save
from playground.report.plots.sweeps import sweep_figure
from playground.report.plots.task_grid import task_grid_figure
from playground.report.plots.verdict import scorecard_figure

FIGURES_DIR = "figures"
"""Where plot_run writes by default: <run_dir>/figures/."""


def draw_figures(run: RunData, registry: Registry | None = None) -> dict[str, Figure]:
    """stem -> figure, for everything this run has data for, in reading order."""
    made: dict[str, Figure | None] = {}
    assign_colours(row["variant"] for row in run.rows if "variant" in row)
    if run.measurements:
        for metric in METRICS:
            made[metric.stem] = _drawn(metric.stem, functools.partial(scaling_figure, run, metric))
        made.update(_drawn("fidelity", lambda: fidelity_figures(run)) or {})
    made["accuracy"] = _drawn("accuracy", lambda: accuracy_figure(run))
    made["cost_vs_accuracy"] = _drawn("cost_vs_accuracy", lambda: cost_accuracy_figure(run))
    made["task_grid"] = _drawn("task_grid", lambda: task_grid_figure(run))
    made["recall_vs_state"] = _drawn("recall_vs_state", lambda: recall_state_figure(run))
    if run.language:
        made["lm_extrapolation"] = _drawn("lm_extrapolation", lambda: extrapolation_figure(run))
        made["lm_cost"] = _drawn("lm_cost", lambda: language_cost_figure(run))
        made["lm_by_position"] = _drawn("lm_by_position", lambda: position_loss_figure(run))
        made["lm_passkey"] = _drawn("lm_passkey", lambda: passkey_figure(run))
    made["sweeps"] = _drawn("sweeps", lambda: sweep_figure(run))
    made["scorecard"] = _drawn("scorecard", lambda: scorecard_figure(run))
    made["attention_patterns"] = _drawn(
        "attention_patterns", lambda: attention_pattern_figure(run, registry)
    )
    made["relative_bias"] = _drawn("relative_bias", lambda: relative_bias_figure(run, registry))
    return {stem: figure for stem, figure in made.items() if figure is not None}


def _drawn(stem: str, draw: Callable[[], Any]) -> Any:
    """draw(), or None with a one-line warning when it raises: one figure that odd data or
    a plugin's hook breaks must not cost the other figures and the report."""
    try:
        return draw()
    except Exception as exc:
        print(
            f"warning: figure {stem!r} not drawn: {type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}",
            file=sys.stderr,
        )
        return None


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
    try:  # a place that cannot hold figures is the user's to fix, not a figure's fault
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PlotError(
            f"cannot write {out_dir}: {exc.strerror or exc}; give --out a directory for the figures"
        ) from exc
    written: list[Path] = []
    for stem, figure in draw_figures(run, registry).items():
        try:
            written.extend(save(figure, out_dir, stem, formats))
        except OSError:
            raise
        except Exception as exc:  # drawing happens at save time: a junk value fails here
            print(
                f"warning: figure {stem!r} not written: {type(exc).__name__}: {exc}"[:300],
                file=sys.stderr,
            )
    return written
