"""The `ray` executor: a run's cells on a Ray cluster (Moritz et al. 2018, "Ray: A
Distributed Framework for Emerging AI Applications").

Two lanes, because timing and training want different things:

- **Cost cells** (speed, memory, fidelity) run one at a time per node. Each task asks
  for every CPU of the node it is pinned to, so nothing else (another cost cell, a
  training seed) shares the node while it is measured. It runs on an explicit torch
  thread count (the spec's, else the node's CPUs; Ray would otherwise leave
  OMP_NUM_THREADS=1), and its efficiency is against *that node's* GEMM throughput,
  measured once per node by a task pinned the same way.
- **Accuracy seeds** are packed: one task per seed, one CPU and one thread each, wherever
  Ray finds a free CPU.

The driver is the only writer: it records each row as its task comes back, in the same
format as the local executor, so `--resume` works across executors. Plugins travel in
the registry's portable recipe (every plugin file's source), so a variant from
`--plugins-dir` runs on a worker that does not share the driver's filesystem; the
playground itself and any entry-point plugin must be installed on the workers. A worker
that dies under a task (killed, out of memory) has the task retried once by Ray
(`max_retries=1`), then the cell is recorded as `error` with the reason. Ctrl-C keeps
every finished row and stops the rest: a cluster the run started is shut down, on one it
joined the pending and running tasks are cancelled.
"""

from __future__ import annotations

import collections
import contextlib
import platform
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from playground.errors import FailureFields, PlaygroundError
from playground.kernels import native
from playground.registry import LoadStep, Registry
from playground.run.cells import Cell
from playground.run.context import Record, RunContext
from playground.run.instruments import gemm_flops_per_second, using_threads
from playground.run.measurer import Measurer
from playground.run.row_schema import Row
from playground.run.seeds import SeedOutcome, SeedTask, missing_variant, train_seed_task
from playground.run.spec import Spec

INSTALL_HINT = "pip install 'attention-playground[ray]' (or pip install ray)"
CONNECT_TIMEOUT_S = 5.0
"""How long the cluster at a given address has to accept a connection: Ray itself retries
an unreachable address for minutes, printing only its retries."""
ADDRESS_HINT = (
    'give the address `ray start --head` printed (such as 10.0.0.1:6379), "auto" for the '
    "cluster running on this machine, or no address to start a fresh local Ray"
)


