"""The packed lane on this machine: an accuracy cell's seeds trained side by side on
one-thread worker processes.

`SeedPool` runs them on worker processes that rebuild the driver's registry (its
`Registry.recipe`), so a plugin from `--plugins-dir` trains there too.

Workers are spawned, not forked: a forked child inherits the parent's OpenMP thread pool
in a state it cannot use. A worker that dies (killed, out of memory) breaks the pool; the
seeds that were running then are retried one at a time on a pool of their own, so a seed
is recorded as `error` (with the reason) only when it kills its worker again, alone.

No worker outlives the driver. SIGTERM or SIGHUP to the driver (a batch system's time
limit, a closed terminal) is handled as Ctrl-C is: the workers are killed, the rows already
recorded stay, and `--resume` runs the rest. A driver killed outright cannot clean up, so
each worker watches its parent and ends itself when the driver is gone. A worker that
cannot load what the driver loaded (a plugin that imports something only the driver's
environment has) answers each of its seeds with an `error` naming what failed to load.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import os
import platform
import queue as queue_module
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import torch

from playground.errors import FailureFields
from playground.kernels import native
from playground.registry import LoadStep, Registry
from playground.run.seeds import SeedOutcome, SeedTask, missing_variant, train_seed_task
from playground.run.training_progress import StepReporter, TrainingBars

RETRIES = 1
"""Further attempts, alone, for a seed whose worker died under it."""
IDLE_BREAKS = 3
"""Pool breaks a seed may see before it was seen running (it may have died within one
poll) before it is treated as a suspect."""
PARENT_POLL_S = 0.5
"""How often a worker checks that the driver is still alive."""
STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)
)
"""Signals that end the driver the way Ctrl-C does, so that its workers end with it."""


_worker_registry: Registry | None = None
_worker_problem: str | None = None
"""Why this worker could not load the driver's registry (None when it could)."""
_worker_reports: Any = None
"""Where this worker sends its StepReports (a multiprocessing queue; None: nowhere)."""


def _watch_parent(parent: int) -> None:
    """End this worker once `parent` (the driver) is gone: a worker whose driver was
    killed would otherwise train on, holding the driver's stdout open."""
    while os.getppid() == parent:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def _start_worker(recipe: Sequence[LoadStep], parent: int, reports: Any) -> None:
    global _worker_registry, _worker_problem, _worker_reports
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    if reports is not None:
        reports.cancel_join_thread()  # a report left unsent never holds up the exit
        _worker_reports = reports
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    torch.set_num_threads(1)
    try:
        _worker_registry = Registry.from_recipe(recipe)
        native.build_state()  # built (or loaded) before any seed's training time starts
    except Exception as error:  # an initializer's raise breaks the pool with no reason
        _worker_problem = f"{type(error).__name__}: {error}"


def _train_in_worker(task: SeedTask) -> SeedOutcome:
    where = f"the packed lane's worker process {os.getpid()}"
    if _worker_problem is not None:
        problem = f"{where} could not load the driver's plugins: {_worker_problem}"
    else:
        assert _worker_registry is not None, "the worker's initializer did not run"
        missing = missing_variant(_worker_registry, task.job.variant, where)
        if missing is None:
            reporter = (
                None
                if _worker_reports is None
                else StepReporter(_worker_reports.put, task.cell, task.seed)
            )
            return train_seed_task(_worker_registry, task, reporter)
        problem = missing
    now = time.time()
    failure: FailureFields = {"status": "error", "error": problem}
    return SeedOutcome(task, None, failure, platform.node(), 1, now, now)


