"""The accuracy tasks of the main job (experiments/quick.toml, `playground compare`) answer
the questions they are there for (issue 43 part 6): exact attention solves them, and
attention that weighs keys by distance alone, never by what they hold
(tests/broken_variants.AttendsByPositionOnly), solves lookback but not the recall task.
Each variant trains as compare trains it (the runner's own job for the spec's cell), on
one seed."""

from __future__ import annotations

import pytest
import torch

from playground.registry import Registry
from playground.run.accuracy import measure_accuracy
from playground.run.cells import Cell
from playground.run.measurer import Measurer
from playground.run.spec_loading import load_spec

POSITION_ONLY = "broken_attends_by_position_only"

POSITION_ONLY_PLUGIN = """
    import playground
    from tests.broken_variants import AttendsByPositionOnly

    @playground.hookimpl
    def register_attention(register):
        register(AttendsByPositionOnly)
"""


@pytest.fixture(autouse=True)
def _one_thread():
    """Compare trains each seed on a one-thread worker; tiny models train fastest so."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def registry(write_plugin, monkeypatch: pytest.MonkeyPatch) -> Registry:
    """The bundled variants and the position-only one."""
    monkeypatch.delenv("PLAYGROUND_PLUGINS_PATH", raising=False)
    path = write_plugin("position_only.py", POSITION_ONLY_PLUGIN)
    return Registry.discover([path.parent], entry_points=False)


def quick_accuracy(registry: Registry, variant: str, task_name: str) -> float:
    """`variant`'s held-out accuracy on the quick spec's task `task_name`, trained on the
    task's first seed exactly as `playground compare` trains it."""
    spec = load_spec("quick", registry)
    tasks = {task.name: task for task in spec.tasks}
    assert task_name in tasks, f"quick.toml has no {task_name!r} task; it has {sorted(tasks)}"
    task = tasks[task_name]
    (setup,) = (each for each in spec.variants if each.name == variant)
    job = Measurer(spec, registry, threads=1, gemm_flops=None).job(Cell(setup, task=task))
    row = measure_accuracy(registry, job, seeds=task.seeds[:1])
    return row["accuracy_mean"]


@pytest.mark.slow
def test_quick_recall_task_solved_by_exact_attention_not_by_position_only(
    registry: Registry,
) -> None:
    """The content question: vanilla finds each key and reads the value after it; the
    position-only variant can only guess among the values it saw (about 0.41)."""
    exact = quick_accuracy(registry, "vanilla", "mqar")
    position_only = quick_accuracy(registry, POSITION_ONLY, "mqar")
    assert exact >= 0.95, exact
    assert position_only <= 0.6, position_only


def test_quick_lookback_task_is_solved_by_position_only_attention(registry: Registry) -> None:
    """The positional question, and why the quick spec needs the recall task beside it:
    attention by distance alone names the token 5 places back as well as exact attention
    (1.000), so lookback alone cannot tell it apart."""
    assert quick_accuracy(registry, POSITION_ONLY, "lookback") >= 0.9
