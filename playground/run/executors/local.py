"""The `local` executor: a run's cells on this machine, the packed seeds' steps shown on
the runner's bars as the workers report them (playground.run.training_progress)."""

from __future__ import annotations

import gc
from collections.abc import Sequence

from playground.kernels import native
from playground.run.cells import Cell
from playground.run.context import Record, RunContext
from playground.run.executors.seed_pool import SeedPool
from playground.run.instruments import using_threads
from playground.run.jobs import prepare
from playground.run.seeds import usable_cpus
from playground.run.spec import Spec
from playground.run.training_progress import TrainingBars


def training_steps(context: RunContext, cells: Sequence[Cell]) -> int:
    """The optimizer steps every seed of `cells` trains for (curriculum stages included),
    for the overall bar's time remaining; a cell refused before training counts none."""
    total = 0
    for cell in cells:
        assert cell.task is not None, "an accuracy cell"
        try:
            prepared = prepare(context.registry, context.measurer.job(cell))
        except Exception:  # refused: train_packed records why, and it trains no step
            continue
        per_seed = prepared.training.steps + sum(stage.steps for _, stage in prepared.stages)
        total += per_seed * len(cell.task.seeds)
    return total


class LocalExecutor:
    """This machine: the cost cells one at a time in this process, on the run's threads;
    then the accuracy cells' seeds packed on one-thread worker processes (SeedPool), or
    here, seed after seed, when one worker is asked for or only one core is usable."""

    name = "local"

    def __init__(self, accuracy_workers: int | None = None) -> None:
        self.accuracy_workers = accuracy_workers
        """None: the spec's `accuracy_workers`, else one per usable core on a CPU run."""

    def workers(self, spec: Spec, seeds: int) -> int:
        """Processes to train `seeds` pending seeds on; never more than there are seeds."""
        wanted = self.accuracy_workers or spec.accuracy_workers
        if wanted is None:
            wanted = usable_cpus() if spec.device == "cpu" else 1
        return max(1, min(wanted, seeds))

    def execute(self, context: RunContext, cells: Sequence[Cell], record: Record) -> None:
        measurer = context.measurer
        trained = [cell for cell in cells if cell.task is not None]
        seeds = sum(len(cell.task.seeds) for cell in cells if cell.task is not None)
        workers = self.workers(context.spec, seeds)
        if context.spec.device == "cpu" and cells:
            # A first build of the native kernels is no cell's time; with no cell to run
            # (a resume of a finished run), no build at all (it takes minutes).
            native.build_state()
        with using_threads(context.threads):
            try:
                for cell in cells:
                    if cell.task is None or workers == 1:
                        context.describe(cell.id)
                        record(measurer.measure(cell))
                if workers > 1 and trained:
                    context.describe(f"training seeds on {workers} workers")
                    steps = training_steps(context, trained)
                    bars = TrainingBars(measurer.progress, steps, seeds)
                    pool = SeedPool(context.registry, workers, bars)
                    try:
                        measurer.train_packed(trained, pool, record)
                    finally:
                        pool.close()
                        bars.close()
            finally:
                gc.unfreeze()  # what the cells froze may be collected again from now on
