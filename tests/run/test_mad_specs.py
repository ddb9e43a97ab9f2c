"""The shipped MAD specs (issue 43, part 2): mad.toml is the CPU suite (the six tasks,
every registered variant, a learning-rate grid, two seeds), mad_full.toml is MAD's own
protocol with its difficulty sweep (Poli et al. 2024; mad-lab configs/tasks/*.yml and
mad/configs.py:157-186)."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest

from playground.registry import Registry, default_registry
from playground.run.cells import plan
from playground.run.spec_loading import load_spec
from playground.tasks.mad import MAD_TASKS

MAD_NAMES = {task.name for task in MAD_TASKS}


@pytest.fixture(scope="module")
def registry() -> Registry:
    return default_registry()


def sweeps_of(spec) -> dict[str, list]:
    """Each sweep's label with its grid points' task runs."""
    sweeps: dict[str, list] = defaultdict(list)
    for task in spec.tasks:
        sweeps[task.sweep or task.label].append(task)
    return sweeps


def test_mad_runs_the_six_tasks_on_every_registered_variant_over_a_grid(registry):
    spec = load_spec("mad", registry)
    assert spec.measures == ("accuracy",)
    sweeps = sweeps_of(spec)
    assert {runs[0].name for runs in sweeps.values()} == MAD_NAMES
    assert len(sweeps) == len(MAD_NAMES)  # one setting per task
    for label, runs in sweeps.items():
        assert len({run.learning_rate for run in runs}) >= 3, label
        assert all(len(run.seeds) >= 2 for run in runs), label
        assert all(run.variants is None for run in runs), label
    # No [[variants]] tables: every registered variant, a new plugin included.
    planned = {cell.id.split("|")[0] for cell in plan(spec)}
    assert planned == set(registry.names())


# MAD's settings per task: the baseline and each one-at-a-time change of the sweep
# (configs/tasks/*.yml, as listed in make_benchmark_mad_configs).
MAD_SETTINGS = {
    "mad_recall": 11,
    "mad_fuzzy_recall": 11,
    "mad_noisy_recall": 14,
    "mad_selective_copy": 13,
    "mad_compression": 11,
    "mad_memorization": 6,
}


def test_mad_full_is_mads_protocol_with_its_difficulty_sweep(registry):
    spec = load_spec("mad_full", registry)
    assert spec.executor == "ray"
    sweeps = sweeps_of(spec)
    per_task: dict[str, int] = defaultdict(int)
    for label, runs in sweeps.items():
        per_task[runs[0].name] += 1
        grid = {(run.learning_rate, run.weight_decay) for run in runs}
        assert grid == {(lr, wd) for lr in (1e-4, 5e-4, 1e-3) for wd in (0.0, 0.1)}, label
        for run in runs:
            assert (run.d_model, run.num_layers, run.batch_size) == (128, 2, 128), label
            examples = run.options.get("num_train_examples", 12_800)
            if run.name == "mad_memorization":
                examples = run.options.get("num_train_examples", 256)
            assert run.steps == 200 * math.ceil(examples / 128), label  # 200 epochs
    assert per_task == MAD_SETTINGS
    # Each task's baseline setting is its defaults, which are MAD's sizes.
    baselines = [
        runs[0].name
        for runs in sweeps.values()
        if registry.get_task(runs[0].name)(**runs[0].options).options
        == registry.get_task(runs[0].name)().options
    ]
    assert sorted(baselines) == sorted(MAD_NAMES)
