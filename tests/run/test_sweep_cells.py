"""Sweeps as a spec feature (issue 43 part 1): a [[tasks]] table's list-valued training
settings expand into one cell per grid point, each labelled and recorded with its point;
bad lists are refused naming the key, once; the packed workers train grid cells as the
runner's own process does, and a resume runs only the points that lack a row."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from playground.registry import Registry
from playground.run.cells import pending_cells, plan
from playground.run.jobs import prepare
from playground.run.runner import Runner
from playground.run.spec import SpecError
from playground.run.spec_loading import load_spec
from playground.run.store import RunStore

TABLE = """
    [[tasks]]
    name = "lookback"
    seq_len = 12
    offset = 2
    steps = 3
    seeds = 2
    d_model = 16
    num_heads = 2
    num_layers = 1
    {grid}
"""
SPEC = (
    """
    name = "swept"
    measures = ["accuracy"]
    threads = 1
    accuracy_workers = {workers}
"""
    + TABLE
    + """
    [[variants]]
    name = "vanilla"
"""
)
GRID = "learning_rate = [1e-3, 3e-2]\n    weight_decay = [0.0, 0.5]"


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry.discover(entry_points=False)


def write(tmp_path: Path, grid: str = GRID, workers: int = 1, name: str = "spec.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(SPEC.format(grid=grid, workers=workers)))
    return path


def test_list_valued_settings_expand_into_labelled_grid_points(tmp_path, registry) -> None:
    spec = load_spec(write(tmp_path), registry)
    assert [task.grid for task in spec.tasks] == [
        {"learning_rate": 1e-3, "weight_decay": 0.0},
        {"learning_rate": 1e-3, "weight_decay": 0.5},
        {"learning_rate": 3e-2, "weight_decay": 0.0},
        {"learning_rate": 3e-2, "weight_decay": 0.5},
    ]
    first = spec.tasks[0]
    assert first.sweep == "lookback(seq_len=12, offset=2) d_model=16 num_heads=2 num_layers=1"
    assert first.label == f"{first.sweep} learning_rate=0.001 weight_decay=0.0"
    assert (first.learning_rate, first.weight_decay) == (1e-3, 0.0)
    assert len({cell.id for cell in plan(spec)}) == 4


def test_a_swept_model_setting_is_named_by_the_grid_alone(tmp_path, registry) -> None:
    text = textwrap.dedent(SPEC.format(grid="", workers=1)).replace(
        "d_model = 16", "d_model = [16, 32]"
    )
    path = tmp_path / "width.toml"
    path.write_text(text)
    spec = load_spec(path, registry)
    labels = [task.label for task in spec.tasks]
    assert labels == [
        "lookback(seq_len=12, offset=2) num_heads=2 num_layers=1 d_model=16",
        "lookback(seq_len=12, offset=2) num_heads=2 num_layers=1 d_model=32",
    ]
    # the setup a sweep chooses for is the variant with the settings it does not sweep
    assert {task.settings_label for task in spec.tasks} == {"num_heads=2 num_layers=1"}


@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ("learning_rate = []", r"tasks\[0\]\.learning_rate: sweeps an empty list"),
        ("learning_rate = [1e-3, 1e-3]", r"tasks\[0\]\.learning_rate: lists .* a value twice"),
        # an integer and a float of one number are one value: two cells would train alike
        (
            "learning_rate = [1, 1.0]",
            r"tasks\[0\]\.learning_rate: lists \[1, 1\.0\], a value twice",
        ),
        ("weight_decay = [0, 0.0]", r"tasks\[0\]\.weight_decay: lists \[0, 0\.0\], a value twice"),
        ("weight_decay = [-0.1, 0.1]", r"tasks\[0\]\.weight_decay: must be a number ≥ 0"),
        ("batch_size = [4, 0]", r"tasks\[0\]\.batch_size: must be a positive integer; got 0"),
    ],
)
def test_a_bad_sweep_is_refused_naming_its_key(tmp_path, registry, grid, message) -> None:
    with pytest.raises(SpecError, match=message):
        load_spec(write(tmp_path, grid), registry)


def test_an_integer_point_of_a_float_setting_is_labelled_as_the_setting_holds_it(
    tmp_path, registry
) -> None:
    spec = load_spec(write(tmp_path, "learning_rate = [1, 0.5]\n    weight_decay = [0]"), registry)
    first = spec.tasks[0]
    assert first.grid == {"learning_rate": 1.0, "weight_decay": 0.0}
    assert all(isinstance(value, float) for value in first.grid.values())
    assert first.label.endswith("learning_rate=1.0 weight_decay=0.0")


@pytest.mark.parametrize("other", ["", "learning_rate = [1e-2]", "weight_decay = [0.0, 0.1]"])
def test_a_sweep_and_another_table_of_its_task_are_refused(tmp_path, registry, other) -> None:
    # The report gives a sweep's chosen point under the sweep's label, the task's own: a
    # second table of the task (swept or not) would share it, and the verdict would then
    # compare one setup's sweep with the baseline's other table.
    path = write(tmp_path, "learning_rate = [1e-3, 3e-3]")
    path.write_text(path.read_text() + textwrap.dedent(TABLE.format(grid=other)))
    with pytest.raises(SpecError, match=r"the task 'lookback\(seq_len=12, offset=2\) d_model=16 "
                       r"num_heads=2 num_layers=1' is listed more than once"):  # fmt: skip
        load_spec(path, registry)


def test_seeds_are_not_a_hyperparameter_to_sweep(tmp_path, registry) -> None:
    path = write(tmp_path)
    path.write_text(path.read_text().replace("seeds = 2", "seeds = [1, 2]"))
    with pytest.raises(SpecError, match=r"tasks\[0\]\.seeds: must be a positive integer"):
        load_spec(path, registry)


def test_a_bad_value_shared_by_several_points_is_reported_once(tmp_path, registry) -> None:
    with pytest.raises(SpecError) as raised:
        load_spec(
            write(tmp_path, "learning_rate = [-1.0, 1e-3]\n    weight_decay = [0.0, 0.1]"), registry
        )
    assert str(raised.value).count("must be a positive number; got -1.0") == 1


def test_weight_decay_reaches_the_optimiser(tmp_path, registry) -> None:
    spec = load_spec(write(tmp_path), registry)
    runner = Runner(spec, registry, RunStore.create(tmp_path / "out", spec.name))
    for cell in plan(spec):
        assert cell.task is not None
        training = prepare(registry, runner.measurer.job(cell)).training
        assert training.weight_decay == cell.task.grid["weight_decay"]
        assert training.learning_rate == cell.task.grid["learning_rate"]


@pytest.mark.slow
def test_packed_workers_train_grid_cells_as_the_runner_does_and_resume_runs_one(
    tmp_path, registry
) -> None:
    rows = {}
    for workers in (1, 2):
        spec = load_spec(write(tmp_path, workers=workers, name=f"w{workers}.toml"), registry)
        store = RunStore.create(tmp_path / f"out{workers}", spec.name)
        runner = Runner(spec, registry, store)
        runner.start()
        assert runner.measure_pending() == (4, True)
        rows[workers] = {row["cell"]: row for row in store.rows()}
    assert rows[1].keys() == rows[2].keys()
    for cell, here in rows[1].items():
        packed = rows[2][cell]
        assert here["status"] == packed["status"] == "ok"
        assert here["grid"] == packed["grid"] and here["sweep"] == packed["sweep"]
        assert here["task_label"] == cell.split("|task=")[1]
        for key in ("accuracy_per_seed", "validation_per_seed", "final_train_loss"):
            assert packed[key] == here[key], key
        assert here["validation_metric"] == "accuracy" and len(here["validation_per_seed"]) == 2
    # a resume after losing one point's row runs that point alone
    kept = [
        row for cell, row in rows[2].items() if "weight_decay=0.5" not in cell or "0.03" in cell
    ]
    assert len(kept) == 3
    (missing,) = pending_cells(spec, kept)
    assert missing.task is not None and missing.task.grid == {
        "learning_rate": 1e-3,
        "weight_decay": 0.5,
    }
