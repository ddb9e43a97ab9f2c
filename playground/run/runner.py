"""The experiment runner: every (variant point, seq_len, pass) cell of a spec, measured
and appended to the run's results.jsonl as it finishes.

A cell that raises is recorded (`unsupported` for UnsupportedFeature, `oom` for an
out-of-memory error, `error` otherwise, with the message) and the sweep goes on. A call
whose result the contract forbids (not an AttentionOutput, an output not of shape
(B, N, d_model), not of the run's dtype, or not finite) is recorded as `invalid` with the
reason and without timings: only `ok` rows are measurements. Every call runs on the run's
thread count (env.json `threads`, also in every row). Ctrl-C stops after writing nothing
partial: finished rows stay, and `--resume RUN_DIR` runs only the cells that have no row
yet. One process at a time measures a run directory: the runner holds its lock
(`RunStore.lock`) from `start()` to the end of `run()`, so two resumes never measure the
same cells twice.

How sure a timing is travels with it: every timed row holds its timed runs, its IQR (None
without a spread), the 1-minute load average and core count when it started, and `flags`
(measure.cost_flags: few runs, large spread, efficiency above 1, a non-finite flops(), a
busy machine). The GEMM ceiling is measured at the start of a run and again at its end;
env.json keeps both (`gemm_measurements`) and the faster as `gemm_flops_per_s`
(`gemm_best_of` says which), and the summary states efficiency against that best.
"""

from __future__ import annotations

import gc
import math
import platform
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from playground.contract import AttentionOutput, AttentionVariant
from playground.errors import InvalidOutput, PlaygroundError, failure_fields
from playground.kernels import native
from playground.registry import Registry
from playground.run.accuracy import AccuracyJob, Prepared, measure_accuracy, prepare, row_fields
from playground.run.fidelity import measure_fidelity
from playground.run.measure import (
    FLAG_FLOPS_NOT_FINITE,
    cost_flags,
    cpu_count,
    gemm_flops_per_second,
    load_average,
    peak_memory_bytes,
    resolve_threads,
    time_call,
    using_threads,
)
from playground.run.seeds import SeedLane, SeedOutcome, SeedPool, SeedTask, usable_cpus
from playground.run.spec import Spec, TaskRun, VariantPoint
from playground.run.store import ENV, OVERRIDES, SPEC, RunLock, RunStore, environment

BACKWARD_FLOPS_FACTOR = 3
"""forward + backward ≈ 3 × forward FLOPs (the backward computes two products per
forward product: gradients of the inputs and of the weights)."""


COST_MEASURES = ("speed", "memory", "fidelity")

GEMM_AGAIN_AFTER_S = 30.0
"""A run whose cells took at least this long measures the GEMM ceiling again at its end:
the machine's load may have changed since the start. A shorter run is one moment, and a
second GEMM would only lengthen it."""


@dataclass(frozen=True)
class Cell:
    """One measurement: a variant point at one length and pass (cost), or trained on one
    task over its seeds (accuracy)."""

    variant: VariantPoint
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


