"""Sweeps of training settings, decided: each setup's grid point chosen on the validation
split, its score reported on the held-out test split, never both on one set.

A [[tasks]] table with list-valued settings (`learning_rate = [1e-3, 3e-3, 1e-2]`) trains
every setup at every point of its grid; each row carries its point (`grid`) and the label
all points share (`sweep`). For every setup and sweep, `choices` takes the point with the
best mean validation score over seeds (accuracy: highest; bits per byte: lowest; a tie
goes to the point listed first) and counts the points whose validation mean lies within
the best one's 95 % interval: many such points say the choice barely matters, one says
the setup trains only inside a narrow window (Okpekpe & Orvieto 2025, arXiv 2508.19029).

`chosen_rows` is what the tables, figures and the verdict read: every row outside a sweep
as it is, and of each sweep only the chosen point's rows, labelled by the sweep (so that
setups chosen at different points are compared on one task) with the choice beside.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from playground.errors import PlaygroundError
from playground.report.task_rows import is_accuracy_row, is_language_row, setup_name
from playground.run.row_schema import Row
from playground.run.store import RunStore

SWEEPS = "sweeps.csv"
LOWER_IS_BETTER = ("bits_per_byte",)
"""Validation metrics where the lowest score is the best."""


@dataclass(frozen=True)
class Choice:
    """One setup's sweep of one task (at one evaluation length, for a language task)."""

    setup: str
    sweep: str
    eval_length: int | None
    points: tuple[Row, ...]
    """Every grid point's row, in the spec's order (failed ones included)."""
    chosen: Row | None
    """The row of the point with the best validation mean; None when no point has one."""
    within: int
    """Points whose validation mean lies within the chosen one's 95 % interval (itself
    included): how flat the optimum is."""

    @property
    def scored(self) -> list[Row]:
        """The points with a validation score, in the spec's order."""
        return [row for row in self.points if _validation(row) is not None]


def _validation(row: Row) -> float | None:
    value = row.get("validation_mean")
    if row.get("status") != "ok" or value is None or not math.isfinite(float(value)):
        return None  # a non-finite score is none: max() would keep a NaN it met first
    return float(value)


def is_swept(row: Row) -> bool:
    """A quality row of one point of a sweep."""
    return bool(row.get("grid")) and (is_accuracy_row(row) or is_language_row(row))


def _direction(rows: Sequence[Row]) -> int:
    """+1 where the validation metric is higher-is-better, -1 where lower is."""
    metrics = {row.get("validation_metric") for row in rows if _validation(row) is not None}
    return -1 if metrics & set(LOWER_IS_BETTER) else 1


def choose(points: Sequence[Row]) -> tuple[Row | None, int]:
    """(the point with the best validation mean, how many points lie within its 95 %
    interval); (None, 0) when no point has a validation score. The interval of one seed is
    unknown, so there only points with the very same mean count."""
    scored = [row for row in points if _validation(row) is not None]
    if not scored:
        return None, 0
    sign = _direction(scored)
    best = max(scored, key=lambda row: sign * (_validation(row) or 0.0))  # first of a tie
    centre = _validation(best) or 0.0
    half = best.get("validation_ci95") or 0.0
    within = sum(1 for row in scored if abs((_validation(row) or 0.0) - centre) <= half)
    return best, within


def choices(rows: Sequence[Row]) -> list[Choice]:
    """One Choice per (setup, sweep, evaluation length), in the order rows first show it."""
    groups: dict[tuple[str, str, int | None], list[Row]] = {}
    for row in rows:
        if is_swept(row):
            key = (setup_name(row), str(row.get("sweep")), row.get("eval_length"))
            groups.setdefault(key, []).append(row)
    found = []
    for (setup, sweep, length), points in groups.items():
        chosen, within = choose(points)
        found.append(Choice(setup, sweep, length, tuple(points), chosen, within))
    return found


def chosen_rows(rows: Sequence[Row]) -> list[Row]:
    """`rows` with each sweep reduced to its chosen point (module docstring): that row,
    its `task_label` the sweep's, with `chosen_from` (the grid's points), `within_interval`
    and the chosen `grid` beside. A sweep no point of which scored keeps its first row,
    which says why (its status and error)."""
    picked: dict[int, Row] = {}
    for choice in choices(rows):
        row = choice.chosen or choice.points[0]
        picked[id(row)] = {
            **row,
            "task_label": choice.sweep,
            "chosen_from": len(choice.points),
            "within_interval": choice.within,
        }
    return [picked.get(id(row), row) for row in rows if not is_swept(row) or id(row) in picked]


