"""Issue 42: feedback while a run trains. Seeds training on worker processes report their
steps to the driver, which shows a bar per seed and one for all the steps, with the time
remaining ("training seeds on 2 workers 0/2" sat 4 minutes per lm cell with nothing
else); and output that is not a terminal gets a line per finished seed and per finished
cell (nothing appeared for 13 minutes)."""

from __future__ import annotations

import io
import re
import textwrap

import pytest
from rich.console import Console
from rich.progress import Progress

from playground.cli import main
from playground.registry import configure
from playground.run import runner as runner_module
from playground.run import training_progress
from playground.run.training_progress import StepReport, StepReporter, TrainingBars

SPEC = """
name = "packed"
measures = ["accuracy"]
threads = 1
accuracy_workers = 2
[[variants]]
name = "vanilla"
[[variants]]
name = "alibi"
[[tasks]]
name = "lookback"
seq_len = 12
offset = 2
steps = 6
seeds = 2
d_model = 16
num_heads = 2
num_layers = 1
"""


@pytest.fixture(autouse=True)
def _reset_default_registry():
    yield
    configure([])


def test_a_worker_reports_its_steps_at_most_every_interval_and_at_each_end(monkeypatch):
    clock = iter([0.0, 0.3, 0.6, 1.2, 1.3, 5.0, 5.1])
    monkeypatch.setattr(training_progress.time, "monotonic", lambda: next(clock))
    sent: list[StepReport] = []
    reporter = StepReporter(sent.append, "cell", 1)
    bar = reporter.add_task("vanilla on lookback, seed 1", total=5)  # sent, at 0.0
    for _ in range(4):  # at 0.3, 0.6: not yet; at 1.2: sent; at 1.3: not yet
        reporter.update(bar, advance=1)
    reporter.update(bar, advance=1, description="vanilla on lookback, seed 1 loss 2.0")  # 5.0
    reporter.remove_task(bar)  # sent whatever the time
    assert [(r.completed, r.total, r.finished) for r in sent] == [
        (0, 5, False),
        (3, 5, False),
        (5, 5, False),
        (5, 5, True),
    ]
    assert sent[-1].description.endswith("loss 2.0") and {r.cell for r in sent} == {"cell"}


def recording_progress(terminal: bool) -> Progress:
    console = Console(file=io.StringIO(), force_terminal=terminal, record=True, width=200)
    return Progress(console=console)


def test_the_bars_show_each_seed_and_every_step_with_a_curriculum():
    progress = recording_progress(terminal=True)
    bars = TrainingBars(progress, total_steps=2 * (4 + 6), seeds=2)
    for seed in (0, 1):  # a stage of 4 steps, then the task's 6
        bars.steps(StepReport("c", seed, f"stage, seed {seed}", 3, 4))
    overall = progress.tasks[0]
    assert overall.total == 20 and overall.completed == 6
    assert sorted(task.description for task in progress.tasks[1:]) == [
        "stage, seed 0",
        "stage, seed 1",
    ]
    bars.steps(StepReport("c", 0, "stage, seed 0", 4, 4, finished=True))
    bars.steps(StepReport("c", 0, "task, seed 0", 5, 6))
    assert overall.completed == 12
    (seed_bar,) = [task for task in progress.tasks if task.description == "task, seed 0"]
    assert (seed_bar.completed, seed_bar.total) == (5, 6)
    bars.steps(StepReport("c", 0, "task, seed 0", 6, 6, finished=True))
    bars.seed_done("c", 0, None)
    assert overall.completed == 13
    assert [task.description for task in progress.tasks[1:]] == ["stage, seed 1"]
    assert "seed 0 of c" not in progress.console.export_text()  # a terminal has the bars
    bars.close()
    assert progress.tasks == []


def test_without_a_terminal_each_seed_that_finishes_is_a_line():
    progress = recording_progress(terminal=False)
    bars = TrainingBars(progress, total_steps=12, seeds=2)
    bars.steps(StepReport("vanilla|task=x", 0, "d", 6, 6, finished=True))
    bars.seed_done("vanilla|task=x", 0, None)
    bars.seed_done("vanilla|task=x", 1, "RuntimeError: boom")
    text = " ".join(progress.console.export_text().split())
    assert "seed 0 of vanilla|task=x trained (1/2 seeds, 6/12 steps" in text
    assert "seed 1 of vanilla|task=x failed: RuntimeError: boom (2/2 seeds" in text


def test_a_packed_run_to_a_file_says_each_seed_and_cell_as_it_finishes(
    tmp_path, capsys, monkeypatch
):
    """The issue's case, small: accuracy seeds on 2 workers, output not a terminal. Each
    seed's line counts the steps the workers reported; each cell's line follows."""
    monkeypatch.setattr(runner_module, "gemm_flops_per_second", lambda *a, **k: 1e11)
    spec = tmp_path / "packed.toml"
    spec.write_text(textwrap.dedent(SPEC))
    assert main(["run", str(spec), "--out", str(tmp_path / "results")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    seed_lines = re.findall(r"seed [01] of \S+\|task=lookback\S+ .*? trained \(\d/4 seeds", out)
    assert len(seed_lines) == 4
    assert "(4/4 seeds, 24/24 steps" in out  # every step reached the driver
    for variant in ("vanilla", "alibi"):
        assert f"/2 {variant}|task=lookback(seq_len=12, offset=2) d_model=16" in out
    assert out.index("(4/4 seeds") < out.rindex("2/2 ")  # the last cell's line after
