"""A spec's [[tasks]] tables, each validated into a TaskRun: the task and its options, the
training settings (TASK_SETTINGS) and its curriculum of stages."""

from __future__ import annotations

import dataclasses
import itertools
import math
import typing
from typing import Any

from playground.errors import PlaygroundError
from playground.model.transformer import ARCHITECTURES
from playground.registry import Registry
from playground.run.curriculum import Stage, curriculum_tasks
from playground.run.model_settings import (
    MODEL_DEFAULTS,
    POSITIONAL_ENCODINGS,
    settings_label,
    sweep_label,
    training_label,
)
from playground.run.spec import (
    STAGE_SETTINGS,
    SWEEPABLE,
    TASK_SETTINGS,
    Problems,
    SpecError,
    TaskRun,
    is_instance_of,
)
from playground.tasks import LanguageTask, Task

TABLE_KEYS = ("name", "variants", "curriculum")
"""Keys of a [[tasks]] table beside TASK_SETTINGS and the task's own options."""


def task_runs(
    entry: Any,
    index: int,
    registry: Registry,
    seed: int,
    problems: Problems,
    widths: dict[str, int] | None = None,
) -> list[TaskRun]:
    """A [[tasks]] table as its TaskRuns: one, or one per point of the grid its
    list-valued SWEEPABLE settings span (in the table's order, the last setting fastest).
    Each problem goes to `problems` once, however many points share it."""
    where = f"tasks[{index}]"
    swept = (
        {
            key: [_as_setting(key, value) for value in entry[key]]
            for key in SWEEPABLE
            if isinstance(entry.get(key), list)
        }
        if isinstance(entry, dict)
        else {}
    )
    malformed = False
    for key, values in swept.items():
        if not values:
            problems.add(f"{where}.{key}: sweeps an empty list; give at least one value")
            malformed = True
        elif len(set(map(repr, values))) < len(values):
            problems.add(f"{where}.{key}: lists {entry[key]!r}, a value twice; give each once")
            malformed = True
    if malformed:
        return []
    runs = []
    for point in itertools.product(*swept.values()):
        grid = dict(zip(swept, point, strict=True))
        table = {**entry, **grid} if grid else entry
        run = task_run(table, index, registry, seed, problems, widths, grid)
        if run is not None:
            runs.append(run)
    return runs


def _as_setting(key: str, value: Any) -> Any:
    """A swept value as its setting holds it: a number of a float setting as a float, so
    that `learning_rate = [1, 1.0]` is one value twice (not two cells training alike) and
    the grid tag reads as the setting does (`learning_rate=1.0`)."""
    if TASK_SETTINGS[key] is float and is_instance_of(value, float):
        return float(value)
    return value


