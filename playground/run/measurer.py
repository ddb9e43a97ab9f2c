"""Measuring one cell where it runs: the Workload a cost cell times and profiles, and the
Measurer that turns a cell into its row (timings, peak memory, fidelity, or an accuracy
cell's seeds).

A cell that raises is recorded (`unsupported` for UnsupportedFeature, `oom` for an
out-of-memory error, `error` otherwise, with the message) and the sweep goes on. A call
whose result the contract forbids (not an AttentionOutput, an output not of shape
(B, N, d_model), not of the run's dtype, or not finite) is recorded as `invalid` with the
reason and without timings: only `ok` rows are measurements.

How sure a timing is travels with it: every timed row holds its timed runs, its IQR (None
without a spread), the 1-minute load average and core count when it started, and `flags`
(measure.cost_flags: few runs, large spread, efficiency above 1, a non-finite flops(), a
busy machine).
"""

from __future__ import annotations

import gc
import math
import platform
import time
from collections.abc import Callable, Sequence

import torch
from rich.progress import Progress

from playground.contract import AttentionOutput, AttentionVariant
from playground.errors import InvalidOutput, PlaygroundError, failure_fields, first_seed_failure
from playground.registry import Registry
from playground.run.accuracy import WeightsSink, kept_weights, measure_accuracy, row_fields
from playground.run.cells import Cell
from playground.run.decode_cost import measure_decode, memory_bandwidth
from playground.run.fidelity import measure_fidelity
from playground.run.instruments import (
    FLAG_FLOPS_NOT_FINITE,
    cost_flags,
    cpu_count,
    gemm_fields,
    load_average,
    peak_memory_bytes,
    time_call,
)
from playground.run.jobs import AccuracyJob, Prepared, prepare
from playground.run.row_schema import CostFields, DecodeFields, Row
from playground.run.seeds import SeedLane, SeedOutcome, SeedTask
from playground.run.spec import DECODE, Spec
from playground.softmax_attention import SoftmaxAttention

