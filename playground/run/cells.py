"""The cells of a spec: one per (setup, seq_len, pass) for the cost measures and one per
(setup, task) for accuracy, each with a unique id that its row carries as `cell`."""

from __future__ import annotations

from dataclasses import dataclass

from playground.errors import PlaygroundError
from playground.run.language_scores import eval_cell_id, evaluation_lengths, length_row
from playground.run.row_schema import AccuracyScores, Row
from playground.run.spec import Spec, TaskRun, VariantSetup

COST_MEASURES = ("speed", "memory", "fidelity")


@dataclass(frozen=True)
class Cell:
    """One measurement: a setup at one length and pass (cost), or trained on one
    task over its seeds (accuracy)."""

    variant: VariantSetup
    seq_len: int | None = None
    pass_name: str | None = None
    task: TaskRun | None = None

    @property
    def id(self) -> str:
        if self.task is not None:
            return accuracy_cell_id(self.variant.label, self.task.label)
        return f"{self.variant.label}|n={self.seq_len}|{self.pass_name}"


def accuracy_cell_id(variant_label: str, task_label: str) -> str:
    return f"{variant_label}|task={task_label}"


def with_stage_rows(row: Row, cell: Cell) -> list[Row]:
    """`row`, then one row per curriculum stage of `cell`'s task: the stage's scores
    (row_fields' "stages") over the row's other fields, or, when the cell failed, the
    row's status and error under each stage's label. A language cell's row is followed
    by one row per further evaluation length (its "evaluations")."""
    if "evaluations" in row:
        primary = row.copy()
        evaluations = primary.pop("evaluations")
        return [primary] + [length_row(row, fields) for fields in evaluations]
    if cell.task is None or not cell.task.curriculum:
        return [row]
    row = row.copy()
    scored: list[AccuracyScores] = row.pop("stages", []) or [
        {"task_label": label, "task_options": {**cell.task.options, **stage.options}}
        for label, stage in zip(cell.task.stage_labels, cell.task.curriculum, strict=True)
    ]
    return [row] + [
        {**row, **stage, "cell": accuracy_cell_id(cell.variant.label, stage["task_label"])}
        for stage in scored
    ]


def row_ids(cell: Cell, primary: Row) -> list[str]:
    """The ids of every row `cell` writes, given its own row `primary`: its own, each
    curriculum stage's, and, for a language cell that trained (its row has a
    `train_length`), one per further evaluation length (as with_stage_rows writes them)."""
    ids = [cell.id]
    if cell.task is None:
        return ids
    ids += [accuracy_cell_id(cell.variant.label, label) for label in cell.task.stage_labels]
    if "train_length" in primary:
        lengths = evaluation_lengths(primary["train_length"], cell.task.eval_lengths)
        ids += [eval_cell_id(cell.id, length) for length in lengths[1:]]
    return ids


def pending_cells(spec: Spec, rows: list[Row]) -> list[Cell]:
    """The cells of `spec` that lack a row: their own, or one of the rows they write
    beside it (a stage's, an evaluation length's, cut by a crash or set aside by
    `playground repair`). Such a cell runs again and writes only the rows it lacks."""
    recorded = {row["cell"]: row for row in rows}
    return [
        cell
        for cell in plan(spec)
        if cell.id not in recorded
        or any(each not in recorded for each in row_ids(cell, recorded[cell.id]))
    ]


def plan(spec: Spec) -> list[Cell]:
    """The cells of a spec, variant by variant: costs short sequences first, then tasks.
    Every cell id is unique (load_spec and apply_overrides refuse repeats)."""
    cells: list[Cell] = []
    for variant in spec.variants:
        if any(measure in spec.measures for measure in COST_MEASURES):
            cells += [
                Cell(variant, n, pass_name)
                for n in sorted(spec.seq_lens)
                for pass_name in spec.passes
            ]
        if "accuracy" in spec.measures:
            cells += [Cell(variant, task=task) for task in spec.tasks if task.trains(variant)]
    seen: set[str] = set()
    for cell in cells:
        if cell.id in seen:
            raise PlaygroundError(f"cell {cell.id!r} is planned twice; the spec repeats it")
        seen.add(cell.id)
    return cells
