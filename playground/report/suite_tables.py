"""The tables of a suite of tasks: accuracy by setup and task (one line per setup, one
column per task), and each sweep's choice (the point chosen on validation, its validation
and test scores, how many points lie within its interval); as text entries for the
report's pages and as rich tables for the terminal."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape

from playground.report.summary import OK, accuracy_rows
from playground.report.sweeps import Choice, choices, chosen_rows, grid_text, test_score
from playground.report.tables import compact_table
from playground.run.row_schema import Row

TASK_GRID_TITLE = "Accuracy by setup and task (mean over seeds; of a sweep, its chosen point)"


def task_grid_entries(rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    """(header, entries): one line per setup, one column per task, each the accuracy mean
    (a cell that did not finish shows its status); ([], []) unless at least two setups
    were scored on at least two tasks."""
    scored = accuracy_rows(chosen_rows(rows))
    tasks = list(dict.fromkeys(str(row["task_label"]) for row in scored))
    setups = list(dict.fromkeys(str(row["label"]) for row in scored))
    if len(tasks) < 2 or len(setups) < 2:
        return [], []
    cells = {(row["label"], row["task_label"]): row for row in scored}
    entries = []
    for setup in setups:
        line = [setup]
        for task in tasks:
            row = cells.get((setup, task))
            if row is None:
                line.append("")
            elif row["status"] != OK or row["accuracy_mean"] is None:
                line.append(str(row["status"]))
            else:
                line.append(f"{row['accuracy_mean']:.3f}")
        entries.append(line)
    return ["setup", *tasks], entries


def print_task_grid(rows: list[Row], console: Console) -> None:
    """The setups × tasks table (`task_grid_entries`); nothing for fewer than two of each."""
    header, entries = task_grid_entries(rows)
    if not entries:
        return
    table = compact_table(TASK_GRID_TITLE)
    for column in header:
        table.add_column(column, overflow="fold", justify="left" if column == "setup" else "right")
    for entry in entries:
        table.add_row(*map(escape, entry))
    console.print(table)


SWEEP_TITLE = (
    "Sweeps: each setup's point chosen on validation, scored on test (mean [95% interval])"
)
SWEEP_TABLE_COLUMNS = ("setup", "task", "chosen", "validation", "test", "within interval")
SWEEP_NOTE = (
    "Each setup's grid point is chosen by its mean score on the validation split; the test "
    "split's score is the one reported, and the one the accuracy table and the verdict use. "
    '"Within interval": the grid points whose validation mean lies inside the chosen '
    "one's 95% interval (sweeps.csv has every point)."
)


def _interval(mean: float | None, half: float | None) -> str:
    if mean is None:
        return "-"
    return f"{mean:.3f}" + ("" if half is None else f" ± {half:.3f}")


def sweep_entries(found: Sequence[Choice]) -> list[list[str]]:
    """SWEEP_TABLE_COLUMNS, one entry per (setup, sweep): the chosen point, its validation
    and test scores, and how many of the grid's points lie within the chosen one's
    validation interval (many: a flat optimum; 1: a narrow window)."""
    entries = []
    for choice in found:
        row = choice.chosen
        task = choice.sweep + ("" if choice.eval_length is None else f" at n={choice.eval_length}")
        if row is None:
            failure = choice.points[0]
            status = f"{failure.get('status')}: {failure.get('error')}"
            entries.append([choice.setup, task, "-", "-", status, f"0 of {len(choice.points)}"])
            continue
        test, test_half = test_score(row)
        entries.append(
            [
                choice.setup,
                task,
                grid_text(row.get("grid")),
                _interval(row.get("validation_mean"), row.get("validation_ci95")),
                _interval(test, test_half),
                f"{choice.within} of {len(choice.points)}",
            ]
        )
    return entries


def print_sweeps(rows: list[Row], console: Console) -> None:
    """The sweep table (`sweep_entries`); nothing when the run swept nothing."""
    entries = sweep_entries(choices(rows))
    if not entries:
        return
    table = compact_table(SWEEP_TITLE)
    for column in SWEEP_TABLE_COLUMNS:
        table.add_column(column, overflow="fold")
    for entry in entries:
        table.add_row(*map(escape, entry))
    console.print(table)
