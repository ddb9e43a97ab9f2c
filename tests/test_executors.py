"""The packed lane: accuracy seeds trained on one-thread worker processes give the rows
the runner's own process gives, a plugin from a plugins directory trains there, a worker
that dies is retried once and then recorded, and Ctrl-C stops the workers."""

from __future__ import annotations

import signal
import sys
import textwrap
from pathlib import Path

import pytest

from playground.accuracy import AccuracyJob
from playground.errors import PlaygroundError
from playground.executors import SeedPool, SeedTask
from playground.registry import Registry
from playground.results import RunStore
from playground.runner import Runner
from playground.spec import load_spec

SPEC = """
    name = "packed"
    measures = ["accuracy"]
    threads = 1
    accuracy_workers = {workers}

    [[tasks]]
    name = "lookback"
    seq_len = 12
    offset = 2
    steps = {steps}
    seeds = 2
    d_model = 16
    num_heads = 2
    num_layers = 1

{variants}"""

# Variants that kill the worker process training them: `dying_once` only the first time
# (it leaves a marker file, so the retry is seen to happen), `dying_always` every time.
DYING_PLUGIN = """
    import multiprocessing, os, signal
    from pathlib import Path
    import playground

    MARKERS = Path({markers!r})

    def in_a_worker():
        return multiprocessing.parent_process() is not None

    class DyingOnce(playground.SoftmaxAttention):
        name, summary, paper = "dying_once", "kills its worker the first time", "-"
        once = True

        def forward(self, *arguments, **keywords):
            marker = MARKERS / f"{{self.name}}.died"
            if in_a_worker() and not (self.once and marker.exists()):
                marker.touch()
                os.kill(os.getpid(), signal.SIGKILL)
            return super().forward(*arguments, **keywords)

    class DyingAlways(DyingOnce):
        name, summary = "dying_always", "kills its worker every time"
        once = False

    @playground.hookimpl
    def register_attention(register):
        register(DyingOnce)
        register(DyingAlways)
"""


def variants_table(*names: str) -> str:
    return "".join(f'[[variants]]\nname = "{name}"\n' for name in names)


def _run(
    tmp_path: Path, registry: Registry, workers: int, *variants: str, steps: int = 3, seeds=2
) -> dict[str, dict]:
    text = textwrap.dedent(SPEC).format(workers=workers, steps=steps, variants="")
    text = text.replace("seeds = 2", f"seeds = {seeds}") + variants_table(*variants)
    path = tmp_path / f"spec-{workers}.toml"
    path.write_text(text)
    spec = load_spec(path, registry)
    store = RunStore.create(tmp_path / f"results-{workers}", spec.name)
    runner = Runner(spec, registry, store)
    runner.start()
    count, completed = runner.run()
    assert completed and count == len(variants)
    return {row["variant"]: row for row in store.rows()}


def test_packed_seeds_give_the_rows_the_runner_gives(tmp_path):
    """Same seeds on one thread each: the same accuracies and losses, to the bit."""
    registry = Registry.discover(entry_points=False)
    here = _run(tmp_path, registry, 1, "vanilla")["vanilla"]
    packed = _run(tmp_path, registry, 2, "vanilla")["vanilla"]
    for row in (here, packed):
        assert row["status"] == "ok", row["error"]
        assert row["threads"] == 1 and row["node"] and row["finished_at"] > row["started_at"]
    for key in ("accuracy_per_seed", "final_train_loss", "seeds", "model", "chance"):
        assert packed[key] == here[key], key


def test_a_seed_whose_worker_dies_is_retried_once_then_recorded(tmp_path, write_plugin):
    """The variants come from a plugins directory, so this also shows that such a plugin
    trains on the workers."""
    plugin = write_plugin("dying.py", DYING_PLUGIN.format(markers=str(tmp_path)))
    registry = Registry.discover([plugin.parent], entry_points=False)
    rows = _run(tmp_path, registry, 2, "dying_once", "dying_always", steps=2, seeds=1)
    assert (tmp_path / "dying_once.died").exists()  # it did kill a worker...
    assert rows["dying_once"]["status"] == "ok", rows["dying_once"]["error"]  # ...retried
    always = rows["dying_always"]
    assert always["status"] == "error"
    assert "died (2 times" in always["error"] and "seed 0" in always["error"]


def test_ctrl_c_stops_the_workers_and_propagates(tmp_path):
    registry = Registry.discover(entry_points=False)
    job = AccuracyJob(
        "vanilla", {}, "lookback", {"seq_len": 12, "offset": 2}, steps=400, d_model=16,
        num_heads=2, num_layers=1,
    )  # fmt: skip
    pool = SeedPool(registry, 2)
    seen: list[int] = []
    workers = []

    def interrupt(outcome) -> None:
        seen.append(outcome.task.seed)
        workers.extend(pool._pool._processes.values())  # still training seeds 1 and 2
        raise KeyboardInterrupt

    tasks = [SeedTask("cell", job, seed) for seed in range(4)]
    tasks[0] = SeedTask("cell", AccuracyJob(**{**job.__dict__, "steps": 1}), 0)  # back first
    with pytest.raises(KeyboardInterrupt):
        pool.run(tasks, interrupt)
    assert seen == [0] and pool._pool is None
    assert [worker.exitcode for worker in workers] == [-signal.SIGKILL] * 2  # not waited for


def test_asking_for_ray_without_it_says_how_to_install_it(monkeypatch):
    from playground.ray_executor import RayExecutor

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(PlaygroundError, match=r"pip install 'attention-playground\[ray\]'"):
        RayExecutor()
