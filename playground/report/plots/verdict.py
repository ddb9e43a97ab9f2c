"""The scorecard figure: setups × quality metrics, each cell coloured by its signed effect
against the baseline (green better, red worse; the difference scaled by the largest in its
metric's column, since accuracy and bits per byte have different units), the difference
written in it, and hatched where the verdict is indistinguishable."""

from __future__ import annotations

import textwrap

from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from playground.report.plots.data import RunData
from playground.report.plots.style import finish
from playground.report.verdict import BETTER, SAME, WORSE, verdicts
from playground.run.stats import CONFIDENCE


def scorecard_figure(run: RunData) -> Figure | None:
    """None when the run has no quality rows against the spec's baseline."""
    baseline = run.spec.get("baseline")
    if not isinstance(baseline, str):
        return None
    found = verdicts(run.rows, baseline)
    if not found:
        return None
    setups = sorted({verdict.setup for verdict in found})
    metrics = sorted({verdict.metric for verdict in found})
    cells = {(verdict.setup, verdict.metric): verdict for verdict in found}
    scale = {
        metric: max((abs(v.difference) for v in found if v.metric == metric), default=0.0) or 1.0
        for metric in metrics
    }
    figure = Figure(
        figsize=(max(6.0, 2.5 + 1.6 * len(metrics)), 2.8 + 0.5 * len(setups)), layout="constrained"
    )
    axes = figure.subplots()
    colours = colormaps["RdYlGn"]
    for row, setup in enumerate(setups):
        for column, metric in enumerate(metrics):
            verdict = cells.get((setup, metric))
            if verdict is None:
                continue
            interval = "" if verdict.low is None else f"[{verdict.low:+.3f}, {verdict.high:+.3f}]\n"
            effect = verdict.effect / scale[metric]  # in [-1, 1], positive = better
            axes.add_patch(
                Rectangle(
                    (column, row),
                    1,
                    1,
                    facecolor=colours(0.5 + effect / 2),
                    edgecolor="0.3",
                    hatch="///" if verdict.mark == SAME else None,
                    linewidth=0.5,
                )
            )
            axes.text(
                column + 0.5,
                row + 0.5,
                f"{verdict.difference:+.3f}\n{interval}{verdict.mark}",
                ha="center",
                va="center",
                fontsize=7,
                bbox={"facecolor": "white", "alpha": 0.7, "linewidth": 0, "pad": 1},
            )
    axes.set_xlim(0, len(metrics))
    axes.set_ylim(len(setups), 0)
    axes.set_xticks([i + 0.5 for i in range(len(metrics))])
    axes.set_xticklabels([textwrap.fill(m, 22) for m in metrics], fontsize=7)
    axes.set_yticks([i + 0.5 for i in range(len(setups))])
    axes.set_yticklabels(setups, fontsize=8)
    axes.tick_params(length=0)
    figure.suptitle(
        f"Verdict against {baseline}: difference, {CONFIDENCE:.0%} interval "
        f"(hatched: indistinguishable)",
        fontsize=11,
    )
    finish(
        figure,
        run,
        [f"green: {BETTER}, red: {WORSE}; colour is the difference over its metric's largest"],
    )
    return figure