BACKWARD_FLOPS_FACTOR = 3
"""forward + backward ≈ 3 × forward FLOPs (the backward computes two products per
forward product: gradients of the inputs and of the weights)."""


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
        bandwidth: float | None = None,
    ) -> None:
        self.spec = spec
        self.registry = registry
        self.threads = threads
        self.gemm_flops = gemm_flops
        self.progress = progress
        """Where accuracy cells add their training bars (the runner's own)."""
        self.node = node or platform.node()
        self.bandwidth = bandwidth
        """Memory bandwidth (bytes/s) that decode cells are compared with: the runner's
        (env.json), else measured here by the first decode cell, on this node's threads."""
        self.keep_weights: Callable[[str, int, dict[str, torch.Tensor]], str] | None = None
        """(cell id, seed, state dict) -> where it was kept: the run's store, set by the
        runner when the spec keeps weights (None: weights are not kept)."""

    def weights_sink(self, cell: Cell) -> WeightsSink | None:
        """Where `cell`'s seeds' weights go (None: nowhere)."""
        keep = self.keep_weights
        if keep is None:
            return None
        return lambda seed, state: keep(cell.id, seed, state)

    def row(self, cell: Cell) -> Row:
        """The fields every row of `cell` starts with: what it is and where it runs."""
        spec = self.spec
        row: Row = {
            "cell": cell.id,
            "variant": cell.variant.name,
            "label": cell.variant.label,
            "options": cell.variant.options,
            "device": spec.device,
            "node": self.node,
            "threads": self.threads,
            # The ceiling efficiency is against, and the two libraries' rates it is the faster of.
            **gemm_fields(self.gemm_flops),
            "dtype": spec.dtype,
            "status": "ok",
            "error": None,
        }
        if cell.task is None:
            assert cell.seq_len is not None and cell.pass_name is not None, "a cost cell"
            return {
                **row,
                "seq_len": cell.seq_len,
                "batch_size": spec.batch_size,
                "d_model": spec.d_model,
                "num_heads": spec.num_heads,
                "pass": cell.pass_name,
            }
        row = {
            **row,
            "task": cell.task.name,
            "task_label": cell.task.label,
            "task_options": cell.task.options,
            "d_model": cell.task.d_model,
            "num_heads": cell.task.num_heads,
            "num_layers": cell.task.num_layers,
            "metric": getattr(self.registry.get_task(cell.task.name), "metric", "accuracy"),
            "setup_label": " ".join(
                part for part in (cell.variant.label, cell.task.settings_label) if part
            ),
        }
        if cell.task.grid:  # a failed cell's row says where in the sweep it was too
            row = {**row, "grid": dict(cell.task.grid), "sweep": cell.task.sweep}
        return row

    def measure(self, cell: Cell) -> Row:
        """Measure `cell` here, on the run's threads; a raise is recorded, not propagated
        (Ctrl-C excepted)."""
        row = self.row(cell)
        row["started_at"] = time.time()
        started = time.perf_counter()
        try:
            if cell.task is None:
                row = {**row, **self._measure(cell)}
            else:
                measured = measure_accuracy(
                    self.registry,
                    self.job(cell),
                    seeds=cell.task.seeds,
                    progress=self.progress,
                    keep=self.weights_sink(cell),
                )
                row = {**row, **measured}
        except KeyboardInterrupt:
            raise
        except BaseException as error:  # one cell's failure must not end the sweep
            row = {**row, **failure_fields(error)}
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
            weight_decay=task.weight_decay,
            grid=task.grid,
            batch_size=task.batch_size,
            curriculum=task.curriculum,
            device=self.spec.device,
            dtype=self.spec.torch_dtype,
            positional_encoding=task.positional_encoding,
            architecture=task.architecture,
            eval_lengths=task.eval_lengths,
            keep_weights=self.spec.save_weights,
        )

    def packed_row(self, cell: Cell, prepared: Prepared, outcomes: dict[int, SeedOutcome]) -> Row:
        """One accuracy cell's row from its seeds' outcomes, in the spec's seed order."""
        assert cell.task is not None, "a packed row is an accuracy cell's"
        seeds = cell.task.seeds
        ordered = [outcomes[seed] for seed in seeds]
        started_at = min(outcome.started_at for outcome in ordered)
        finished_at = max(outcome.finished_at for outcome in ordered)
        row: Row = {
            **self.row(cell),
            "node": ",".join(sorted({outcome.node for outcome in ordered})),
            "threads": max(outcome.threads for outcome in ordered),
            "started_at": started_at,
            "finished_at": finished_at,
            "wall_s": finished_at - started_at,
        }
        failure = first_seed_failure((outcome.task.seed, outcome.failure) for outcome in ordered)
        if failure is not None:
            return {**row, **failure}
        # no seed failed, so each has its result
        results = [outcome.result for outcome in ordered if outcome.result is not None]
        scored = row_fields(prepared, seeds, results)
        return {**row, **scored, **kept_weights(seeds, results, self.weights_sink(cell))}

    def _measure(self, cell: Cell) -> CostFields | DecodeFields:
        assert cell.seq_len is not None and cell.pass_name is not None, "a cost cell"
        spec = self.spec
        torch.manual_seed(spec.seed)
        module = self.registry.build(
            cell.variant.name, spec.d_model, spec.num_heads, **cell.variant.options
        ).to(spec.device, spec.torch_dtype)
        if cell.pass_name == DECODE:
            if self.bandwidth is None:  # once per process, on the run's threads
                measured = memory_bandwidth(spec.device, spec.torch_dtype, self.threads)
                self.bandwidth = measured.bytes_per_s
            return measure_decode(
                module,
                cell.seq_len,
                spec.batch_size,
                spec.torch_dtype,
                spec.device,
                self.threads,
                self.bandwidth,
                spec.seed,
            )
        generator = torch.Generator().manual_seed(spec.seed)
        tokens = torch.randn(spec.batch_size, cell.seq_len, spec.d_model, generator=generator).to(
            spec.device, spec.torch_dtype
        )
        run_pass = Workload(module, tokens, cell.pass_name)
        fields: CostFields = {}
        if isinstance(module, SoftmaxAttention):  # which path its score_mod takes, and why
            fields["score_mod_path"] = str(module.score_mod_structure())
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
            fields = {
                **fields,
                "time_ms": timing.median_s * 1e3,
                "time_iqr_ms": None if timing.iqr_s is None else timing.iqr_s * 1e3,
                "timed_runs": timing.runs,
                "gflops_per_s": flops / timing.median_s / 1e9 if finite else None,
                "efficiency": efficiency,
                "load_average": load,
                "cores": cores,
                "flags": cost_flags(
                    time_s=timing.median_s,
                    iqr_s=timing.iqr_s,
                    runs=timing.runs,
                    efficiency=efficiency,
                    flops=flops,
                    load=load,
                    cores=cores,
                ),
            }
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
        if isinstance(module, SoftmaxAttention) and module.cpu_path_taken is not None:
            fields["cpu_kernel"] = str(module.cpu_path_taken)  # the CPU path its calls took
        whole_passes = [name for name in spec.passes if name != DECODE]
        if "fidelity" in spec.measures and cell.pass_name == whole_passes[0]:
            try:
                fidelity = measure_fidelity(
                    module,
                    cell.seq_len,
                    spec.batch_size,
                    spec.seed,
                    spec.device,
                    spec.torch_dtype,
                    is_causal=False,  # the timed call's own: cost cells are not causal
                )
                fields = {**fields, **fidelity}
            except (ValueError, PlaygroundError) as error:
                fields["fidelity_note"] = str(error)
        return fields

    def train_packed(
        self, cells: Sequence[Cell], lane: SeedLane, record: Callable[[Row], None]
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
                failure = failure_fields(error)
                record({**row, **failure, "started_at": now, "finished_at": now, "wall_s": 0.0})
                continue
            assert cell.task is not None, "job(cell) refuses a cost cell"
            waiting[cell.id] = (cell, prepared, {})
            tasks += [SeedTask(cell.id, job, seed) for seed in cell.task.seeds]

        def done(outcome: SeedOutcome) -> None:
            cell, prepared, outcomes = waiting[outcome.task.cell]
            outcomes[outcome.task.seed] = outcome
            assert cell.task is not None, "waiting holds accuracy cells"
            if len(outcomes) == len(cell.task.seeds):
                record(self.packed_row(cell, prepared, outcomes))

        if tasks:
            lane.train(tasks, done)