def with_stage_rows(row: dict[str, Any], cell: Cell) -> list[dict[str, Any]]:
    """`row`, then one row per curriculum stage of `cell`'s task: the stage's scores
    (row_fields' "stages") over the row's other fields, or, when the cell failed, the
    row's status and error under each stage's label."""
    if cell.task is None or not cell.task.curriculum:
        return [row]
    row = dict(row)
    scored = row.pop("stages", None) or [
        {"task_label": label, "task_options": {**cell.task.options, **stage.options}}
        for label, stage in zip(cell.task.stage_labels, cell.task.curriculum, strict=True)
    ]
    return [row] + [
        {**row, **stage, "cell": accuracy_cell_id(cell.variant.label, stage["task_label"])}
        for stage in scored
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


def check_device(device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        raise PlaygroundError(
            "device 'cuda' was asked for but torch.cuda.is_available() is False (no GPU, or "
            "a CPU-only torch build); run with --device cpu"
        )


def output_problem(result: object, shape: tuple[int, ...], dtype: torch.dtype) -> str | None:
    """Why a call's result breaks the contract (an AttentionOutput whose output has
    `shape` and `dtype` and is finite); None when it keeps it."""
    if not isinstance(result, AttentionOutput):
        return f"returned a {type(result).__name__}, not an AttentionOutput"
    output = result.output
    if not isinstance(output, torch.Tensor):
        return f"returned an output that is a {type(output).__name__}, not a tensor"
    if tuple(output.shape) != shape:
        return f"output has shape {tuple(output.shape)}, not (B, N, d_model) = {shape}"
    if output.dtype != dtype:
        return f"output is {output.dtype} in a {dtype} run"
    finite = torch.isfinite(output)
    if not bool(finite.all()):
        bad = int((~finite).sum())
        return f"output has {bad} non-finite value(s) (NaN or inf) of {output.numel()}"
    return None


class Workload:
    """The call that is timed and profiled for one pass. Each call leaves nothing behind
    (forward+backward frees its gradients at the end), so every call, the profiled one
    included, starts from the same memory state. The first call's result is checked
    against the contract as it returns (before any timing), the latest one is kept
    (detached) for `check()` after timing and after profiling."""

    def __init__(self, module: AttentionVariant, tokens: torch.Tensor, pass_name: str) -> None:
        self.module = module
        self.expected = (tokens.shape, tokens.dtype)
        self.backward = pass_name == "forward_backward"
        module.train(self.backward)
        # As for a layer inside a model, the input needs a gradient too: the backward then
        # does every product the ×3 FLOPs convention counts (weights and inputs).
        self.tokens = tokens.detach().requires_grad_(True) if self.backward else tokens
        self.latest: object = None
        self.calls = 0

    def __call__(self) -> None:
        if not self.backward:
            with torch.no_grad():
                self.latest = self.module(self.tokens)
        else:
            result = self.module(self.tokens)
            if not isinstance(result, AttentionOutput) or not torch.is_tensor(result.output):
                self.latest = result
                self.check()  # raises: there is nothing to run the backward from
            result.output.sum().backward()
            self.module.zero_grad(set_to_none=True)  # held gradients would skew memory
            self.tokens.grad = None
            self.latest = AttentionOutput(result.output.detach(), None)
        self.calls += 1
        if self.calls == 1:
            self.check()

    def check(self) -> None:
        """InvalidOutput naming what is wrong with the latest call's result."""
        shape, dtype = self.expected
        problem = output_problem(self.latest, tuple(shape), dtype)
        if problem:
            raise InvalidOutput(problem)


workload = Workload
"""The name the benchmark suite and older tests import."""


class Measurer:
    """Measures cells where it runs: a cost cell on `threads` torch threads, its efficiency
    against `gemm_flops` (the throughput of the machine doing the work), an accuracy cell
    seed after seed. The runner has one; so does every remote worker of an executor."""

    def __init__(
        self,
        spec: Spec,
        registry: Registry,
        threads: int,
        gemm_flops: float | None,
        progress: Progress | None = None,
        node: str | None = None,
    ) -> None:
        self.spec = spec
        self.registry = registry
        self.threads = threads
        self.gemm_flops = gemm_flops
        self.progress = progress
        """Where accuracy cells add their training bars (the runner's own)."""
        self.node = node or platform.node()

    def row(self, cell: Cell) -> dict[str, Any]:
        """The fields every row of `cell` starts with: what it is and where it runs."""
        spec = self.spec
        row: dict[str, Any] = {
            "cell": cell.id,
            "variant": cell.variant.name,
            "label": cell.variant.label,
            "options": cell.variant.options,
            "device": spec.device,
            "node": self.node,
            "threads": self.threads,
            "gemm_flops_per_s": self.gemm_flops,
            "dtype": spec.dtype,
            "status": "ok",
            "error": None,
        }
        if cell.task is None:
            row.update(
                seq_len=cell.seq_len,
                batch_size=spec.batch_size,
                d_model=spec.d_model,
                num_heads=spec.num_heads,
                **{"pass": cell.pass_name},
            )
        else:
            row.update(
                task=cell.task.name,
                task_label=cell.task.label,
                task_options=cell.task.options,
                d_model=cell.task.d_model,
                num_heads=cell.task.num_heads,
                num_layers=cell.task.num_layers,
            )
        return row

    def measure(self, cell: Cell) -> dict[str, Any]:
        """Measure `cell` here, on the run's threads; a raise is recorded, not propagated
        (Ctrl-C excepted)."""
        row = self.row(cell)
        row["started_at"] = time.time()
        started = time.perf_counter()
        try:
            if cell.task is None:
                row.update(self._measure(cell))
            else:
                row.update(
                    measure_accuracy(
                        self.registry,
                        self.job(cell),
                        seeds=cell.task.seeds,
                        progress=self.progress,
                    )
                )
        except KeyboardInterrupt:
            raise
        except BaseException as error:  # one cell's failure must not end the sweep
            row.update(failure_fields(error))
        finally:
            # Free what the cell left in reference cycles, then freeze what survives (the
            # run's own modules, registry and caches): the next cell's collect then walks
            # only what that cell made, not the whole heap (a quarter second per cell).
            gc.collect()
            gc.freeze()
            if self.spec.device == "cuda":
                torch.cuda.empty_cache()
        row["wall_s"] = time.perf_counter() - started
        row["finished_at"] = time.time()
        return row

    def job(self, cell: Cell) -> AccuracyJob:
        task = cell.task
        assert task is not None
        return AccuracyJob(
            cell.variant.name,
            cell.variant.options,
            task.name,
            task.options,
            steps=task.steps,
            d_model=task.d_model,
            num_heads=task.num_heads,
            num_layers=task.num_layers,
            learning_rate=task.learning_rate,
            batch_size=task.batch_size,
            curriculum=task.curriculum,
            device=self.spec.device,
            dtype=self.spec.torch_dtype,
        )

    def packed_row(
        self, cell: Cell, prepared: Prepared, outcomes: dict[int, SeedOutcome]
    ) -> dict[str, Any]:
        """One accuracy cell's row from its seeds' outcomes, in the spec's seed order."""
        seeds = cell.task.seeds
        ordered = [outcomes[seed] for seed in seeds]
        row = self.row(cell)
        row.update(
            node=",".join(sorted({outcome.node for outcome in ordered})),
            threads=max(outcome.threads for outcome in ordered),
            started_at=min(outcome.started_at for outcome in ordered),
            finished_at=max(outcome.finished_at for outcome in ordered),
        )
        row["wall_s"] = row["finished_at"] - row["started_at"]
        failed = [outcome for outcome in ordered if outcome.failure is not None]
        if failed:
            first = failed[0]
            row.update(first.failure)
            row["error"] = f"seed {first.task.seed}: {row['error']}"
        else:
            row.update(row_fields(prepared, seeds, [outcome.result for outcome in ordered]))
        return row

    def _measure(self, cell: Cell) -> dict[str, Any]:
        spec = self.spec
        torch.manual_seed(spec.seed)
        module = self.registry.build(
            cell.variant.name, spec.d_model, spec.num_heads, **cell.variant.options
        ).to(spec.device, spec.torch_dtype)
        generator = torch.Generator().manual_seed(spec.seed)
        tokens = torch.randn(spec.batch_size, cell.seq_len, spec.d_model, generator=generator).to(
            spec.device, spec.torch_dtype
        )
        run_pass = Workload(module, tokens, cell.pass_name)
        fields: dict[str, Any] = {}
        flops = spec.batch_size * module.count_flops(cell.seq_len, cell.seq_len)
        if cell.pass_name == "forward_backward":
            flops *= BACKWARD_FLOPS_FACTOR
        finite = math.isfinite(flops)
        # JSON has no inf: a count that overflowed is left out of the row and flagged, so
        # that nothing downstream divides by it or draws it.
        fields["flops"] = flops if finite else None
        if not finite:
            fields["flags"] = [FLAG_FLOPS_NOT_FINITE]
            fields["flops_note"] = (
                f"{cell.variant.name}.flops({cell.seq_len}, {cell.seq_len}) gave {flops!r} "
                f"(an overflow?), so this cell has no GFLOP/s and no efficiency; the times "
                f"stand. Count in Python ints or floats that stay finite at this length"
            )
        if "speed" in spec.measures:
            load = load_average()
            cores = cpu_count()
            timing = time_call(run_pass, spec.min_run_time, self.threads)
            run_pass.check()  # the last timed call
            efficiency = (
                flops / timing.median_s / self.gemm_flops if finite and self.gemm_flops else None
            )
            fields.update(
                time_ms=timing.median_s * 1e3,
                time_iqr_ms=None if timing.iqr_s is None else timing.iqr_s * 1e3,
                timed_runs=timing.runs,
                gflops_per_s=flops / timing.median_s / 1e9 if finite else None,
                efficiency=efficiency,
                load_average=load,
                cores=cores,
                flags=cost_flags(
                    time_s=timing.median_s,
                    iqr_s=timing.iqr_s,
                    runs=timing.runs,
                    efficiency=efficiency,
                    flops=flops,
                    load=load,
                    cores=cores,
                ),
            )
        for key in ("flops", "gflops_per_s", "efficiency"):
            # Left out rather than None: readers of older rows (the figures) treat a
            # missing number as not measured, and a None would reach their arithmetic.
            if key in fields and fields[key] is None:
                del fields[key]
        if "memory" in spec.measures:
            run_pass.latest = None  # freed now, not inside the profile
            fields["peak_memory_bytes"] = peak_memory_bytes(run_pass, spec.device)
            run_pass.check()
        if run_pass.calls == 0:  # neither timed nor profiled: one call to check
            run_pass()
        if "fidelity" in spec.measures and cell.pass_name == spec.passes[0]:
            try:
                fields.update(
                    measure_fidelity(
                        module,
                        cell.seq_len,
                        spec.batch_size,
                        spec.seed,
                        spec.device,
                        spec.torch_dtype,
                        is_causal=False,  # the timed call's own: cost cells are not causal
                    )
                )
            except (ValueError, PlaygroundError) as error:
                fields["fidelity_note"] = str(error)
        return fields

    def train_packed(
        self, cells: Sequence[Cell], lane: SeedLane, record: Callable[[dict[str, Any]], None]
    ) -> None:
        """Train the seeds of `cells` on `lane`; record each cell's row as its last seed
        comes back. A cell refused before training (unsupported, bad options) is recorded
        at once and sends nothing to the lane."""
        waiting: dict[str, tuple[Cell, Prepared, dict[int, SeedOutcome]]] = {}
        tasks: list[SeedTask] = []
        for cell in cells:
            job = self.job(cell)
            try:
                prepared = prepare(self.registry, job)
            except Exception as error:
                row = self.row(cell)
                now = time.time()
                row.update(failure_fields(error), started_at=now, finished_at=now, wall_s=0.0)
                record(row)
                continue
            waiting[cell.id] = (cell, prepared, {})
            tasks += [SeedTask(cell.id, job, seed) for seed in cell.task.seeds]

        def done(outcome: SeedOutcome) -> None:
            cell, prepared, outcomes = waiting[outcome.task.cell]
            outcomes[outcome.task.seed] = outcome
            if len(outcomes) == len(cell.task.seeds):
                record(self.packed_row(cell, prepared, outcomes))

        if tasks:
            lane.run(tasks, done)


class Executor(Protocol):
    """Where a run's cells execute (docs/design.md, Results: `local` and `ray`)."""

    name: str

    def run(
        self, runner: Runner, cells: Sequence[Cell], record: Callable[[dict[str, Any]], None]
    ) -> None:
        """Measure `cells`, calling `record` in this process with each row once it is
        complete; KeyboardInterrupt stops what is still running and propagates."""


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
        """Held from start() to the end of run(): no other process measures this run."""

    def close(self) -> None:
        """Release the run directory's lock (run() does at its end)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def warn_baseline_not_run(self) -> None:
        """Say so when the spec's baseline is not among the variant points run (--variants
        left it out): the summary then has no speed-ups, and silence would hide why."""
        try:
            named = tomllib.loads(self.spec.text).get("baseline")
        except (tomllib.TOMLDecodeError, TypeError, AttributeError):
            return
        labels = {variant.label for variant in self.spec.variants}
        if isinstance(named, str) and named not in labels:
            self.console.print(
                f"[yellow]warning[/yellow]: the spec's baseline {named!r} is not among the "
                f"variants run ({', '.join(sorted(labels))}), so there are no speed-ups; add "
                f"it to --variants to have them",
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
        self.gemm_flops = env["gemm_flops_per_s"]
        self.measurer = Measurer(self.spec, self.registry, self.threads, self.gemm_flops)

    def record_gemm(self, env: dict[str, Any], when: str) -> None:
        """Measure the GEMM ceiling now and write it to env.json beside the earlier ones
        (`gemm_measurements`), keeping the fastest as `gemm_flops_per_s` and naming it in
        `gemm_best_of`: a matmul only ever gets slower when the machine is shared, so the
        fastest is the nearest to the machine's ceiling."""
        flops = gemm_flops_per_second(self.spec.device, self.spec.torch_dtype, threads=self.threads)
        measured = list(env.get("gemm_measurements") or [])
        if not measured and env.get("gemm_flops_per_s"):  # a run from before this list
            measured.append({"at": "start", "flops_per_s": env["gemm_flops_per_s"]})
        measured.append({"at": when, "flops_per_s": flops, "load_average": load_average()})
        best = max(measured, key=lambda entry: entry["flops_per_s"])
        env.update(
            gemm_measurements=measured,
            gemm_flops_per_s=best["flops_per_s"],
            gemm_best_of=best["at"],
        )
        self.store.write_json(ENV, env)

    def pending(self) -> list[Cell]:
        done = {row["cell"] for row in self.store.rows()}
        return [cell for cell in plan(self.spec) if cell.id not in done]

    def run(self, executor: Executor | None = None) -> tuple[int, bool]:
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

        def record(row: dict[str, Any]) -> None:
            nonlocal finished
            for each in with_stage_rows(row, by_id[row["cell"]]):
                self.store.append(each)
            finished += 1
            progress.advance(bar)

        with Progress(*columns, console=self.console, transient=False) as progress:
            self.measurer.progress = progress
            self.progress = progress
            bar = progress.add_task("cells", total=len(cells))
            try:
                executor.run(self, cells, record)
                long = time.monotonic() - started >= GEMM_AGAIN_AFTER_S
                if timed and long and executor.name == "local" and self.store.path(ENV).exists():
                    # Again at the end: the start's may have met a busy moment. (A remote
                    # executor's rows are against their own nodes' ceilings.)
                    self.describe("measuring the GEMM ceiling again")
                    self.record_gemm(self.store.read_json(ENV), "end")
            except KeyboardInterrupt:
                return finished, False
            finally:
                self.measurer.progress = None
                self.close()
        return finished, True

    def describe(self, text: str) -> None:
        """Say on the progress bar what is running now."""
        if self.progress is not None:
            self.progress.update(self.progress.task_ids[0], description=text)


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

    def run(
        self, runner: Runner, cells: Sequence[Cell], record: Callable[[dict[str, Any]], None]
    ) -> None:
        measurer = runner.measurer
        trained = [cell for cell in cells if cell.task is not None]
        workers = self.workers(runner.spec, sum(len(cell.task.seeds) for cell in trained))
        if runner.spec.device == "cpu":
            native.prepare()  # a first build of the native kernels is no cell's time
        with using_threads(runner.threads):
            try:
                for cell in cells:
                    if cell.task is None or workers == 1:
                        runner.describe(cell.id)
                        record(measurer.measure(cell))
                if workers > 1 and trained:
                    runner.describe(f"training seeds on {workers} workers")
                    pool = SeedPool(runner.registry, workers)
                    try:
                        measurer.train_packed(trained, pool, record)
                    finally:
                        pool.close()
            finally:
                gc.unfreeze()  # what the cells froze may be collected again from now on


def executor_for(spec: Spec) -> Executor:
    """The executor a spec names; PlaygroundError saying how to install Ray when it names
    ray and Ray is missing."""
    if spec.executor == "ray":
        from playground.run.executors.ray import RayExecutor

        return RayExecutor(spec.address)
    return LocalExecutor()
