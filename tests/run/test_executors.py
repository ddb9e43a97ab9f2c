"""The packed lane: accuracy seeds trained on one-thread worker processes give the rows
the runner's own process gives, a plugin from a plugins directory trains there, a worker
that dies is retried once and then recorded, and Ctrl-C stops the workers."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from playground.errors import PlaygroundError
from playground.registry import Registry
from playground.run.executors.seed_pool import SeedPool
from playground.run.jobs import AccuracyJob
from playground.run.runner import Runner
from playground.run.seeds import SeedTask
from playground.run.spec_loading import load_spec
from playground.run.store import RunStore

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
    count, completed = runner.measure_pending()
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
        pool.train(tasks, interrupt)
    assert seen == [0] and pool._pool is None
    assert [worker.exitcode for worker in workers] == [-signal.SIGKILL] * 2  # not waited for


def test_asking_for_ray_without_it_says_how_to_install_it(monkeypatch):
    from playground.run.executors.ray import RayExecutor

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    with pytest.raises(PlaygroundError, match=r"pip install 'attention-playground\[ray\]'"):
        RayExecutor()


# A plugin that imports on the driver but not on the packed lane's workers (it needs
# something only the driver's environment has).
DRIVER_ONLY_PLUGIN = """
    import multiprocessing
    import playground

    if multiprocessing.parent_process() is not None:
        raise ImportError("no module named 'driver_only_dependency'")

    class DriverOnly(playground.SoftmaxAttention):
        name, summary, paper = "driver_only", "loads on the driver only", "-"

    @playground.hookimpl
    def register_attention(register):
        register(DriverOnly)
"""


def test_a_plugin_that_fails_on_the_workers_is_an_error_row_naming_why(tmp_path, write_plugin):
    """Loaded on the driver, not on the workers: an `error` row naming what failed to load
    there, the other cells trained, and nothing hangs."""
    plugin = write_plugin("driver_only.py", DRIVER_ONLY_PLUGIN)
    registry = Registry.discover([plugin.parent], entry_points=False)
    assert "driver_only" in registry.names()
    rows = _run(tmp_path, registry, 2, "driver_only", "vanilla", steps=2, seeds=1)
    assert rows["vanilla"]["status"] == "ok", rows["vanilla"]["error"]
    row = rows["driver_only"]
    assert row["status"] == "error"
    assert "driver_only_dependency" in row["error"] and "driver_only.py" in row["error"]
    assert "worker" in row["error"], row["error"]


# A variant whose seeds, on a worker, announce themselves (a file named by the worker's
# pid) and then wait while the gate file exists: the test decides when they may finish.
GATED_PLUGIN = """
    import multiprocessing, os, time
    from pathlib import Path
    import playground

    HERE = Path({here!r})

    class Gated(playground.SoftmaxAttention):
        name, summary, paper = "gated_seed", "waits for the test's gate", "-"

        def forward(self, *arguments, **keywords):
            if multiprocessing.parent_process() is not None:
                (HERE / f"started-{{os.getpid()}}").touch()
                while (HERE / "gate").exists():
                    time.sleep(0.05)
            return super().forward(*arguments, **keywords)

    @playground.hookimpl
    def register_attention(register):
        register(Gated)
