"""The suite at a glance, as MAD draws its benchmark (Poli et al. 2024, Fig. 3: each
architecture's accuracy on each task): setups down, tasks across, each cell coloured by
how far the setup got from chance to a perfect score on that task, its accuracy written
in it. Drawn when a run scores at least two setups on at least two tasks."""

from __future__ import annotations

import textwrap

from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.typing import ColorType

from playground.report.plots.accuracy import task_name
from playground.report.plots.data import OK, RunData
from playground.report.plots.style import finish


def progress_above_chance(accuracy: float, chance: float) -> float:
    """(accuracy − chance) / (1 − chance), clipped to [0, 1]: 0 at chance, 1 solved, so
    tasks with different chance levels share one colour scale."""
    if chance >= 1:
        return 1.0
    return min(1.0, max(0.0, (accuracy - chance) / (1 - chance)))


def task_grid_figure(run: RunData) -> Figure | None:
    """None unless at least two setups were scored on at least two tasks."""
    rows = run.accuracy
    tasks = list(dict.fromkeys(task_name(row) for row in rows))
    labels = run.labels(rows)
    if len(tasks) < 2 or len(labels) < 2:
        return None
    cells = {(row["label"], task_name(row)): row for row in rows}
    figure = Figure(
        figsize=(max(6.0, 2.2 + 1.5 * len(tasks)), 1.8 + 0.45 * len(labels)), layout="constrained"
    )
    axes = figure.subplots()
    colours = colormaps["viridis"]
    face: ColorType  # a grey for a failed cell, the accuracy's colour otherwise
    for y, label in enumerate(labels):
        for x, task in enumerate(tasks):
            row = cells.get((label, task))
            if row is None:
                continue
            mean = row.get("accuracy_mean")
            if row.get("status") != OK or mean is None:
                face, text = "0.9", str(row.get("status", "?"))
            else:
                accuracy = float(mean)
                progress = progress_above_chance(accuracy, float(row.get("chance") or 0.0))
                face, text = colours(progress), f"{accuracy:.3f}"
            axes.add_patch(Rectangle((x, y), 1, 1, facecolor=face, edgecolor="white"))
            axes.text(x + 0.5, y + 0.5, text, ha="center", va="center", fontsize=8,
                      bbox={"facecolor": "white", "alpha": 0.75, "linewidth": 0, "pad": 1})  # fmt: skip
    axes.set_xlim(0, len(tasks))
    axes.set_ylim(len(labels), 0)
    axes.set_xticks([x + 0.5 for x in range(len(tasks))])
    axes.set_xticklabels([textwrap.fill(task, 20) for task in tasks], fontsize=7)
    axes.set_yticks([y + 0.5 for y in range(len(labels))])
    axes.set_yticklabels([run.series[label].legend for label in labels], fontsize=8)
    axes.tick_params(length=0)
    scale = ScalarMappable(norm=Normalize(0.0, 1.0), cmap=colours)
    figure.colorbar(scale, ax=axes, label="(accuracy − chance) / (1 − chance)", shrink=0.8)
    figure.suptitle("Accuracy per setup and task (colour: from chance, 0, to solved, 1)")
    finish(figure, run, ["grey: not scored (its status)"])
    return figure
