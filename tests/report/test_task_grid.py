"""The variants × tasks view of a suite (issue 43 part 2: "a variants × tasks table and a
MAD-style figure"): one line per setup, one column per task, a failed cell shown by its
status, a sweep by its chosen point; nothing for a run of one task or one setup."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from playground.report.plots import load_run
from playground.report.plots.task_grid import progress_above_chance, task_grid_figure
from playground.report.suite_tables import (
    print_task_grid,
    task_grid_entries,
)
from tests.report.test_sweeps import point
from tests.report.test_verdict import accuracy_row, write_judged_run


def suite() -> list[dict]:
    rows = []
    for task, scores in (("recall", (0.99, 0.37)), ("copy", (1.0, 0.92))):
        for label, score in zip(("vanilla", "linear"), scores, strict=True):
            row = accuracy_row(label, [score] * 3)
            rows.append({**row, "cell": f"{label}|{task}", "task_label": task, "chance": 0.1})
    rows.append({**rows[-1], "cell": "gated|copy", "label": "gated", "status": "error"})
    return rows


def test_one_line_per_setup_one_column_per_task() -> None:
    header, entries = task_grid_entries(suite())
    assert header == ["setup", "copy", "recall"]  # tasks in label order
    assert entries == [
        ["vanilla", "1.000", "0.990"],
        ["linear", "0.920", "0.370"],
        ["gated", "error", ""],
    ]
    console = Console(file=io.StringIO(), width=120)
    print_task_grid(suite(), console)
    assert "0.370" in console.file.getvalue()


def test_a_sweep_shows_its_chosen_point_under_its_label() -> None:
    rows = [
        point("vanilla", 1e-3, [0.9] * 3, [0.91] * 3),
        point("vanilla", 1e-2, [0.5] * 3, [0.99] * 3),
        point("linear", 1e-3, [0.3] * 3, [0.31] * 3),
        {**suite()[0], "task_label": "copy"},
        {**suite()[1], "task_label": "copy"},
    ]
    header, entries = task_grid_entries(rows)
    assert header == ["setup", "copy", "recall(64)"]
    assert entries[0] == ["vanilla", "0.990", "0.910"]  # 0.91: validation chose 1e-3


def test_one_task_or_one_setup_draws_no_grid(tmp_path: Path) -> None:
    single = [row for row in suite() if row["task_label"] == "recall"]
    assert task_grid_entries(single) == ([], [])
    assert task_grid_figure(load_run(write_judged_run(tmp_path / "one", single))) is None
    assert task_grid_figure(load_run(write_judged_run(tmp_path / "two", suite()))) is not None


@pytest.mark.parametrize(
    ("accuracy", "chance", "expected"), [(0.1, 0.1, 0.0), (1.0, 0.1, 1.0), (0.55, 0.1, 0.5)]
)
def test_progress_runs_from_chance_to_solved(accuracy, chance, expected) -> None:
    assert progress_above_chance(accuracy, chance) == pytest.approx(expected)
    assert progress_above_chance(0.0, 0.25) == 0.0  # below chance is clipped
