"""The experiment runner: a spec's pending cells handed to an executor, and each row
appended to the run's results.jsonl as it comes back (the runner's process is its only
writer).

Every call runs on the run's thread count (env.json `threads`, also in every row).
Ctrl-C stops after writing nothing partial: finished rows stay, and `--resume RUN_DIR`
runs only the cells that have no row yet. One process at a time measures a run
directory: the runner holds its lock (`RunStore.lock`) from `start()` to the end of
`measure_pending()`, so two resumes never measure the same cells twice.

The GEMM ceiling is measured at the start of a run and again at its end; env.json keeps
both (`gemm_measurements`) and the faster as `gemm_flops_per_s` (`gemm_best_of` says
which), and the summary states efficiency against that best. A run with decode cells does
the same for the memory bandwidth its decoding steps are compared with
(`bandwidth_measurements`, `memory_bandwidth_bytes_per_s`, `bandwidth_best_of`).
"""

from __future__ import annotations

import time
import tomllib
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    Task,
    TextColumn,
    TimeRemainingColumn,
)

from playground.registry import Registry
from playground.run.cells import Cell, pending_cells, with_stage_rows
from playground.run.context import Executor, RunContext
from playground.run.decode_cost import memory_bandwidth
from playground.run.environment import environment
from playground.run.executors import executor_for
from playground.run.instruments import (
    cpu_count,
    gemm_fields,
    gemm_flops_per_second,
    gemm_rate_of,
    load_average,
    resolve_threads,
)
from playground.run.language_scores import corpus_conflict
from playground.run.measurer import Measurer, check_device
from playground.run.row_schema import Row
from playground.run.spec import DECODE, Spec
from playground.run.store import ENV, OVERRIDES, REJECTED, ROWS, SPEC, RunLock, RunStore

GEMM_AGAIN_AFTER_S = 30.0
"""A run whose cells took at least this long measures the GEMM ceiling again at its end:
the machine's load may have changed since the start. A shorter run is one moment, and a
second GEMM would only lengthen it."""


MEASURED_RATES = {
    "gemm": ("gemm_flops_per_s", "flops_per_s"),
    "bandwidth": ("memory_bandwidth_bytes_per_s", "bytes_per_s"),
}
"""What the runner measures of the machine: env.json's key for the fastest measurement,
and the rate's key in each measurement."""


def finished_line(row: Row, finished: int, cells: Task) -> str:
    """`3/70 alibi|n=512|forward: ok in 4.2 s (about 310 s to go)`: a finished cell, for
    output that is not a terminal, where rich draws no progress bar."""
    wall = f" in {row['wall_s']:.1f} s" if isinstance(row.get("wall_s"), (int, float)) else ""
    remaining = cells.time_remaining
    left = (
        f" (about {remaining:.0f} s to go)" if remaining and finished < (cells.total or 0) else ""
    )
    return escape(f"{finished}/{cells.total:.0f} {row['cell']}: {row['status']}{wall}{left}")


