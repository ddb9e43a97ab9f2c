"""The experiment runner: every (variant point, seq_len, pass) cell of a spec, measured
and appended to the run's results.jsonl as it finishes.

A cell that raises is recorded (`unsupported` for UnsupportedFeature, `oom` for an
out-of-memory error, `error` otherwise, with the message) and the sweep goes on. Ctrl-C
stops after writing nothing partial: finished rows stay, and `--resume RUN_DIR` runs only
the cells that have no row yet.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from playground.accuracy import measure_accuracy
from playground.contract import AttentionVariant
from playground.errors import PlaygroundError, UnsupportedFeature
from playground.fidelity import measure_fidelity
from playground.measure import gemm_flops_per_second, peak_memory_bytes, time_call
from playground.registry import Registry
from playground.results import ENV, SPEC, RunStore, environment
from playground.spec import Spec, TaskRun, VariantRun

BACKWARD_FLOPS_FACTOR = 3
"""forward + backward ≈ 3 × forward FLOPs (the backward computes two products per
forward product: gradients of the inputs and of the weights)."""


COST_MEASURES = ("speed", "memory", "fidelity")


@dataclass(frozen=True)
class Cell:
    """One measurement: a variant point at one length and pass (cost), or trained on one
    task over its seeds (accuracy)."""

    variant: VariantRun
    seq_len: int | None = None
    pass_name: str | None = None
    task: TaskRun | None = None

    @property
    def id(self) -> str:
        if self.task is not None:
            return f"{self.variant.label}|task={self.task.label}"
        return f"{self.variant.label}|n={self.seq_len}|{self.pass_name}"


def plan(spec: Spec) -> list[Cell]:
    """The cells of a spec, variant by variant: costs short sequences first, then tasks."""
    cells = []
    for variant in spec.variants:
        if any(measure in spec.measures for measure in COST_MEASURES):
            cells += [
                Cell(variant, n, pass_name)
                for n in sorted(spec.seq_lens)
                for pass_name in spec.passes
            ]
        if "accuracy" in spec.measures:
            cells += [Cell(variant, task=task) for task in spec.tasks]
    return cells


def check_device(device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        raise PlaygroundError(
            "device 'cuda' was asked for but torch.cuda.is_available() is False (no GPU, or "
            "a CPU-only torch build); run with --device cpu"
        )


def _is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, torch.OutOfMemoryError):
        return True
    message = str(error).lower()
    return isinstance(error, (RuntimeError, MemoryError)) and (
        "out of memory" in message
        or "can't allocate memory" in message
        or isinstance(error, MemoryError)
    )


def workload(module: AttentionVariant, tokens: torch.Tensor, pass_name: str) -> Callable[[], None]:
    """The call that is timed and profiled for one pass. Each call leaves nothing behind
    (forward+backward frees its gradients at the end), so every call, the profiled one
    included, starts from the same memory state."""
    if pass_name == "forward":
        module.eval()

        def forward() -> None:
            with torch.no_grad():
                module(tokens)

        return forward
    module.train()
    # As for a layer inside a model, the input needs a gradient too: the backward then does
    # every product the ×3 FLOPs convention counts (weights and inputs).
    tokens = tokens.detach().requires_grad_(True)

    def forward_backward() -> None:
        module(tokens).output.sum().backward()
        module.zero_grad(set_to_none=True)  # gradients held across calls would skew memory
        tokens.grad = None

    return forward_backward


class Runner:
    def __init__(
        self, spec: Spec, registry: Registry, store: RunStore, console: Console | None = None
    ) -> None:
        self.spec = spec
        self.registry = registry
        self.store = store
        self.console = console or Console()
        self.gemm_flops: float | None = None
        self.progress: Progress | None = None

    def start(self, overrides: dict[str, Any] | None = None) -> None:
        """Record the environment and the spec, and measure the GEMM ceiling (once per
        run: a resume reuses the figure its rows were computed against)."""
        if (self.store.directory / ENV).is_file():
            self.gemm_flops = self.store.read_json(ENV)["gemm_flops_per_s"]
            return
        check_device(self.spec.device)
        # The spec first: a run interrupted while the GEMM is measured can still be resumed.
        (self.store.directory / SPEC).write_text(self.spec.text)
        self.console.print(f"measuring {self.spec.dtype} GEMM throughput on {self.spec.device}…")
        self.gemm_flops = gemm_flops_per_second(self.spec.device, self.spec.torch_dtype)
        env = environment(self.spec.device)
        env.update(
            gemm_flops_per_s=self.gemm_flops,
            dtype=self.spec.dtype,
            experiment=self.spec.name,
            spec_file=str(self.spec.path),
            overrides=overrides or {},
        )
        self.store.write_json(ENV, env)

    def pending(self) -> list[Cell]:
        done = {row["cell"] for row in self.store.rows()}
        return [cell for cell in plan(self.spec) if cell.id not in done]

    def run(self) -> tuple[int, bool]:
        """Measure every pending cell; returns (cells run, finished without interrupt)."""
        cells = self.pending()
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(elapsed_when_finished=True),
        )
        finished = 0
        with Progress(*columns, console=self.console, transient=False) as progress:
            self.progress = progress  # accuracy cells add their training bars to it
            task = progress.add_task("cells", total=len(cells))
            try:
                for cell in cells:
                    progress.update(task, description=cell.id)
                    self.store.append(self.measure(cell))
                    finished += 1
                    progress.advance(task)
            except KeyboardInterrupt:
                return finished, False
        return finished, True

    def measure(self, cell: Cell) -> dict[str, Any]:
        spec = self.spec
        row: dict[str, Any] = {
            "cell": cell.id,
            "variant": cell.variant.name,
            "label": cell.variant.label,
            "options": cell.variant.options,
            "device": spec.device,
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
        started = time.perf_counter()
        try:
            row.update(self._measure(cell) if cell.task is None else self._train(cell))
        except UnsupportedFeature as error:
            row.update(status="unsupported", error=str(error))
        except KeyboardInterrupt:
            raise
        except BaseException as error:  # one cell's failure must not end the sweep
            status = "oom" if _is_out_of_memory(error) else "error"
            row.update(status=status, error=f"{type(error).__name__}: {error}")
        finally:
            gc.collect()
            if spec.device == "cuda":
                torch.cuda.empty_cache()
        row["wall_s"] = time.perf_counter() - started
        return row

    def _train(self, cell: Cell) -> dict[str, Any]:
        task = cell.task
        assert task is not None
        return measure_accuracy(
            self.registry,
            cell.variant.name,
            cell.variant.options,
            task.name,
            task.options,
            seeds=task.seeds,
            steps=task.steps,
            d_model=task.d_model,
            num_heads=task.num_heads,
            num_layers=task.num_layers,
            device=self.spec.device,
            dtype=self.spec.torch_dtype,
            progress=self.progress,
        )

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
        run_pass = workload(module, tokens, cell.pass_name)
        fields: dict[str, Any] = {}
        flops = spec.batch_size * module.count_flops(cell.seq_len, cell.seq_len)
        if cell.pass_name == "forward_backward":
            flops *= BACKWARD_FLOPS_FACTOR
        fields["flops"] = flops
        if "speed" in spec.measures:
            timing = time_call(run_pass, spec.min_run_time)
            fields.update(
                time_ms=timing.median_s * 1e3,
                time_iqr_ms=timing.iqr_s * 1e3,
                timed_runs=timing.runs,
                gflops_per_s=flops / timing.median_s / 1e9,
                efficiency=flops / timing.median_s / self.gemm_flops,
            )
        if "memory" in spec.measures:
            fields["peak_memory_bytes"] = peak_memory_bytes(run_pass, spec.device)
        if "fidelity" in spec.measures and cell.pass_name == spec.passes[0]:
            try:
                fields.update(
                    measure_fidelity(
                        module,
                        self.registry,
                        cell.seq_len,
                        spec.batch_size,
                        spec.seed,
                        spec.device,
                        spec.torch_dtype,
                    )
                )
            except (ValueError, PlaygroundError) as error:
                fields["fidelity_note"] = str(error)
        return fields