def require_ray() -> Any:
    """The ray module, or a PlaygroundError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise PlaygroundError(
            f"the ray executor needs Ray, which is not installed: {INSTALL_HINT}"
        ) from None
    return ray


@dataclass(frozen=True)
class NodeFacts:
    """What a row says about the node that measured it."""

    node_id: str
    hostname: str
    cpus: int
    threads: int
    """The torch threads its cost cells run on."""
    gemm_flops: float | None
    """Its GEMM throughput at `threads` (None when the run measures no speed)."""


_registries: dict[int, Registry] = {}


def _worker_registry(recipe: Sequence[LoadStep]) -> Registry:
    """The registry of `recipe`, built once per worker process."""
    key = hash(tuple(recipe))
    if key not in _registries:
        _registries[key] = Registry.from_recipe(recipe)
    return _registries[key]


def _missing_variant(registry: Registry, name: str) -> str | None:
    """Why `name` is not registered on this worker, naming what failed to load there."""
    return missing_variant(registry, name, f"Ray node {platform.node()}")


def check_address(address: str | None) -> None:
    """Refuse an address no Ray cluster can be at, or at which none answers, before
    anything is made: PlaygroundError naming the address and what to do. None, "auto" and
    "local" are Ray's own choices, not probed."""
    if address is None:
        return
    text = address.strip()
    if not text:
        raise PlaygroundError(f"the Ray address is empty; {ADDRESS_HINT}")
    if text in ("auto", "local"):
        return
    host, _, port = text.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise PlaygroundError(f"the Ray address {address!r} is not host:port; {ADDRESS_HINT}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), CONNECT_TIMEOUT_S).close()
    except OSError as error:
        raise PlaygroundError(
            f"no Ray cluster answers at {address} ({error.strerror or error}); start one "
            f"there (ray start --head --port {port}) or check the address, or {ADDRESS_HINT}"
        ) from None


def _facts_on_node(node_id: str, cpus: int, threads: int, spec: Spec, speed: bool) -> NodeFacts:
    gemm = gemm_flops_per_second(spec.device, spec.torch_dtype, threads=threads) if speed else None
    return NodeFacts(node_id, platform.node(), cpus, threads, gemm)


def _measure_on_node(spec: Spec, recipe: Sequence[LoadStep], cell: Cell, facts: NodeFacts) -> Row:
    registry = _worker_registry(recipe)
    if spec.device == "cpu":
        native.build_state()  # a first build on this node is not part of the cell's timing
    measurer = Measurer(spec, registry, facts.threads, facts.gemm_flops, node=facts.hostname)
    missing = _missing_variant(registry, cell.variant.name)
    with using_threads(facts.threads):
        if missing:
            now = time.time()
            row: Row = {
                **measurer.row(cell),
                "status": "error",
                "error": missing,
                "started_at": now,
                "finished_at": now,
                "wall_s": 0.0,
            }
        else:
            row = measurer.measure(cell)
    row["node_id"] = facts.node_id
    return row


def _train_on_node(recipe: Sequence[LoadStep], task: SeedTask) -> SeedOutcome:
    torch.set_num_threads(1)
    registry = _worker_registry(recipe)
    missing = _missing_variant(registry, task.job.variant)
    if missing:
        now = time.time()
        failure: FailureFields = {"status": "error", "error": missing}
        return SeedOutcome(task, None, failure, platform.node(), 1, now, now)
    return train_seed_task(registry, task)


def _pinned(node_id: str) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)


def _cancel(ray: Any, refs: Sequence[Any], owns_cluster: bool) -> None:
    """Stop `refs`. A cluster this run started is shut down whole instead (by the caller):
    cancelling a task whose reply is in flight can abort the driver in Ray's task manager
    ("Tried to complete task that was not pending", seen with Ray 2.60)."""
    if owns_cluster:
        return
    for ref in refs:
        with contextlib.suppress(Exception):  # already finished, or its worker is gone
            ray.cancel(ref)


class RaySeedLane:
    """Seeds as Ray tasks, one CPU and one thread each."""

    def __init__(self, ray: Any, recipe: Sequence[LoadStep], owns_cluster: bool) -> None:
        self.ray = ray
        self.recipe = list(recipe)
        self.owns_cluster = owns_cluster
        self.remote = ray.remote(_train_on_node).options(num_cpus=1, max_retries=1)

    def train(self, tasks: Sequence[SeedTask], done: Callable[[SeedOutcome], None]) -> None:
        ray = self.ray
        recipe = ray.put(self.recipe)
        waiting = {self.remote.remote(recipe, task): task for task in tasks}
        try:
            while waiting:
                ready, _ = ray.wait(list(waiting), num_returns=1)
                for ref in ready:
                    task = waiting.pop(ref)
                    try:
                        done(ray.get(ref))
                    except ray.exceptions.RayError as error:  # the worker died, twice
                        now = time.time()
                        failure: FailureFields = {
                            "status": "error",
                            "error": _death(error, task.seed),
                        }
                        done(SeedOutcome(task, None, failure, "?", 1, now, now))
        except BaseException:
            _cancel(ray, list(waiting), self.owns_cluster)
            raise


def _death(error: BaseException, seed: int | None = None) -> str:
    what = "the cell" if seed is None else f"seed {seed}"
    first = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
    return (
        f"the Ray worker running {what} failed after a retry: {type(error).__name__}: "
        f"{first}; a kill or the out-of-memory killer does this"
    )


