"""What an executor is handed to measure a run's cells (a RunContext, never the Runner),
and the Executor protocol every executor keeps."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from playground.registry import Registry
from playground.run.cells import Cell
from playground.run.measurer import Measurer
from playground.run.row_schema import Row
from playground.run.spec import Spec

Record = Callable[[Row], None]
"""Called in the runner's process with each row once it is complete."""


@dataclass(frozen=True)
class RunContext:
    """One run as an executor sees it."""

    spec: Spec
    registry: Registry
    threads: int
    """The torch threads every cost cell runs on (a resume keeps its run's count)."""
    measurer: Measurer
    """Measures cells in the runner's process, against the run's GEMM ceiling."""
    describe: Callable[[str], None]
    """Says on the progress bar what is running now."""


class Executor(Protocol):
    """Where a run's cells execute (docs/design.md, Results: `local` and `ray`)."""

    name: str

    def execute(self, context: RunContext, cells: Sequence[Cell], record: Record) -> None:
        """Measure `cells`, calling `record` in this process with each row once it is
        complete; KeyboardInterrupt stops what is still running and propagates."""