def task_run(
    entry: Any,
    index: int,
    registry: Registry,
    seed: int,
    problems: Problems,
    widths: dict[str, int] | None = None,
    grid: dict[str, Any] | None = None,
) -> TaskRun | None:
    """A [[tasks]] table at one point: `name`, the task's own options, and the
    TASK_SETTINGS keys (`seeds` is a count, starting at the spec's seed). `widths`: the
    spec's top-level d_model and num_heads, where it sets them, for a table that does
    not. `grid`: the point of the table's sweep this run is. Each problem goes to
    `problems` (all of them, as far as they can be told apart); None then."""
    where = f"tasks[{index}]"
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        problems.add(f'{where}: each task needs a name, e.g. {{ name = "mqar" }}')
        return None
    found = len(problems.messages)
    try:
        task_cls = registry.get_task(entry["name"])
    except PlaygroundError as error:
        problems.add(f"{where}.name: {error}")
        return None
    settings: dict[str, Any] = {}
    for key, expected in TASK_SETTINGS.items():
        if key in entry:
            value = entry[key]
            if key == "architecture":
                if value not in ARCHITECTURES:
                    problems.add(
                        f"{where}.{key}: {value!r} is not one of {', '.join(ARCHITECTURES)} "
                        '("hf_llama": a transformers Llama with the variant swapped in)'
                    )
                    continue
            elif key == "positional_encoding":
                if value not in POSITIONAL_ENCODINGS:
                    problems.add(
                        f"{where}.{key}: {value!r} is not one of {', '.join(POSITIONAL_ENCODINGS)}"
                        ' ("none" trains without positions: NoPE)'
                    )
                    continue
            elif key == "eval_lengths":
                if not is_instance_of(value, expected) or not value or min(value) < 1:
                    problems.add(
                        f"{where}.{key}: must be a non-empty list of positive integers, e.g. "
                        f"[256, 512, 1024]; got {value!r}"
                    )
                    continue
                value = tuple(value)
            elif key == "weight_decay":
                if not is_instance_of(value, float) or not 0 <= value < math.inf:
                    problems.add(f"{where}.{key}: must be a number ≥ 0; got {value!r}")
                    continue
                value = float(value)
            elif expected is float:
                if not is_instance_of(value, float) or not 0 < value < math.inf:
                    problems.add(f"{where}.{key}: must be a positive number; got {value!r}")
                    continue
                value = float(value)
            elif not is_instance_of(value, expected) or value < 1:
                problems.add(f"{where}.{key}: must be a positive integer; got {value!r}")
                continue
            settings[key] = value
    chosen = entry.get("variants")
    if chosen is not None and (
        not isinstance(chosen, list) or not chosen or not all(isinstance(v, str) for v in chosen)
    ):
        problems.add(
            f"{where}.variants: must be a non-empty list of variant names or labels, "
            f'e.g. ["my_variant"]'
        )
    options_class = typing.cast("type[Task]", task_cls).Options
    option_names = [field.name for field in dataclasses.fields(options_class)]
    table_keys = [*TABLE_KEYS, *TASK_SETTINGS, *option_names]
    problems.unknown(where, entry, table_keys)
    stage_keys = [*STAGE_SETTINGS, *option_names]
    stages = entry.get("curriculum")
    stages_known = not isinstance(stages, list) or not any(  # else curriculum_tasks repeats it
        [
            problems.unknown(f"{where}.curriculum[{index}]", stage, stage_keys)
            for index, stage in enumerate(stages)
            if isinstance(stage, dict)
        ]
    )
    options = {k: v for k, v in entry.items() if k in option_names}
    try:
        task = task_cls(**options)
    except (PlaygroundError, ValueError, TypeError) as error:
        problems.add(f"{where}: {error}")
        task = None
    try:
        curriculum = curriculum_stages(entry.get("curriculum", []), where)
    except SpecError as error:
        problems.add(str(error))
        curriculum = ()
    stage_tasks: list[Task] = []
    if task is not None and stages_known:
        try:
            *stage_tasks, _ = curriculum_tasks(task_cls, options, curriculum)
        except PlaygroundError as error:
            problems.add(f"{where}: {error}")
    inherited = {k: v for k, v in (widths or {}).items() if k not in settings}
    settings.update(inherited)  # a width the table leaves out is the spec's, if it sets one
    d_model = settings.get("d_model", MODEL_DEFAULTS["d_model"])
    num_heads = settings.get("num_heads", MODEL_DEFAULTS["num_heads"])
    if d_model % num_heads:
        source = f" (the spec's top-level {', '.join(inherited)})" if inherited else ""
        problems.add(
            f"{where}.d_model: {d_model} is not divisible by num_heads = {num_heads}{source}; "
            f"set both in the [[tasks]] table"
        )
    if task is not None:
        for stage, (stage_task, key) in enumerate(
            [(t, f"curriculum[{i}].batch_size") for i, t in enumerate(stage_tasks)]
            + [(task, "batch_size")]
        ):
            schedule = curriculum[stage] if stage < len(stage_tasks) else None
            batch_size = (
                schedule.batch_size if schedule else settings.get("batch_size")
            ) or stage_task.default_batch_size
            if batch_size > stage_task.num_train:
                problems.add(
                    f"{where}.{key}: {batch_size} is more than the {stage_task.num_train} "
                    f"training examples task {stage_task.label!r} generates, so every step "
                    f"would train on all of them; use at most {stage_task.num_train}"
                )
    if isinstance(task, LanguageTask) and curriculum:
        problems.add(
            f"{where}.curriculum: a language task is scored in bits per byte at its own "
            "lengths, and a curriculum's stages would not be; train it without one"
        )
    if task is not None and "eval_lengths" in settings:
        if curriculum:
            problems.add(
                f"{where}.eval_lengths: a curriculum's model is scored on each stage's task; "
                "evaluate at other lengths without one"
            )
        for length in settings["eval_lengths"]:
            try:
                task.check_eval_length(length)
            except PlaygroundError as error:
                problems.add(f"{where}.eval_lengths: {error}")
                break
    if task is None or len(problems.messages) > found:
        return None
    grid = dict(grid or {})
    model = {
        "positional_encoding": settings.get("positional_encoding", "auto"),
        "architecture": settings.get("architecture", "playground"),
        **{k: v for k, v in settings.items() if k in MODEL_DEFAULTS},
    }
    label = training_label(task.label, curriculum=bool(curriculum), grid=grid, **model)
    return TaskRun(
        name=entry["name"],
        options=options,
        label=label,
        seeds=tuple(range(seed, seed + settings.pop("seeds", 3))),
        variants=None if chosen is None else tuple(chosen),
        curriculum=curriculum,
        stage_labels=tuple(
            training_label(each.label, curriculum=bool(curriculum), grid=grid, **model)
            for each in stage_tasks
        ),
        settings_label=settings_label(**{k: v for k, v in model.items() if k not in grid}),
        grid=grid,
        sweep=sweep_label(label, grid),
        **settings,
    )


def curriculum_stages(entries: Any, where: str) -> tuple[Stage, ...]:
    """A [[tasks]] table's `curriculum`: a list of tables of task options, each with an
    optional `steps` and `batch_size`."""
    example = "e.g. curriculum = [{ seq_len = 64, num_pairs = 4, steps = 600 }]"
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise SpecError(f"{where}.curriculum: must be a list of tables of task options, {example}")
    stages = []
    for index, entry in enumerate(entries):
        for key in STAGE_SETTINGS:
            if key in entry and (not is_instance_of(entry[key], int) or entry[key] < 1):
                raise SpecError(
                    f"{where}.curriculum[{index}].{key}: must be a positive integer; "
                    f"got {entry[key]!r}"
                )
        options = {k: v for k, v in entry.items() if k not in STAGE_SETTINGS}
        if not options:
            raise SpecError(
                f"{where}.curriculum[{index}]: a stage needs at least one task option that "
                f"differs from the task's, {example}"
            )
        stages.append(Stage(options, entry.get("steps"), entry.get("batch_size")))
    return tuple(stages)