class Runner:
    """One run: its files, its pending cells, and the executor that measures them. The
    runner's process is the only writer of results.jsonl."""

    def __init__(
        self, spec: Spec, registry: Registry, store: RunStore, console: Console | None = None
    ) -> None:
        self.spec = spec
        self.registry = registry
        self.store = store
        self.console = console or Console()
        self.gemm_flops: float | None = None
        self.threads = resolve_threads(spec.threads)
        """The torch threads every cell runs on; a resume keeps its run's count."""
        self.measurer = Measurer(spec, registry, self.threads, None)
        self.progress: Progress | None = None
        self.lock: RunLock | None = None
        """Held from start() to the end of measure_pending(): no other process measures this run."""

    def close(self) -> None:
        """Release the run directory's lock (measure_pending() does at its end)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def warn_baseline_not_run(self) -> None:
        """Say so when the spec's baseline is not among the setups run (--no-baseline
        left it out): the summary then has no speed-ups, and silence would hide why."""
        try:
            named = tomllib.loads(self.spec.text).get("baseline")
        except (tomllib.TOMLDecodeError, TypeError, AttributeError):
            return
        labels = {variant.label for variant in self.spec.variants}
        if isinstance(named, str) and named not in labels:
            self.console.print(
                f"[yellow]warning[/yellow]: the spec's baseline {named!r} is not among the "
                f"variants run ({', '.join(sorted(labels))}), so there are no speed-ups; a "
                f"run without --no-baseline runs it beside --variants",
                soft_wrap=True,
            )

    def start(self, overrides: dict[str, Any] | None = None) -> None:
        """Lock the run directory, record the spec, the command-line overrides and the
        environment (its load average included), then measure the GEMM ceiling: a resume
        reuses the figure and the thread count its rows were measured with. The files are
        written before the GEMM, so a run interrupted while it is measured resumes the
        cells it was asked for. RunLocked when another process holds the run."""
        if self.lock is None:
            self.lock = self.store.lock()
        cut = self.store.set_aside_cut_line()  # under the lock: no writer is mid-line now
        if cut is not None:
            self.console.print(
                f"[yellow]warning[/yellow]: {self.store.path(ROWS)} line {cut.number} was cut "
                f"short (a crash while it was written); it is set aside in {REJECTED}, and "
                f"its row is measured again",
                soft_wrap=True,
            )
        self.warn_baseline_not_run()
        if self.store.path(ENV).exists():
            env = self.store.read_json(ENV)
            self.threads = env.get("threads") or self.threads
        else:
            check_device(self.spec.device)
            self.store.write_text(SPEC, self.spec.text)
            self.store.write_json(OVERRIDES, overrides or {})
            env = environment(self.spec.device, self.threads)
            env.update(
                load_average=load_average(),
                cores=cpu_count(),
                plugin_load_errors=[
                    {"source": error.source, "error": error.message}
                    for error in self.registry.errors
                ],
            )
            env.update(
                gemm_flops_per_s=None,
                dtype=self.spec.dtype,
                experiment=self.spec.name,
                spec_file=str(self.spec.path),
                overrides=overrides or {},
            )
            self.store.write_json(ENV, env)
        if not env.get("gemm_flops_per_s"):
            self.console.print(
                f"measuring {self.spec.dtype} GEMM throughput on {self.spec.device} "
                f"({self.threads} threads)…"
            )
            self.record_gemm(env, "start")
        if self.decodes and not env.get("memory_bandwidth_bytes_per_s"):
            self.console.print(
                f"measuring memory bandwidth on {self.spec.device} ({self.threads} threads)…"
            )
            self.record_bandwidth(env, "start")
        self.gemm_flops = gemm_rate_of(env)  # with both libraries' rates, for the rows
        self.measurer = Measurer(
            self.spec,
            self.registry,
            self.threads,
            self.gemm_flops,
            bandwidth=env.get("memory_bandwidth_bytes_per_s"),
        )
        if self.spec.save_weights:
            self.measurer.keep_weights = self.store.save_weights

    def record_gemm(self, env: dict[str, Any], when: str) -> None:
        """Measure the GEMM ceiling now and write it to env.json beside the earlier ones
        (`gemm_measurements`), keeping the fastest as `gemm_flops_per_s` and naming it in
        `gemm_best_of`: a matmul only ever gets slower when the machine is shared, so the
        fastest is the nearest to the machine's ceiling. Each measurement, and env.json
        beside `gemm_flops_per_s`, also keeps the rates of torch's matmul and of oneDNN
        that the ceiling is the faster of (`gemm_fields`)."""
        flops = gemm_flops_per_second(self.spec.device, self.spec.torch_dtype, threads=self.threads)
        measured = list(env.get("gemm_measurements") or [])
        if not measured and env.get("gemm_flops_per_s"):  # a run from before this list
            measured.append({"at": "start", "flops_per_s": env["gemm_flops_per_s"]})
        rates = {key.removeprefix("gemm_"): value for key, value in gemm_fields(flops).items()}
        entry = {"at": when, **rates}
        best = max([*measured, entry], key=lambda measurement: measurement["flops_per_s"])
        env.update(gemm_fields(gemm_rate_of(best, prefix="")))
        self._keep_fastest(env, "gemm", measured, entry)

    @property
    def decodes(self) -> bool:
        """Whether the run times decoding steps (and so needs the memory bandwidth)."""
        return DECODE in self.spec.passes and "speed" in self.spec.measures

    def record_bandwidth(self, env: dict[str, Any], when: str) -> None:
        """Measure the memory bandwidth now and write it to env.json beside the earlier ones
        (`bandwidth_measurements`, each with the bytes it read), keeping the fastest as
        `memory_bandwidth_bytes_per_s` (`bandwidth_best_of` says which), as for the GEMM."""
        bandwidth = memory_bandwidth(self.spec.device, self.spec.torch_dtype, self.threads)
        measured = list(env.get("bandwidth_measurements") or [])
        entry = {
            "at": when,
            "bytes_per_s": bandwidth.bytes_per_s,
            "buffer_bytes": bandwidth.buffer_bytes,
        }
        self._keep_fastest(env, "bandwidth", measured, entry)

    def _keep_fastest(
        self, env: dict[str, Any], kind: str, measured: list[dict[str, Any]], entry: dict
    ) -> None:
        """Append `entry` (with the load now) to `{kind}_measurements`, and set the fastest
        rate and when it was taken (`{kind}_best_of`); write env.json."""
        headline, rate = MEASURED_RATES[kind]
        measured.append({**entry, "load_average": load_average()})
        best = max(measured, key=lambda measurement: measurement[rate])
        env.update(
            {
                f"{kind}_measurements": measured,
                headline: best[rate],
                f"{kind}_best_of": best["at"],
            }
        )
        self.store.write_json(ENV, env)

    def pending(self) -> list[Cell]:
        """The cells that lack a row (cells.pending_cells)."""
        return pending_cells(self.spec, self.store.rows())

    def measure_pending(self, executor: Executor | None = None) -> tuple[int, bool]:
        """Measure every pending cell on `executor` (default: the spec's); returns
        (cells run, finished without interrupt)."""
        cells = self.pending()
        executor = executor or executor_for(self.spec)
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(elapsed_when_finished=True),
        )
        finished = 0
        by_id = {cell.id: cell for cell in cells}
        timed = "speed" in self.spec.measures and any(cell.task is None for cell in cells)
        started = time.monotonic()

        corpora: dict[str, str] = {}
        recorded = set()
        for earlier in self.store.rows():
            corpus_conflict(earlier, corpora)
            recorded.add(earlier["cell"])

        def record(row: Row) -> None:
            nonlocal finished
            for each in with_stage_rows(row, by_id[row["cell"]]):
                if each["cell"] in recorded:  # a cell run again for a row it lacked
                    continue
                conflict = corpus_conflict(each, corpora)
                if conflict and each.get("status") == "ok":
                    each["status"], each["error"] = "error", conflict  # its numbers stay in the row
                self.store.append(each)
                recorded.add(each["cell"])
            finished += 1
            progress.advance(bar)
            if not self.console.is_terminal:  # no bars are drawn: a line per cell instead
                cells_bar = next(task for task in progress.tasks if task.id == bar)
                self.console.print(finished_line(row, finished, cells_bar), soft_wrap=True)

        with Progress(*columns, console=self.console, transient=False) as progress:
            self.measurer.progress = progress
            self.progress = progress
            bar = progress.add_task("cells", total=len(cells))
            try:
                executor.execute(self.context(), cells, record)
                long = time.monotonic() - started >= GEMM_AGAIN_AFTER_S
                if timed and long and executor.name == "local" and self.store.path(ENV).exists():
                    # Again at the end: the start's may have met a busy moment. (A remote
                    # executor's rows are against their own nodes' ceilings.)
                    self.describe("measuring the GEMM ceiling again")
                    self.record_gemm(self.store.read_json(ENV), "end")
                    if self.decodes:
                        self.describe("measuring the memory bandwidth again")
                        self.record_bandwidth(self.store.read_json(ENV), "end")
            except KeyboardInterrupt:
                return finished, False
            finally:
                self.measurer.progress = None
                self.close()
        return finished, True

    def context(self) -> RunContext:
        """What the executor is handed: the run, not the runner."""
        return RunContext(self.spec, self.registry, self.threads, self.measurer, self.describe)

    def describe(self, text: str) -> None:
        """Say on the progress bar what is running now."""
        if self.progress is not None:
            self.progress.update(self.progress.task_ids[0], description=text)
