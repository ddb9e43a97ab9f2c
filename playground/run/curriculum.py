"""A curriculum: the stages a task trains through before the task itself (`Stage`: the
options each stage overrides and its schedule), and the tasks they make. Part of a spec's
data model (`spec.TaskRun.curriculum`) and of a job's preparation alike, so it depends on
neither."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from playground.errors import ConfigError
from playground.tasks import Task


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage of a curriculum: options that override the task's own for this stage,
    and the stage's schedule (None: that task's default steps and batch size)."""

    options: dict[str, Any]
    steps: int | None = None
    batch_size: int | None = None


def curriculum_tasks(
    task_cls: type[Task], options: dict[str, Any], stages: Sequence[Stage]
) -> list[Task]:
    """The task of each stage (the task's options, then the stage's), then the task itself.
    ConfigError when a stage's options are wrong, when a stage would change the model's
    vocabulary or classes, or when two of them are the same task."""
    tasks = []
    for index, stage in enumerate(stages):
        try:
            tasks.append(task_cls(**{**options, **stage.options}))
        except (ValueError, TypeError) as error:
            raise ConfigError(f"curriculum stage {index}: {error}") from None
    final = task_cls(**options)
    for index, task in enumerate(tasks):
        if (task.vocab_size, task.num_classes) != (final.vocab_size, final.num_classes):
            raise ConfigError(
                f"curriculum stage {index} ({task.label}) has vocab_size {task.vocab_size} "
                f"and {task.num_classes} classes, the task ({final.label}) "
                f"{final.vocab_size} and {final.num_classes}: every stage trains the same "
                "model, so keep the options that size its embeddings and classifier"
            )
    labels = [task.label for task in [*tasks, final]]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ConfigError(
            f"the curriculum trains {repeated[0]} twice; give each stage different options "
            "(more steps on one size go in that stage's steps)"
        )
    return [*tasks, final]
