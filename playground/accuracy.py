"""Accuracy of a variant on a task: a tiny Transformer trained per seed, scored on the
held-out split, summarised over seeds as the mean with its 95% Student-t interval (and
the standard deviation and every seed's value).

An `AccuracyJob` names the work in plain values; `prepare` makes it concrete (and raises
UnsupportedFeature before any training when the variant cannot do what the task needs:
causal attention, padding masks, the task's length, so the runner records `unsupported`);
`train_seed` trains and scores one seed; `row_fields` turns the seeds' results into the
row's fields. `measure_accuracy` does the three in one process, seed after seed; the
packed lane (playground.executors) runs `train_seed` on worker processes instead.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

import torch
from rich.progress import Progress

from playground.errors import ConfigError, UnsupportedFeature
from playground.model import ModelConfig, TransformerClassifier, describe
from playground.registry import Registry
from playground.stats import interval_half_width
from playground.tasks import Task
from playground.training import TrainConfig, evaluate, majority_rate, train

DEFAULT_SEEDS = (0, 1, 2)
MODEL_DEFAULTS = {"d_model": 64, "num_heads": 4, "num_layers": 2}
"""The model a task trains on unless its table says otherwise."""


def training_label(task_label: str, **shape: int) -> str:
    """The task's label, with each model setting that is not the default appended
    (`mqar(seq_len=128, num_pairs=8) d_model=128`): one task trained at several widths
    is several cells."""
    changed = [
        f"{k}={shape[k]}"
        for k in MODEL_DEFAULTS
        if shape.get(k, MODEL_DEFAULTS[k]) != MODEL_DEFAULTS[k]
    ]
    return " ".join([task_label, *changed])


def check_task_support(registry: Registry, variant: str, task: Task) -> None:
    """UnsupportedFeature if the variant's declared capabilities miss what the task needs."""
    capabilities = registry.get(variant).capabilities
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
    batch_size: int | None = None
    """None: the task's `default_batch_size`."""
    device: str = "cpu"
    dtype: torch.dtype = torch.float32


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A job made concrete: the task, the model's config and the training schedule."""

    job: AccuracyJob
    task: Task
    model: ModelConfig
    training: TrainConfig


def prepare(registry: Registry, job: AccuracyJob) -> Prepared:
    """Build what `job` names; raises UnsupportedFeature (record as `unsupported`) when the
    variant cannot do what the task needs, ConfigError for bad options."""
    task: Task = registry.get_task(job.task)(**job.task_options)
    check_task_support(registry, job.variant, task)
    model = ModelConfig(
        vocab_size=task.vocab_size,
        num_classes=task.num_classes,
        max_seq_len=task.seq_len,
        variant=job.variant,
        variant_options=dict(job.variant_options),
        d_model=job.d_model,
        num_heads=job.num_heads,
        num_layers=job.num_layers,
        target=task.target,
        causal=task.needs_causal,
    )
    training = TrainConfig(
        steps=task.default_steps if job.steps is None else job.steps,
        batch_size=job.batch_size or task.default_batch_size,
        learning_rate=job.learning_rate or task.default_learning_rate,
    )
    return Prepared(job, task, model, training)


def measure_accuracy(
    registry: Registry,
    job: AccuracyJob,
    *,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    progress: Progress | bool | None = None,
) -> dict[str, Any]:
    """Train and score `job` once per seed, one seed after another; return the row fields.

    Each seed draws its own data (train/test disjoint), initialisation and batch order.
    `progress`: a rich Progress to add a bar to (the runner's own), True for a private one,
    None/False for none. Raises UnsupportedFeature (record as `unsupported`) and ConfigError
    (bad options).
    """
    prepared = prepare(registry, job)
    if not seeds:
        raise ConfigError(
            "seeds is empty; give at least one seed (three or more for a confidence interval)"
        )
    own_progress = Progress(transient=True) if progress is True else None
    bars = own_progress or (progress if isinstance(progress, Progress) else None)
    if own_progress is not None:
        own_progress.start()
    try:
        results = [train_seed(registry, prepared, seed, bars) for seed in seeds]
    finally:
        if own_progress is not None:
            own_progress.stop()
    return row_fields(prepared, seeds, results)


@dataclasses.dataclass(frozen=True)
class SeedResult:
    """One seed's model trained and scored."""

    accuracy: float
    train_time_s: float
    majority: float
    final_train_loss: float
    model: dict[str, Any]


def train_seed(
    registry: Registry, prepared: Prepared, seed: int, progress: Progress | None = None
) -> SeedResult:
    """Draw the seed's data, initialise and train its model, score it on the test split."""
    job, config = prepared.job, prepared.model
    train_data, test_data = prepared.task.split(seed)
    torch.manual_seed(seed)
    model = TransformerClassifier(config, registry).to(job.device, job.dtype)
    result = train(
        model,
        train_data,
        prepared.training,
        seed=seed,
        device=job.device,
        progress=progress,
        description=f"{config.variant} on {prepared.task.label}, seed {seed}",
    )
    return SeedResult(
        accuracy=evaluate(model, test_data, device=job.device),
        train_time_s=result.train_time_s,
        majority=majority_rate(test_data),
        final_train_loss=statistics.fmean(result.losses[-20:]),
        model=describe(model),
    )


def row_fields(
    prepared: Prepared, seeds: Sequence[int], results: Sequence[SeedResult]
) -> dict[str, Any]:
    """The result row's accuracy fields: mean, 95% half-width and std over seeds, each
    seed's value, and what they came from."""
    task, training = prepared.task, prepared.training
    accuracies = [result.accuracy for result in results]
    return {
        "task": task.name,
        "task_options": dataclasses.asdict(task.options),
        "task_label": training_label(
            task.label,
            d_model=prepared.model.d_model,
            num_heads=prepared.model.num_heads,
            num_layers=prepared.model.num_layers,
        ),
        "accuracy_mean": statistics.fmean(accuracies),
        "accuracy_ci95": interval_half_width(accuracies),
        "accuracy_std": statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0,
        "accuracy_per_seed": accuracies,
        "seeds": list(seeds),
        "chance": task.chance,
        "majority_baseline": statistics.fmean(result.majority for result in results),
        "final_train_loss": statistics.fmean(result.final_train_loss for result in results),
        "steps": training.steps,
        "batch_size": training.batch_size,
        "train_time_s": statistics.fmean(result.train_time_s for result in results),
        "model": results[-1].model,
    }
