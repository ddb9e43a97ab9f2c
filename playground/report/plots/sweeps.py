"""The learning-rate figure of a sweep: each setup's validation score against the swept
value (learning rate where the grid has one, else its first numeric setting), the other
settings at their best for each value, one line per setup and one panel per task.

This is where a narrow window shows (Okpekpe & Orvieto 2025, arXiv 2508.19029: recurrent
and linear models recall only inside a narrow band of learning rates): a line that peaks
at one point and falls off either side, where exact attention's is flat. The chosen
point is ringed; its test score is the one the tables report.
"""

from __future__ import annotations

import math

from matplotlib.figure import Figure

from playground.report.plots.data import RunData
from playground.report.plots.style import finish, legend, log_axis, new_figure, variant_colour
from playground.report.sweeps import Choice, best_at
from playground.run.stats import CONFIDENCE

PREFERRED = "learning_rate"


def swept_key(choice: Choice) -> str | None:
    """The setting the figure puts on x: the learning rate, else the first numeric one
    that takes more than one value; None when nothing numeric varies."""
    values: dict[str, set[float]] = {}
    for row in choice.points:
        for key, value in (row.get("grid") or {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                values.setdefault(key, set()).add(float(value))
    varied = [key for key, seen in values.items() if len(seen) > 1]
    return PREFERRED if PREFERRED in varied else next(iter(varied), None)


def sweep_figure(run: RunData) -> Figure | None:
    """None when the run has no sweep with a numeric setting that varies."""
    drawn = [
        (choice, key)
        for choice in run.sweeps
        if choice.scored and (key := swept_key(choice)) is not None
    ]
    if not drawn:
        return None
    panels = sorted({(choice.sweep, choice.eval_length, key) for choice, key in drawn}, key=str)
    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    figure = new_figure(
        columns, "Validation score across the sweep, each setup's choice ringed", rows=rows
    )
    for unused in figure.axes[len(panels) :]:
        unused.set_visible(False)
    for axes, (sweep, length, key) in zip(figure.axes, panels, strict=False):
        values: list[float] = []
        metric = "score"
        for choice, choice_key in drawn:
            if (choice.sweep, choice.eval_length, choice_key) != (sweep, length, key):
                continue
            profile = best_at(choice, key)
            metric = str(choice.scored[0].get("validation_metric") or metric)
            variant = str(choice.scored[0].get("variant", choice.setup))
            xs = [x for x, *_ in profile]
            ys = [y for _, y, *_ in profile]
            errors = [half or 0.0 for *_, half, _ in profile]
            values += xs
            colour = variant_colour(variant)
            axes.errorbar(
                xs, ys, yerr=errors, marker="o", markersize=4, capsize=2, color=colour,
                label=choice.setup,
            )  # fmt: skip
            for x, y, _, chosen in profile:
                if chosen:
                    axes.plot(x, y, "o", markersize=11, markerfacecolor="none", color=colour)
        if min(values) > 0:  # a log axis would drop a 0 (weight_decay = [0.0, 0.1])
            log_axis(axes, values, which="x")
        if metric == "accuracy":  # a t interval over few seeds may reach past [0, 1]
            low, high = axes.get_ylim()
            axes.set_ylim(max(-0.02, low), min(1.02, high))
        axes.set_xlabel(key.replace("_", " "))
        axes.set_ylabel(f"validation {metric.replace('_', ' ')} ({CONFIDENCE:.0%} interval)")
        axes.set_title(sweep + ("" if length is None else f" at n={length}"), fontsize=9)
        axes.grid(True, alpha=0.3)
    legend(figure)
    finish(figure, run, ["other swept settings at their best for each value"])
    return figure
