"""The ray executor against a real Ray: a local instance, and two nodes on this machine
(`ray.cluster_utils.Cluster`). It yields the cells and statuses the local executor does,
never overlaps two cost cells on one node, retries a cell whose worker died once and
then records it, runs a plugin from a plugins directory on the workers, and resumes after
Ctrl-C with every cell exactly once, across executors."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from playground.registry import Registry
from playground.report.tables import node_facts
from playground.run.cells import plan
from playground.run.executors.local import LocalExecutor
from playground.run.runner import Runner
from playground.run.spec_loading import load_spec
from playground.run.store import RunStore
from tests.run.test_executors import DYING_PLUGIN, variants_table

ray = pytest.importorskip("ray")
# One worker runs them all, one after another, so they share one local Ray instance (and
# its warm worker processes) instead of each starting its own.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]

from playground.run.executors.ray import RayExecutor  # noqa: E402

SPEC = """
    name = "onray"
    seq_lens = [16, 32]
    d_model = 16
    num_heads = 2
    passes = ["forward", "forward_backward"]
    measures = ["speed", "memory", "fidelity", "accuracy"]
    threads = 1

    [timing]
    min_run_time = 0.02

    [[tasks]]
    name = "lookback"
    seq_len = 12
    offset = 2
    steps = 3
    seeds = 2
    d_model = 16
    num_heads = 2
    num_layers = 1
    learning_rate = [3e-3, 3e-2]  # grid cells run as any other cell (issue 43 part 1)

    [[variants]]
    name = "vanilla"

    [[variants]]
    name = "{second}"

    [options.linformer]
    seq_len = 8  # shorter than every length: its cells are unsupported
    k = 4
"""
SMALL_STORE = 80 * 1024**2
"""Object store per test instance: the tests move kilobytes."""


@pytest.fixture
def local_ray():
    """This process's local Ray instance, started by the first test that asks for it and
    left running for the next (Ray shuts it down at exit)."""
    if not ray.is_initialized():
        ray.init(num_cpus=2, object_store_memory=SMALL_STORE, include_dashboard=False)


def _run(tmp_path: Path, registry: Registry, executor, *variants: str):
    """The spec's rows on `executor`; with `variants`, those variants at one length, one
    pass and one seed (a worker that dies costs a new worker's start)."""
    text = textwrap.dedent(SPEC.format(second="linformer"))
    if variants:
        text = text[: text.index("[[variants]]")] + variants_table(*variants)
        text = (
            text.replace("seq_lens = [16, 32]", "seq_lens = [16]")
            .replace('"forward", "forward_backward"', '"forward"')
            .replace("seeds = 2", "seeds = 1")
        )
    path = tmp_path / f"{executor.name}.toml"
    path.write_text(text)
    spec = load_spec(path, registry)
    store = RunStore.create(tmp_path / executor.name, spec.name)
    runner = Runner(spec, registry, store)
    runner.start()
    _count, completed = runner.measure_pending(executor)
    assert completed
    return store.rows()


def _on_ray(source: str) -> str:
    """The dying plugins, dying in a Ray worker rather than in a SeedPool worker."""
    return source.replace(
        "multiprocessing.parent_process() is not None",
        "ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE",
    ).replace("import multiprocessing, os, signal", "import os, signal\n    import ray")


def test_ray_runs_the_cells_the_local_executor_runs(tmp_path, local_ray):
    registry = Registry.discover(entry_points=False)
    here = _run(tmp_path, registry, LocalExecutor(accuracy_workers=1))
    there = _run(tmp_path, registry, RayExecutor())
    assert sorted((r["cell"], r["status"]) for r in there) == sorted(
        (r["cell"], r["status"]) for r in here
    )
    assert {r["status"] for r in there} == {"ok", "unsupported"}  # linformer's length
    node = ray.get_runtime_context().get_node_id()
    for row in there:
        assert row["node"] and row["threads"] >= 1
        if "pass" in row and row["status"] == "ok":
            assert row["node_id"] == node and row["threads"] == 1  # the spec's threads
            assert row["gemm_flops_per_s"] > 0 and row["efficiency"] > 0


def test_a_plugin_from_a_plugins_dir_runs_on_the_workers_and_a_death_is_retried_once(
    tmp_path, write_plugin, local_ray
):
    plugin = write_plugin("dying.py", _on_ray(DYING_PLUGIN.format(markers=str(tmp_path))))
    registry = Registry.discover([plugin.parent], entry_points=False)
    rows = _run(tmp_path, registry, RayExecutor(), "dying_once", "dying_always")
    assert (tmp_path / "dying_once.died").exists()  # a worker was killed under a cell...
    once = [row for row in rows if row["variant"] == "dying_once"]
    assert once and all(row["status"] == "ok" for row in once), once  # ...and retried
    always = [row for row in rows if row["variant"] == "dying_always"]
    assert always and all(row["status"] == "error" for row in always)
    assert all("failed after a retry" in row["error"] for row in always), always[0]["error"]


def test_two_nodes_never_overlap_two_timing_cells_on_one_node(tmp_path):
    from ray.cluster_utils import Cluster

    ray.shutdown()  # the shared local instance, if a test before this one started it
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "object_store_memory": SMALL_STORE},
    )
    cluster.add_node(num_cpus=1, object_store_memory=SMALL_STORE)
    try:
        ray.init(address=cluster.address)
        registry = Registry.discover(entry_points=False)
        rows = _run(tmp_path, registry, RayExecutor())
    finally:
        ray.shutdown()
        cluster.shutdown()
    timing = [row for row in rows if "pass" in row and row["status"] == "ok"]
    by_node: dict[str, list[tuple[float, float]]] = {}
    for row in timing:
        by_node.setdefault(row["node_id"], []).append((row["started_at"], row["finished_at"]))
        assert row["gemm_flops_per_s"] > 0
    assert len(by_node) == 2  # both nodes measured
    for spans in by_node.values():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end, spans
    nodes = node_facts(rows)  # what the run prints: one line per node, its own GEMM
    assert sorted(node["node_id"] for node in nodes) == sorted(by_node)
    assert all(node["gemm_flops_per_s"] > 0 and node["cells"] >= 1 for node in nodes)


