"""Training progress across processes: steps and the time remaining while seeds train on
worker processes, and a line as each seed finishes when the output is not a terminal.

A worker has no console. `StepReporter` stands in for the rich Progress that
`playground.model.training.train` reports its steps to, and sends `StepReport`s (which
seed, how many steps of how many) to the driver, at most every REPORT_EVERY_S. The
driver's `TrainingBars` turns them into a bar per running seed and one for all the
training of the run, each with its time remaining (rich's estimate). On a console that is
not a terminal (a log file, CI), where rich draws no bars, it prints a line as each seed
finishes instead, with the steps done and the time remaining.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.markup import escape
from rich.progress import Progress, TaskID

REPORT_EVERY_S = 1.0
"""How often a worker reports its steps (and once more at the end of each stage)."""


@dataclass(frozen=True)
class StepReport:
    """One seed's training, as a worker reports it."""

    cell: str
    seed: int
    description: str
    """What train() calls it: the variant, the task (or curriculum stage) and the seed."""
    completed: int
    """Steps done in this stage."""
    total: int
    """Steps of this stage."""
    finished: bool = False
    """The stage ended (train() removed its bar)."""


class StepReporter:
    """The part of a rich Progress that train() calls (add_task, update, remove_task), in a
    worker process: each call becomes a StepReport handed to `send` (a queue's put)."""

    def __init__(self, send: Callable[[StepReport], None], cell: str, seed: int) -> None:
        self.send = send
        self.cell = cell
        self.seed = seed
        self.description = ""
        self.completed = 0
        self.total = 0
        self.sent_at = 0.0

    def _report(self, finished: bool = False, now: float | None = None) -> None:
        self.sent_at = time.monotonic() if now is None else now
        self.send(
            StepReport(self.cell, self.seed, self.description, self.completed, self.total, finished)
        )

    def add_task(self, description: str, total: float | None = None, **_: Any) -> TaskID:
        self.description, self.completed, self.total = description, 0, int(total or 0)
        self._report()
        return TaskID(0)

    def update(
        self, task_id: TaskID, *, advance: float = 0, description: str | None = None, **_: Any
    ) -> None:
        self.completed += int(advance)
        if description is not None:
            self.description = description
        now = time.monotonic()
        if now - self.sent_at >= REPORT_EVERY_S:
            self._report(now=now)

    def remove_task(self, task_id: TaskID) -> None:
        self._report(finished=True)


class TrainingBars:
    """The driver's view of seeds training elsewhere: a bar per running seed, and one for
    the steps of every seed (`total_steps`), on the runner's `progress`."""

    def __init__(self, progress: Progress | None, total_steps: int, seeds: int) -> None:
        self.progress = progress
        self.seeds = seeds
        self.finished_seeds = 0
        self.bars: dict[tuple[str, int], TaskID] = {}
        self.done_in_stage: dict[tuple[str, int], int] = {}
        self.overall = (
            progress.add_task(f"training steps of {seeds} seeds", total=max(total_steps, 1))
            if progress is not None
            else None
        )

    def steps(self, report: StepReport) -> None:
        """Show what a worker reported: its seed's bar, and the steps on the overall bar."""
        progress = self.progress
        if progress is None or self.overall is None:
            return
        key = (report.cell, report.seed)
        advanced = report.completed - self.done_in_stage.get(key, 0)
        self.done_in_stage[key] = 0 if report.finished else report.completed
        progress.advance(self.overall, max(advanced, 0))
        if report.finished:
            if key in self.bars:
                progress.remove_task(self.bars.pop(key))
        elif key in self.bars:
            progress.update(
                self.bars[key], completed=report.completed, description=report.description
            )
        else:
            self.bars[key] = progress.add_task(
                report.description, total=max(report.total, 1), completed=report.completed
            )

    def seed_done(self, cell: str, seed: int, failure: str | None) -> None:
        """A seed's outcome came back: its bar goes, and where no bar is drawn a line says
        so, with the time the rest of the training should take."""
        self.finished_seeds += 1
        progress = self.progress
        if progress is None or self.overall is None:
            return
        key = (cell, seed)
        if key in self.bars:
            progress.remove_task(self.bars.pop(key))
        if progress.console.is_terminal:
            return
        task = next((each for each in progress.tasks if each.id == self.overall), None)
        steps = f", {task.completed:.0f}/{task.total:.0f} steps" if task else ""
        remaining = task.time_remaining if task is not None else None
        eta = f", about {remaining:.0f} s to go" if remaining else ""
        outcome = f"failed: {failure}" if failure else "trained"
        progress.console.print(
            f"seed {seed} of {escape(cell)} {escape(outcome)} ({self.finished_seeds}/"
            f"{self.seeds} seeds{steps}{eta})",
            soft_wrap=True,
        )

    def close(self) -> None:
        """Take the bars down (the cells bar says what is left)."""
        if self.progress is None:
            return
        for bar in [*self.bars.values(), *([self.overall] if self.overall is not None else [])]:
            self.progress.remove_task(bar)
        self.bars.clear()
        self.overall = None
