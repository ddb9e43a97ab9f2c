"""What one accuracy cell trains, as plain values, and how it is made concrete: an
`AccuracyJob` (the variant, the task, the model and the schedule, a curriculum of
`Stage`s), and `prepare`, which builds the task, the model's config and each stage's
schedule, and refuses (UnsupportedFeature, so the runner records `unsupported`) before
any training when the variant cannot do what the task needs. A worker process rebuilds
a job from these values alone; playground.run.accuracy trains and scores it."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from playground.config import build_config
from playground.errors import UnsupportedFeature
from playground.model.training import TrainConfig
from playground.model.transformer import ArchitectureName, ModelConfig, PositionalEncodingName
from playground.registry import Registry
from playground.run.curriculum import Stage, curriculum_tasks
from playground.tasks import Task


def check_task_support(
    registry: Registry, variant: str, options: dict[str, Any], task: Task
) -> None:
    """UnsupportedFeature if the variant's capabilities with `options` miss what the task
    needs."""
    cls = registry.get(variant)
    capabilities = cls.capabilities_for(build_config(cls.Config, options, variant))
    if task.needs_causal and not capabilities.causal:
        raise UnsupportedFeature(variant, f"causal attention, which task {task.name!r} needs")
    if task.pads and not capabilities.padding_mask:
        raise UnsupportedFeature(
            variant, f"padding masks, which task {task.name!r} needs (its sequences vary)"
        )


@dataclasses.dataclass(frozen=True)
class AccuracyJob:
    """Everything that trains one variant on one task, as plain values: a worker process
    rebuilds the task, the model and the schedule from it (`prepare`)."""

    variant: str
    variant_options: dict[str, Any]
    task: str
    task_options: dict[str, Any]
    steps: int | None = None
    """None: the task's `default_steps`."""
    d_model: int = 64
    num_heads: int = 4
    num_layers: int = 2
    learning_rate: float | None = None
    """None: the task's `default_learning_rate`."""
    weight_decay: float | None = None
    """None: TrainConfig's default."""
    batch_size: int | None = None
    """None: the task's `default_batch_size`."""
    grid: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The point of a sweep this job trains (TaskRun.grid), which its rows are labelled
    with; the settings themselves are the fields above."""
    curriculum: tuple[Stage, ...] = ()
    """Stages trained first, in order, on the same model (see the module docstring)."""
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    positional_encoding: PositionalEncodingName = "auto"
    """The model's own positions (ModelConfig.positional_encoding; "none" is NoPE)."""
    architecture: ArchitectureName = "playground"
    """The network (ModelConfig.architecture)."""
    eval_lengths: tuple[int, ...] = ()
    """Lengths to score the trained model at beside its training length: a language
    task's held-out text in longer windows, another task at that length (Task.at_length)."""
    keep_weights: bool = False
    """Return each seed's trained weights (SeedResult.weights) for the run to keep."""


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A job made concrete: the task, the model's config and the training schedule."""

    job: AccuracyJob
    task: Task
    model: ModelConfig
    training: TrainConfig
    stages: tuple[tuple[Task, TrainConfig], ...] = ()
    """The curriculum's stages, in training order, each with its schedule."""


def prepare(registry: Registry, job: AccuracyJob) -> Prepared:
    """Build what `job` names; raises UnsupportedFeature (record as `unsupported`) when the
    variant cannot do what the task (or a curriculum stage) needs, ConfigError for bad
    options."""
    *stage_tasks, task = curriculum_tasks(
        registry.get_task(job.task), job.task_options, job.curriculum
    )
    for each in (*stage_tasks, task):
        check_task_support(registry, job.variant, job.variant_options, each)
    for length in job.eval_lengths:
        task.check_eval_length(length)
    model = ModelConfig(
        vocab_size=task.vocab_size,
        num_classes=task.num_classes,
        max_seq_len=max(each.seq_len for each in (*stage_tasks, task)),
        variant=job.variant,
        variant_options=dict(job.variant_options),
        d_model=job.d_model,
        num_heads=job.num_heads,
        num_layers=job.num_layers,
        target=task.target,
        causal=task.needs_causal,
        positional_encoding=job.positional_encoding,
        architecture=job.architecture,
    )

    def schedule(task: Task, steps: int | None, batch_size: int | None) -> TrainConfig:
        return TrainConfig(
            steps=task.default_steps if steps is None else steps,
            batch_size=batch_size or task.default_batch_size,
            learning_rate=job.learning_rate or task.default_learning_rate,
            **({} if job.weight_decay is None else {"weight_decay": job.weight_decay}),
        )

    stages = tuple(
        (each, schedule(each, stage.steps, stage.batch_size))
        for each, stage in zip(stage_tasks, job.curriculum, strict=True)
    )
    return Prepared(job, task, model, schedule(task, job.steps, job.batch_size), stages)