"""


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, which only waits for a reaper, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_driver_stopped_while_seeds_train_leaves_no_worker_and_resumes(tmp_path, stop):
    """A batch system's SIGTERM while seeds train: the driver ends as on Ctrl-C. Killed
    outright, it cannot clean up, and its workers see it gone. Either way its stdout
    closes (a pipe reader returns), no worker outlives it, the finished cell's row is
    kept, and --resume runs the rest, every cell once."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "gated.py").write_text(textwrap.dedent(GATED_PLUGIN).format(here=str(tmp_path)))
    (tmp_path / "gate").touch()
    spec = tmp_path / "spec.toml"
    text = textwrap.dedent(SPEC).format(workers=2, steps=2, variants="")
    text = text.replace("seeds = 2", "seeds = 1")  # one seed each: both train at once
    spec.write_text(text + variants_table("vanilla", "gated_seed"))
    command = [sys.executable, "-m", "playground", "--plugins-dir", str(plugins), "run"]
    driver = subprocess.Popen(
        [*command, str(spec), "--out", str(tmp_path / "out")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    run_dirs = tmp_path / "out" / "packed"
    try:

        def vanilla_kept_and_gated_started() -> bool:
            if driver.poll() is not None:
                return True
            rows = [p / "results.jsonl" for p in run_dirs.glob("*")]
            recorded = any(p.exists() and p.read_text().strip() for p in rows)
            return recorded and any(tmp_path.glob("started-*"))

        _wait_for(vanilla_kept_and_gated_started, 120, "a row, and the gated seed to start")
        assert driver.poll() is None, driver.communicate()[0].decode()[-3000:]
        workers = _children(driver.pid)
        assert len(workers) >= 2  # the pool's two workers (and its resource tracker)
        driver.send_signal(stop)
        output = driver.communicate(timeout=60)[0].decode()  # returns: stdout was let go
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == (130 if stop == signal.SIGTERM else -stop), output[-3000:]
    _wait_for(lambda: not any(_alive(pid) for pid in workers), 10, "the workers to end")
    (run_dir,) = run_dirs.iterdir()
    kept = RunStore.existing(run_dir).rows()
    assert [(row["variant"], row["status"]) for row in kept] == [("vanilla", "ok")], output
    (tmp_path / "gate").unlink()
    resumed = subprocess.run(
        [*command, "--resume", str(run_dir)], capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    rows = RunStore.existing(run_dir).rows()
    assert sorted((row["variant"], row["status"]) for row in rows) == [
        ("gated_seed", "ok"),
        ("vanilla", "ok"),
    ]


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("", "the Ray address is empty"),
        ("   ", "the Ray address is empty"),
        ("no-port-here", "'no-port-here' is not host:port"),
        ("127.0.0.1:1", "no Ray cluster answers at 127.0.0.1:1"),
        ("ray://127.0.0.1:1", "no Ray cluster answers at ray://127.0.0.1:1"),
    ],
)
def test_a_ray_address_where_no_cluster_can_answer_is_refused_at_once(address, problem):
    """Refused when the executor is made (before the run directory), naming the address
    and what to do, instead of Ray's minutes of retries or its raw traceback."""
    pytest.importorskip("ray")
    from playground.run.executors.ray import RayExecutor

    with pytest.raises(PlaygroundError, match=problem) as refused:
        RayExecutor(address)
    assert "ray start --head" in str(refused.value)


def test_the_native_kernels_are_built_before_the_first_cell_is_measured(tmp_path, monkeypatch):
    """A first build of the native kernels takes seconds: it must not land in a timed cell."""
    from playground.run import measurer as measurer_module
    from playground.run.executors import local

    events: list[str] = []
    build = local.native.build_state

    def built():
        events.append("build")
        return build()

    monkeypatch.setattr(local.native, "build_state", built)
    measure = measurer_module.Measurer.measure

    def measured(self, cell):
        events.append("measure")
        return measure(self, cell)

    monkeypatch.setattr(measurer_module.Measurer, "measure", measured)
    path = tmp_path / "spec.toml"
    path.write_text(
        'name = "built"\nseq_lens = [16]\nd_model = 16\nnum_heads = 2\npasses = ["forward"]\n'
        'measures = ["memory"]\n[[variants]]\nname = "vanilla"\n'
    )
    registry = Registry.discover(entry_points=False)
    spec = load_spec(str(path), registry)
    runner = Runner(spec, registry, RunStore.create(tmp_path / "results", spec.name))
    runner.start()  # env.json asks the build state too; a resume would not
    events.clear()
    runner.measure_pending()
    assert events[:2] == ["build", "measure"]
