"""Issue 42: a typo in a spec names the key it meant (`step = 60`: did you mean 'steps'?)
wherever unknown keys are refused; and the command line's --steps, --seeds, --d-model and
--num-layers are merged into the spec and validated by the spec's own checks, recorded in
overrides.json so that --resume keeps them."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from playground.cli import main
from playground.registry import Registry, configure
from playground.run import runner as runner_module
from playground.run.spec import SpecError
from playground.run.spec_loading import load_spec

ACCURACY = """
name = "sizes"
measures = ["accuracy"]
accuracy_workers = 1
[[variants]]
name = "vanilla"
[[tasks]]
name = "lookback"
seq_len = 8
steps = 40
seeds = 3
d_model = 32
num_heads = 4
{extra}
"""

COSTS = """
name = "costs"
seq_lens = [16]
d_model = 16
num_heads = 2
passes = ["forward"]
measures = ["speed"]
[timing]
min_run_time = 0.01
[[variants]]
name = "vanilla"
"""


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry.discover(entry_points=False)


@pytest.fixture(autouse=True)
def _reset_default_registry():
    yield
    configure([])


def write(tmp_path: Path, body: str, extra: str = "") -> Path:
    path = tmp_path / "spec.toml"
    path.write_text(textwrap.dedent(body).replace("{extra}", extra))
    return path


def refused(path: Path, registry: Registry, **sizes: int) -> str:
    with pytest.raises(SpecError) as raised:
        load_spec(path, registry, sizes)
    return str(raised.value)


# --- typos ---------------------------------------------------------------------------
def test_a_typo_in_a_tasks_table_names_the_key_it_meant(tmp_path, registry):
    """The issue's case: `step = 60` in a [[tasks]] table."""
    message = refused(write(tmp_path, ACCURACY, "step = 60"), registry)
    assert "tasks[0].step: unknown key; did you mean 'steps'?" in message
    assert "has no option" not in message  # said once, by the spec


def test_a_task_option_typo_names_the_option_it_meant(tmp_path, registry):
    message = refused(write(tmp_path, ACCURACY, "seq_lenn = 16"), registry)
    assert "tasks[0].seq_lenn: unknown key; did you mean 'seq_len'?" in message


def test_a_table_key_at_the_top_level_says_where_it_belongs(tmp_path, registry):
    message = refused(write(tmp_path, "step = 60\n" + ACCURACY), registry)
    assert "key 'step': unknown key; did you mean 'steps'?" in message
    assert "a key of each [[tasks]] table, not of the top level" in message


def test_a_curriculum_stage_typo_names_the_key_it_meant(tmp_path, registry):
    extra = "curriculum = [{ seq_len = 12, stepz = 3 }]"
    message = refused(write(tmp_path, ACCURACY, extra), registry)
    assert "tasks[0].curriculum[0].stepz: unknown key; did you mean 'steps'?" in message
    assert message.count("stepz") == 1


def test_a_variant_option_typo_names_the_option_it_meant(tmp_path, registry):
    body = COSTS.replace('name = "vanilla"', 'name = "sliding_window"\nwindw = 4\nzzz = 1')
    message = refused(write(tmp_path, body), registry)
    assert "'windw' (did you mean 'window'?), 'zzz'; valid options:" in message


# --- sizes from the command line -----------------------------------------------------
def test_sizes_are_merged_into_every_task(tmp_path, registry):
    extra = "curriculum = [{ seq_len = 12, steps = 30 }]"
    spec = load_spec(
        write(tmp_path, ACCURACY, extra),
        registry,
        {"steps": 5, "seeds": 2, "d_model": 16, "num_layers": 1},
    )
    (task,) = spec.tasks
    assert (task.steps, task.seeds, task.d_model, task.num_layers) == (5, (0, 1), 16, 1)
    assert [stage.steps for stage in task.curriculum] == [5]
    assert "d_model=16" in task.label and "num_layers=1" in task.label


def test_d_model_sets_the_cost_cells_width_too(tmp_path, registry):
    assert load_spec(write(tmp_path, COSTS), registry, {"d_model": 32}).d_model == 32


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        ({"steps": 0}, "tasks[0].steps: must be a positive integer; got 0"),
        ({"seeds": -1}, "tasks[0].seeds: must be a positive integer; got -1"),
        ({"d_model": 30}, "tasks[0].d_model: 30 is not divisible by num_heads = 4"),
        ({"num_layers": 0}, "tasks[0].num_layers: must be a positive integer; got 0"),
    ],
)
def test_sizes_are_validated_by_the_specs_own_checks(tmp_path, registry, sizes, expected):
    message = refused(write(tmp_path, ACCURACY), registry, **sizes)
    assert expected in message
    flag, value = next(iter(sizes.items()))
    assert f"--{flag.replace('_', '-')} {value} merged into the spec" in message


def test_a_cost_width_that_does_not_divide_the_heads_is_refused(tmp_path, registry):
    message = refused(write(tmp_path, COSTS), registry, d_model=17)
    assert "key 'd_model': 17 is not divisible by num_heads = 2" in message


def test_training_sizes_on_a_spec_without_tasks_are_refused(tmp_path, registry):
    message = refused(write(tmp_path, COSTS), registry, steps=5, seeds=2)
    assert "--steps, --seeds set the training of a spec's [[tasks]] tables" in message
    assert "has none" in message


@pytest.fixture
def _no_gemm(monkeypatch):
    monkeypatch.setattr(runner_module, "gemm_flops_per_second", lambda *a, **k: 1e11)


def test_the_command_lines_sizes_run_and_a_resume_keeps_them(tmp_path, capsys, _no_gemm):
    spec = write(tmp_path, ACCURACY)
    out = tmp_path / "results"
    argv = ["run", str(spec), "--out", str(out), "--threads", "1"]
    assert main([*argv, "--steps", "3", "--seeds", "2", "--d-model", "16"]) == 0
    (run_dir,) = (out / "sizes").iterdir()
    overrides = json.loads((run_dir / "overrides.json").read_text())
    assert (overrides["steps"], overrides["seeds"], overrides["d_model"]) == (3, 2, 16)
    (row,) = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert (row["steps"], row["seeds"], row["d_model"]) == (3, [0, 1], 16)
    capsys.readouterr()
    assert main(["run", "--resume", str(run_dir)]) == 0
    assert "1 cells (0 to run" in capsys.readouterr().out  # the same cell, done
    assert main(["run", "--resume", str(run_dir), "--steps", "4"]) == 2
    assert "drop --steps" in capsys.readouterr().err