class _Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP reached the driver: it stops as Ctrl-C stops it."""


@contextlib.contextmanager
def _stopping_on_signals():
    """Within: SIGTERM and SIGHUP raise KeyboardInterrupt in this (the main) thread, so
    that the workers are killed and the recorded rows kept before the driver ends."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers; its own handlers stand
        return

    def stop(number: int, frame: object) -> None:
        raise _Stopped(f"stopped by {signal.Signals(number).name}")

    previous = {number: signal.signal(number, stop) for number in STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _died(task: SeedTask, error: BaseException, attempts: int) -> SeedOutcome:
    now = time.time()
    failure: FailureFields = {
        "status": "error",
        "error": f"the worker process training seed {task.seed} died ({attempts} times "
        f"alone or as the only seed running): "
        f"{type(error).__name__}: {error}; a kill or the out-of-memory killer does this",
    }
    return SeedOutcome(task, None, failure, platform.node(), 1, now, now)


class SeedPool:
    """`workers` spawned processes, one torch thread each, training seeds; `bars` (the
    driver's TrainingBars) shows their steps as the workers report them."""

    def __init__(self, registry: Registry, workers: int, bars: TrainingBars | None = None) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1; got {workers}")
        self.recipe = list(registry.recipe)
        self.workers = workers
        self.bars = bars
        self._context = multiprocessing.get_context("spawn")
        self._reports = self._context.Queue() if bars is not None else None
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._size = 0

    def _fresh_pool(self, workers: int) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool = concurrent.futures.ProcessPoolExecutor(
            workers,
            mp_context=self._context,
            initializer=_start_worker,
            initargs=(self.recipe, os.getpid(), self._reports),
        )
        self._size = workers
        return self._pool

    def worker_pids(self) -> list[int]:
        """The live workers' process ids (a test kills one)."""
        # ProcessPoolExecutor has no public handle on its processes before Python 3.14.
        processes: dict[int, Any] = getattr(self._pool, "_processes", None) or {}
        return [pid for pid, process in processes.items() if process.is_alive()]

    def train(self, tasks: Sequence[SeedTask], done: Callable[[SeedOutcome], None]) -> None:
        """Train every task, calling `done` with each outcome as it comes back (in the
        order they finish). KeyboardInterrupt, SIGTERM or SIGHUP stops the workers and
        propagates as KeyboardInterrupt.

        A death breaks the whole pool, so it does not say whose seed killed it: the seeds
        that were running then are suspects, retried one at a time on a pool of their own,
        where a death is surely the seed's own (as it is when it was the only one
        running). A seed whose own deaths exceed RETRIES is recorded as `error`. The seeds
        that had not started go back to the queue."""
        idle_breaks: Counter[tuple[str, int]] = Counter()  # broken before seen running
        deaths: Counter[tuple[str, int]] = Counter()  # deaths that were surely its own
        queue = list(tasks)
        done = self._shown(done)
        native.build_state()  # a first build happens here once, not on every worker at once
        with _stopping_on_signals():
            try:
                while queue:
                    queue, suspects = self._round(self.workers, queue, done, idle_breaks)
                    for task, error in suspects:
                        key = (task.cell, task.seed)
                        deaths[key] += len(suspects) == 1  # the only one running: its own
                        while deaths[key] <= RETRIES:
                            _, died = self._round(1, [task], done, idle_breaks, alone=True)
                            if not died:
                                break  # it trained alone (done has its outcome)
                            deaths[key] += 1
                            error = died[0][1]
                        else:
                            done(_died(task, error, deaths[key]))
            except BaseException:
                self.close(kill=True)
                raise

    def _round(
        self,
        workers: int,
        tasks: Sequence[SeedTask],
        done: Callable[[SeedOutcome], None],
        idle_breaks: Counter[tuple[str, int]],
        alone: bool = False,
    ) -> tuple[list[SeedTask], list[tuple[SeedTask, BaseException]]]:
        """Run `tasks` on a pool of `workers`; returns (not started when the pool broke,
        suspects with the error). `alone`: every broken task is a suspect."""
        if self._pool is None or self._size != workers:
            self._fresh_pool(workers)
        assert self._pool is not None
        futures = {self._pool.submit(_train_in_worker, task): task for task in tasks}
        requeue: list[SeedTask] = []
        suspects: list[tuple[SeedTask, BaseException]] = []
        waiting = set(futures)
        while waiting:
            running = {future for future in waiting if future.running()}
            finished, waiting = concurrent.futures.wait(
                waiting, timeout=0.5, return_when=concurrent.futures.FIRST_COMPLETED
            )
            self._show_reports()
            for future in finished:
                task = futures[future]
                key = (task.cell, task.seed)
                error = future.exception()
                if error is None:
                    done(future.result())
                elif not isinstance(error, BrokenProcessPool):
                    raise error  # the worker's own plumbing failed, not the seed
                elif alone or future in running or idle_breaks[key] >= IDLE_BREAKS:
                    suspects.append((task, error))
                else:
                    idle_breaks[key] += 1  # not started yet: no attempt spent
                    requeue.append(task)
        if requeue or suspects:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        return requeue, suspects

    def _shown(self, done: Callable[[SeedOutcome], None]) -> Callable[[SeedOutcome], None]:
        """`done`, after the seed's last reports and its end are shown on the bars."""
        bars = self.bars
        if bars is None:
            return done

        def shown(outcome: SeedOutcome) -> None:
            self._show_reports()
            failure = None if outcome.failure is None else outcome.failure["error"]
            bars.seed_done(outcome.task.cell, outcome.task.seed, failure)
            done(outcome)

        return shown

    def _show_reports(self) -> None:
        """Hand every StepReport the workers sent so far to the bars."""
        if self._reports is None or self.bars is None:
            return
        while True:
            try:
                report = self._reports.get_nowait()
            except queue_module.Empty:
                return
            self.bars.steps(report)

    def close(self, kill: bool = False) -> None:
        """Shut the workers down; `kill` stops the ones still training."""
        if self._pool is None:
            return
        if kill:
            for pid in self.worker_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool = None
