"""What the trained models' attention layers learned: each layer's `learned_summary()` (a
λ, a slope per head, a prior's widths), which training writes into an accuracy or
language row as "learned_per_seed" (one {layer: {parameter: value}} per seed, in the
order of the row's "seeds"). `learned_entries` are the table's text, shared by the
terminal (`report.tables`) and report.html / report.md (`report.pages`).

One entry per (setup label, task, layer, parameter): the mean over seeds (element by
element for a list) and each seed's value. Layers that hold equal values in every seed (a
table shared across the stack) are one entry.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any

from playground.run.row_schema import Row

LEARNED_TITLE = "Learned parameters after training (each layer's learned_summary)"
LEARNED_COLUMNS = ("setup", "task", "layer", "parameter", "mean over seeds", "per seed")

Value = float | list[float]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _readable(value: Any) -> bool:
    """A number or a list of numbers (what the hook may return); a row is JSON from disk."""
    return _number(value) or (isinstance(value, list) and all(map(_number, value)))


def _text(value: Value) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(f"{item:.3g}" for item in value) + "]"
    return f"{value:.3g}"


def _mean(values: list[Value]) -> Value | None:
    """The mean over seeds, element by element for lists of one length; None otherwise."""
    scalars = [value for value in values if not isinstance(value, list)]
    if len(scalars) == len(values):
        return statistics.fmean(scalars)
    lists = [value for value in values if isinstance(value, list)]
    if len(lists) == len(values) and len({len(value) for value in lists}) == 1:
        return [statistics.fmean(items) for items in zip(*lists, strict=True)]
    return None


def _parameters(per_seed: list[Any]) -> dict[str, dict[str, list[Value]]]:
    """parameter -> layer -> its value in each seed (seeds that lack it left out)."""
    found: dict[str, dict[str, list[Value]]] = {}
    for seed in per_seed:
        if not isinstance(seed, dict):
            continue
        for layer, summary in seed.items():
            if not isinstance(summary, dict):
                continue
            for parameter, value in summary.items():
                if _readable(value):
                    found.setdefault(str(parameter), {}).setdefault(str(layer), []).append(value)
    return found


def _layer_entries(parameter: str, layers: dict[str, list[Value]]) -> list[list[str]]:
    """(layer, parameter, mean, per seed) entries of one parameter: one for all layers
    when they agree in every seed (a table shared across the stack), else one per layer."""
    if len(layers) > 1 and all(values == next(iter(layers.values())) for values in layers.values()):
        layers = {f"all {len(layers)} (equal)": next(iter(layers.values()))}
    entries = []
    for layer, values in layers.items():
        mean = _mean(values)
        entries.append(
            [
                layer,
                parameter,
                "-" if mean is None else _text(mean),
                "; ".join(_text(value) for value in values),
            ]
        )
    return entries


def learned_entries(rows: Iterable[Row]) -> list[list[str]]:
    """LEARNED_COLUMNS, per (setup, task) that learned something, in setup order. A
    language task's rows (one per evaluation length) carry the same values: one is read."""
    entries: dict[tuple[str, str], list[list[str]]] = {}
    for row in rows:
        per_seed = row.get("learned_per_seed")
        key = (str(row.get("label")), str(row.get("task_label") or row.get("task")))
        if key in entries or not isinstance(per_seed, list):
            continue
        entries[key] = [
            [*key, *entry]
            for parameter, layers in _parameters(per_seed).items()
            for entry in _layer_entries(parameter, layers)
        ]
    return [entry for key in sorted(entries) for entry in entries[key]]
