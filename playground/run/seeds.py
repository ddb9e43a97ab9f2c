"""An accuracy cell's seeds as units of work: a SeedTask (one seed of one cell), what comes
back for it (SeedOutcome), the SeedLane protocol of somewhere seeds train, and training
one seed here (`train_seed_task`), which every lane's worker calls.

A cost cell (speed, memory) needs the machine to itself, so it is measured alone. An
accuracy cell is a few seeds of a small model, and a small model's products do not fill
several cores: on a CPU the seeds train faster side by side, one thread each, than one
after another on every thread. The driver is the only writer: it composes a cell's row
when its last seed is back.
"""

from __future__ import annotations

import os
import platform
import time
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from rich.progress import Progress

from playground.errors import FailureFields, failure_fields
from playground.registry import Registry
from playground.run.accuracy import SeedResult, train_seed
from playground.run.jobs import AccuracyJob, prepare
from playground.run.training_progress import StepReporter


@dataclass(frozen=True)
class SeedTask:
    """One seed of one accuracy cell."""

    cell: str
    """The cell's id."""
    job: AccuracyJob
    seed: int


@dataclass(frozen=True)
class SeedOutcome:
    """What came back for a seed: its result, or the status and error of its failure."""

    task: SeedTask
    result: SeedResult | None
    failure: FailureFields | None
    """`failure_fields` of what it raised (None when it trained)."""
    node: str
    threads: int
    started_at: float
    """Unix time the seed started on its worker (and below, finished)."""
    finished_at: float


class SeedLane(Protocol):
    """Somewhere seeds train: `train` calls `done` in this process with each outcome."""

    def train(self, tasks: Sequence[SeedTask], done: Callable[[SeedOutcome], None]) -> None: ...


def missing_variant(registry: Registry, name: str, where: str) -> str | None:
    """Why `name` is not registered in `registry`, built on a worker (`where`), naming
    what failed to load there; None when it is registered."""
    if name in registry.names():
        return None
    errors = "; ".join(str(error) for error in registry.errors) or "no plugin registers it"
    return (
        f"variant {name!r} loads here but not on {where} ({errors}); install what its "
        f"plugin imports where the workers run"
    )


def train_seed_task(
    registry: Registry, task: SeedTask, progress: StepReporter | None = None
) -> SeedOutcome:
    """Train and score one seed here, its steps reported to `progress`; a raise becomes
    the outcome's failure."""
    started = time.time()
    result, failure = None, None
    try:
        bars = typing.cast(Progress | None, progress)  # the calls train() makes of a Progress
        result = train_seed(registry, prepare(registry, task.job), task.seed, bars)
    except Exception as error:  # one seed's failure is its cell's record, not the run's end
        failure = failure_fields(error)
    return SeedOutcome(
        task, result, failure, platform.node(), torch.get_num_threads(), started, time.time()
    )


def usable_cpus() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
