"""Accuracy of a variant on a task: a tiny Transformer trained per seed, scored on the
held-out split, summarised as mean ± standard deviation over seeds.

`measure_accuracy` returns the fields of one result row; the runner adds the variant,
status and timing around it. A variant that cannot do what the task needs (causal
attention, padding masks, the task's length) raises UnsupportedFeature before any training,
so the runner records `unsupported`.
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
from playground.tasks import Task
from playground.training import TrainConfig, evaluate, majority_rate, train

DEFAULT_SEEDS = (0, 1, 2)


def check_task_support(registry: Registry, variant: str, task: Task) -> None:
    """UnsupportedFeature if the variant's declared capabilities miss what the task needs."""
    capabilities = registry.get(variant).capabilities
    if task.needs_causal and not capabilities.causal:
        raise UnsupportedFeature(variant, f"causal attention, which task {task.name!r} needs")
    if task.pads and not capabilities.padding_mask:
        raise UnsupportedFeature(
            variant, f"padding masks, which task {task.name!r} needs (its sequences vary)"
        )


def measure_accuracy(
    registry: Registry,
    variant_name: str,
    variant_options: dict[str, Any],
    task_name: str,
    task_options: dict[str, Any],
    *,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    steps: int | None = None,
    d_model: int = 64,
    num_heads: int = 4,
    num_layers: int = 2,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    progress: Progress | bool | None = None,
) -> dict[str, Any]:
    """Train and score `variant_name` on `task_name` once per seed; return the row fields.

    Each seed draws its own data (train/test disjoint), initialisation and batch order.
    `steps` defaults to the task's `default_steps`. `progress`: a rich Progress to add a bar
    to (the runner's own), True for a private one, None/False for none.
    Raises UnsupportedFeature (record as `unsupported`) and ConfigError (bad options).
    """
    task: Task = registry.get_task(task_name)(**task_options)
    check_task_support(registry, variant_name, task)
    if not seeds:
        raise ConfigError("seeds is empty; give at least one seed (three for a mean ± std)")
    config = ModelConfig(
        vocab_size=task.vocab_size,
        num_classes=task.num_classes,
        max_seq_len=task.seq_len,
        variant=variant_name,
        variant_options=dict(variant_options),
        d_model=d_model,
        num_heads=num_heads,
        num_layers=num_layers,
        target=task.target,
        causal=task.needs_causal,
    )
    training = TrainConfig(
        steps=task.default_steps if steps is None else steps,
        batch_size=task.default_batch_size,
        learning_rate=task.default_learning_rate,
    )
    own_progress = Progress(transient=True) if progress is True else None
    bars = own_progress or (progress if isinstance(progress, Progress) else None)
    if own_progress is not None:
        own_progress.start()
    try:
        results = [
            _train_seed(task, config, training, registry, seed, device, dtype, bars)
            for seed in seeds
        ]
    finally:
        if own_progress is not None:
            own_progress.stop()
    return _row_fields(task, training, seeds, results)


@dataclasses.dataclass(frozen=True)
class SeedResult:
    """One seed's model trained and scored."""

    accuracy: float
    train_time_s: float
    majority: float
    final_train_loss: float
    model: dict[str, Any]


def _train_seed(
    task: Task,
    config: ModelConfig,
    training: TrainConfig,
    registry: Registry,
    seed: int,
    device: str,
    dtype: torch.dtype,
    progress: Progress | None,
) -> SeedResult:
    """Draw the seed's data, initialise and train its model, score it on the test split."""
    train_data, test_data = task.split(seed)
    torch.manual_seed(seed)
    model = TransformerClassifier(config, registry).to(device, dtype)
    result = train(
        model,
        train_data,
        training,
        seed=seed,
        device=device,
        progress=progress,
        description=f"{config.variant} on {task.label}, seed {seed}",
    )
    return SeedResult(
        accuracy=evaluate(model, test_data, device=device),
        train_time_s=result.train_time_s,
        majority=majority_rate(test_data),
        final_train_loss=statistics.fmean(result.losses[-20:]),
        model=describe(model),
    )


def _row_fields(
    task: Task, training: TrainConfig, seeds: Sequence[int], results: Sequence[SeedResult]
) -> dict[str, Any]:
    """The result row's accuracy fields: mean ± std over seeds, and what they came from."""
    accuracies = [result.accuracy for result in results]
    return {
        "task": task.name,
        "task_options": dataclasses.asdict(task.options),
        "task_label": task.label,
        "accuracy_mean": statistics.fmean(accuracies),
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