def test_ctrl_c_keeps_finished_rows_and_a_resume_elsewhere_runs_each_cell_once(tmp_path):
    spec = tmp_path / "interrupted.toml"
    spec.write_text(
        textwrap.dedent(SPEC.format(second="vanilla")).split("[[variants]]")[0]
        + variants_table("vanilla")
    )
    spec.write_text(
        spec.read_text()
        # Enough cells that the run is still measuring when its first row lands (with
        # fewer, Ray's workers could finish them all before the interrupt arrived).
        .replace("seq_lens = [16, 32]", f"seq_lens = {list(range(16, 336, 16))}")
        .replace('"fidelity", "accuracy"]', '"fidelity"]')  # costs only: a quick resume
    )
    environment = dict(os.environ)
    command = [sys.executable, "-m", "playground", "run", str(spec), "--out", str(tmp_path)]
    driver = subprocess.Popen(
        [*command, "--executor", "ray"],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        # A shell's background job inherits SIGINT ignored, and Python then never turns it
        # into KeyboardInterrupt: give the run the default, as a terminal's Ctrl-C finds it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    rows_file = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and driver.poll() is None:
        found = list(tmp_path.glob("onray/*/results.jsonl"))
        if found and found[0].read_text().count("\n") >= 1:
            rows_file = found[0]
            break
        time.sleep(0.2)
    assert rows_file is not None, driver.communicate()[0].decode()[-2000:]
    driver.send_signal(signal.SIGINT)
    output = driver.communicate(timeout=120)[0].decode()
    assert driver.returncode == 130, output[-2000:]
    kept = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert kept and "playground run --resume" in output
    resumed = subprocess.run(
        [sys.executable, "-m", "playground", "run", "--resume", str(rows_file.parent),
         "--executor", "local"],
        env=environment, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    cells = [json.loads(line)["cell"] for line in rows_file.read_text().splitlines()]
    registry = Registry.discover(entry_points=False)
    planned = {cell.id for cell in plan(load_spec(spec, registry))}
    assert sorted(cells) == sorted(planned) and len(cells) == len(set(cells))
    assert len(kept) < len(planned)  # the interrupt did leave work for the resume