def at_point(rows: Sequence[Row], fixed: dict[str, str]) -> list[Row]:
    """`rows` with each sweep held at `fixed` (`{"learning_rate": "0.003"}`): its other
    points dropped, so what follows chooses among the rest; what a verdict would have said
    had every setup trained there. SweepPointMissing when no point has those values."""
    if not fixed:
        return list(rows)
    swept = [row for row in rows if is_swept(row)]

    def matches(row: Row) -> bool:
        grid = row.get("grid") or {}
        return all(key in grid and _same(grid[key], value) for key, value in fixed.items())

    if not any(matches(row) for row in swept):
        values = {
            key: sorted({str(row["grid"][key]) for row in swept if key in row["grid"]})
            for key in fixed
        }
        known = "; ".join(f"{key}: {', '.join(v) or '(not swept)'}" for key, v in values.items())
        raise SweepPointMissing(
            f"no grid point of this run has {grid_text(fixed)}; the values swept are {known}"
            if swept
            else f"this run swept nothing, so it has no point {grid_text(fixed)}"
        )
    return [row for row in rows if not is_swept(row) or matches(row)]


def _same(value: Any, given: str) -> bool:
    """Whether a grid value is the command line's `given` (0.003 is 3e-3)."""
    try:
        return float(value) == float(given)
    except (TypeError, ValueError):
        return str(value) == given


class SweepPointMissing(PlaygroundError, LookupError):
    """A grid point asked for (`playground verdict --at`) is not in the run."""


def grid_text(grid: dict[str, Any] | None) -> str:
    """`learning_rate=0.001, weight_decay=0.1`."""
    return ", ".join(f"{key}={value}" for key, value in (grid or {}).items())


def test_score(row: Row) -> tuple[float | None, float | None]:
    """The row's test score and its 95 % half-width, in its own metric."""
    if is_language_row(row):
        return row.get("bits_per_byte_mean"), row.get("bits_per_byte_ci95")
    return row.get("accuracy_mean"), row.get("accuracy_ci95")


SWEEP_COLUMNS = (
    "setup",
    "sweep",
    "eval_length",
    "grid",
    "chosen",
    "status",
    "validation_metric",
    "validation_mean",
    "validation_ci95",
    "test_mean",
    "test_ci95",
    "within_interval",
    "points",
)


def sweep_records(found: Sequence[Choice]) -> list[dict[str, Any]]:
    """SWEEP_COLUMNS, one record per grid point of every choice: the whole grid, with the
    chosen point marked, for sweeps.csv and the report."""
    records = []
    for choice in found:
        for row in choice.points:
            test, test_half = test_score(row)
            records.append(
                {
                    "setup": choice.setup,
                    "sweep": choice.sweep,
                    "eval_length": choice.eval_length,
                    "grid": grid_text(row.get("grid")),
                    "chosen": row is choice.chosen,
                    "status": row.get("status"),
                    "validation_metric": row.get("validation_metric"),
                    "validation_mean": _validation(row),
                    "validation_ci95": row.get("validation_ci95"),
                    "test_mean": test if row.get("status") == "ok" else None,
                    "test_ci95": test_half if row.get("status") == "ok" else None,
                    "within_interval": choice.within,
                    "points": len(choice.points),
                }
            )
    return records


def best_at(choice: Choice, key: str) -> list[tuple[float, float, float | None, bool]]:
    """(value of `key`, best validation mean there, its 95 % half-width, whether the chosen
    point has that value) for each value of `key` in the grid, the other settings at their
    best for it: the profile a learning-rate figure draws."""
    sign = _direction(choice.points)
    by_value: dict[float, Row] = {}
    for row in choice.scored:
        value = float(row["grid"][key])
        held = by_value.get(value)
        if held is None or sign * (_validation(row) or 0.0) > sign * (_validation(held) or 0.0):
            by_value[value] = row
    chosen = None if choice.chosen is None else choice.chosen["grid"].get(key)
    return [
        (value, _validation(row) or 0.0, row.get("validation_ci95"), value == chosen)
        for value, row in sorted(by_value.items())
    ]


def write_sweeps(store: RunStore) -> list[Choice]:
    """Write sweeps.csv (SWEEP_COLUMNS) to the run when it swept anything; the choices."""
    found = choices(store.rows())
    records = sweep_records(found)
    if records:
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=list(SWEEP_COLUMNS))
        writer.writeheader()
        writer.writerows(records)
        store.write_text(SWEEPS, text.getvalue())
    return found