class RayExecutor:
    """A Ray cluster: `address` of a running one (as `ray start` prints it), or None for
    Ray's own choice: the cluster named by RAY_ADDRESS, else a fresh local one. A missing
    Ray, an empty address and one where no cluster answers are refused here, before the
    run directory is made."""

    name = "ray"

    def __init__(self, address: str | None = None) -> None:
        self.address = address
        require_ray()  # a missing install is refused before anything runs
        check_address(address)

    def execute(self, context: RunContext, cells: Sequence[Cell], record: Record) -> None:
        ray = require_ray()
        started_here = not ray.is_initialized()
        if started_here:
            context.describe("starting Ray" if self.address is None else f"joining {self.address}")
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
        try:
            recipe = context.registry.portable_recipe()
            costs = [cell for cell in cells if cell.task is None]
            trained = [cell for cell in cells if cell.task is not None]
            if costs:
                self._measure_costs(ray, context, recipe, costs, record, started_here)
            if trained:
                context.describe("training seeds on Ray")
                lane = RaySeedLane(ray, recipe, owns_cluster=started_here)
                context.measurer.train_packed(trained, lane, record)
        finally:
            if started_here:
                ray.shutdown()

    def nodes(self, ray: Any) -> list[tuple[str, int]]:
        """(node id, CPUs) of every live node that has a CPU."""
        found = [
            (node["NodeID"], int(node["Resources"].get("CPU", 0)))
            for node in ray.nodes()
            if node.get("Alive")
        ]
        usable = [(node_id, cpus) for node_id, cpus in found if cpus >= 1]
        if not usable:
            raise PlaygroundError("the Ray cluster has no live node with a CPU")
        return usable

    def _measure_costs(
        self,
        ray: Any,
        context: RunContext,
        recipe: Sequence[LoadStep],
        cells: Sequence[Cell],
        record: Record,
        owns_cluster: bool,
    ) -> None:
        """One cost cell at a time on each node, the node's every CPU reserved."""
        spec = context.spec
        speed = "speed" in spec.measures
        nodes = self.nodes(ray)
        facts_task = ray.remote(_facts_on_node)
        measure_task = ray.remote(_measure_on_node)
        context.describe(f"measuring the GEMM ceiling on {len(nodes)} Ray node(s)")
        pending = [
            facts_task.options(num_cpus=cpus, scheduling_strategy=_pinned(node_id)).remote(
                node_id, cpus, spec.threads or cpus, spec, speed
            )
            for node_id, cpus in nodes
        ]
        try:
            facts: list[NodeFacts] = ray.get(pending)
        except BaseException:
            _cancel(ray, pending, owns_cluster)
            raise
        recipe_ref = ray.put(list(recipe))
        queue = collections.deque(cells)
        free = list(facts)
        running: dict[Any, tuple[NodeFacts, Cell]] = {}
        try:
            while queue or running:
                while queue and free:
                    node, cell = free.pop(), queue.popleft()
                    options = {
                        "num_cpus": node.cpus,
                        "scheduling_strategy": _pinned(node.node_id),
                        "max_retries": 1,
                    }
                    ref = measure_task.options(**options).remote(spec, recipe_ref, cell, node)
                    running[ref] = (node, cell)
                context.describe(f"{len(running)} cost cell(s) on {len(facts)} node(s)")
                ready, _ = ray.wait(list(running), num_returns=1)
                for ref in ready:
                    node, cell = running.pop(ref)
                    free.append(node)
                    try:
                        row = ray.get(ref)
                    except ray.exceptions.RayError as error:
                        now = time.time()
                        row = {
                            **context.measurer.row(cell),
                            "status": "error",
                            "error": _death(error),
                            "node": node.hostname,
                            "node_id": node.node_id,
                            "threads": node.threads,
                            "gemm_flops_per_s": node.gemm_flops,
                            "started_at": now,
                            "finished_at": now,
                            "wall_s": 0.0,
                        }
                    record(row)
        except BaseException:
            _cancel(ray, list(running), owns_cluster)
            raise
