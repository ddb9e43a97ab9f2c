"""Accuracy of a variant on a task: a tiny Transformer trained per seed, scored on the
held-out split, summarised over seeds as the mean with its 95% Student-t interval (and
the standard deviation and every seed's value).

An `AccuracyJob` names the work and `prepare` makes it concrete (playground.run.jobs);
`train_seed` trains and scores one seed; `row_fields` turns the seeds' results into the
row's fields. `measure_accuracy` does the three in one process, seed after seed; the
packed lanes (playground.run.seeds.train_seed_task) run `train_seed` on worker processes
instead.

A curriculum (Zoology trains one model on several MQAR sizes and scores it on each) is a
list of `Stage`s trained first, in order, on the same model, before the task's own steps;
the model is then scored on every stage's test split as well as the task's, and each
stage's scores become a row of their own (`row_fields`' "stages").
"""

from __future__ import annotations

import dataclasses
import statistics
import typing
from collections.abc import Callable, Sequence
from typing import Any

import torch
from rich.progress import Progress

from playground.errors import ConfigError, FailureFields, failure_fields, first_seed_failure
from playground.hook_calls import learned_summaries
from playground.model.training import TrainConfig, evaluate, majority_rate, train
from playground.model.transformer import TransformerClassifier, describe
from playground.registry import Registry
from playground.run.jobs import AccuracyJob, Prepared, prepare
from playground.run.language_scores import (
    LanguageScores,
    evaluation_lengths,
    language_fields,
    score_language,
)
from playground.run.model_settings import (
    build_model,
    refuse_beyond_limit,
    sweep_label,
    training_label,
)
from playground.run.row_schema import (
    AccuracyScores,
    LengthFields,
    TaskFields,
    TaskIdentity,
    TaskOutcome,
)
from playground.run.state_size import StateSize, scored_state_sizes, state_fields
from playground.run.stats import interval_half_width, proportion_interval
from playground.tasks import IGNORE, LanguageTask, Task

DEFAULT_SEEDS = (0, 1, 2)


WeightsSink = Callable[[int, dict[str, torch.Tensor]], str]
"""Keeps one seed's trained weights somewhere and returns where (the run's store)."""


def kept_weights(
    seeds: Sequence[int], results: Sequence[SeedResult], keep: WeightsSink | None
) -> TaskFields:
    """The row's "weights" field (seed -> where its weights are kept) when the seeds
    returned weights; a note instead when there was nowhere to keep them."""
    if not any(result.weights is not None for result in results):
        return {}
    if keep is None:
        return {"weights_note": "weights were trained but this process had nowhere to keep them"}
    return {
        "weights": {
            str(seed): keep(seed, result.weights)
            for seed, result in zip(seeds, results, strict=True)
            if result.weights is not None
        }
    }


def measure_accuracy(
    registry: Registry,
    job: AccuracyJob,
    *,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    progress: Progress | bool | None = None,
    keep: WeightsSink | None = None,
) -> TaskOutcome:
    """Train and score `job` once per seed, one seed after another; return the row fields.

    Each seed draws its own data (train/test disjoint), initialisation and batch order.
    `keep`: where each seed's weights go when the job keeps them.
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
    return {**row_fields(prepared, seeds, results), **kept_weights(seeds, results, keep)}


@dataclasses.dataclass(frozen=True)
class SeedResult:
    """One seed's model trained and scored: its accuracy, or a language task's scores."""

    accuracy: float | None
    train_time_s: float
    """Every stage's training and the task's, together."""
    majority: float | None
    final_train_loss: float
    model: dict[str, Any]
    scored: int | None = None
    """How many held-out predictions `accuracy` is the proportion of."""
    stage_scores: tuple[tuple[float, float], ...] = ()
    """(accuracy, majority baseline) on each curriculum stage's test split, after all
    the training."""
    language: LanguageScores | None = None
    """A language task's bits per byte at each length (accuracy is then None)."""
    weights: dict[str, torch.Tensor] | None = None
    """The trained model's state dict, on the CPU, when the job keeps weights."""
    learned: dict[str, dict[str, float | list[float]]] = dataclasses.field(default_factory=dict)
    """Each attention layer's `learned_summary()` after training (layers with none left out)."""
    validation: float | None = None
    """The score on the task's validation split (accuracy, or a language task's bits per
    byte at its training length): what a sweep chooses its grid point by."""
    state_sizes: tuple[StateSize | None, ...] = ()
    """The decoding state at each scored task's length (`scored_state_sizes`)."""
    lengths: tuple[LengthAccuracy, ...] = ()
    """The model scored on its task at each further evaluation length (`score_lengths`)."""


@dataclasses.dataclass(frozen=True)
class LengthAccuracy:
    """One seed's model scored, unchanged, on its task at another length."""

    length: int
    accuracy: float | None = None
    majority: float | None = None
    scored: int = 0
    failure: FailureFields | None = None
    """`failure_fields` of why it was not scored (None when it was)."""


def score_lengths(
    model: TransformerClassifier, task: Task, lengths: Sequence[int], seed: int, device: str
) -> tuple[LengthAccuracy, ...]:
    """Accuracy of the trained `model` on `task.at_length(n)`'s test split of `seed` at
    each length n (MQAR: proportionally more pairs). A length past the variant's declared
    limit is `unsupported`, any other failure that length's `error`: the rest stand."""
    found = []
    for length in lengths:
        try:
            refuse_beyond_limit(model, length)
            data = task.at_length(length).test_split(seed)
            accuracy = evaluate(model, data, device=device)
            scored = int((data.labels != IGNORE).sum())
            found.append(LengthAccuracy(length, accuracy, majority_rate(data), scored))
        except Exception as error:  # one length's failure is its row's, not the model's
            found.append(LengthAccuracy(length, failure=failure_fields(error)))
    return tuple(found)


def train_seed(
    registry: Registry, prepared: Prepared, seed: int, progress: Progress | None = None
) -> SeedResult:
    """Draw the seed's data, initialise its model, train it on each curriculum stage and
    then on the task, and score it on the test split of each."""
    job, config = prepared.job, prepared.model
    torch.manual_seed(seed)
    model = build_model(config, registry).to(job.device, job.dtype)
    tests, train_time_s = [], 0.0
    for task, schedule in (*prepared.stages, (prepared.task, prepared.training)):
        # No more examples than the schedule draws (nor fewer than a test split): a short
        # stage of a task sized for one long pass would generate thousands it never sees.
        drawn = max(schedule.steps * schedule.batch_size, task.num_test)
        train_data, test_data = task.split(seed, num_train=min(task.num_train, drawn))
        result = train(
            model,
            train_data,
            schedule,
            seed=seed,
            device=job.device,
            progress=progress,
            description=f"{config.variant} on {task.label}, seed {seed}",
        )
        tests.append(test_data)
        train_time_s += result.train_time_s
    *stage_tests, test_data = tests
    weights = (
        {name: value.detach().cpu().clone() for name, value in model.state_dict().items()}
        if job.keep_weights
        else None
    )
    trained = SeedResult(
        accuracy=None,
        majority=None,
        train_time_s=train_time_s,
        final_train_loss=statistics.fmean(result.losses[-20:]),
        model=describe(model),
        weights=weights,
        learned=learned_summaries(model),
        state_sizes=scored_state_sizes(model, [*(t for t, _ in prepared.stages), prepared.task]),
    )
    task = prepared.task
    if isinstance(task, LanguageTask):
        schedule = prepared.training
        positions = schedule.steps * schedule.batch_size * task.seq_len
        language = score_language(
            model,
            task,
            evaluation_lengths(task.seq_len, job.eval_lengths),
            tokens_per_s=positions / max(result.train_time_s, 1e-9),
            device=job.device,
        )
        return dataclasses.replace(
            trained, language=language, validation=language.validation_bits_per_byte
        )
    return dataclasses.replace(
        trained,
        lengths=score_lengths(
            model, task, evaluation_lengths(task.seq_len, job.eval_lengths)[1:], seed, job.device
        ),
        validation=evaluate(model, task.validation_split(seed), device=job.device),
        accuracy=evaluate(model, test_data, device=job.device),
        majority=majority_rate(test_data),
        scored=int((test_data.labels != IGNORE).sum()),
        stage_scores=tuple(
            (evaluate(model, data, device=job.device), majority_rate(data)) for data in stage_tests
        ),
    )


def row_fields(
    prepared: Prepared, seeds: Sequence[int], results: Sequence[SeedResult]
) -> TaskOutcome:
    """The result row's accuracy fields: mean, 95% half-width and std over seeds, each
    seed's value, and what they came from. After a curriculum, also "curriculum" (each
    stage's task, steps and batch size, the task last) and "stages": each stage's own
    scored fields, which the runner records as a row of its own."""
    model = prepared.model
    shape = {"d_model": model.d_model, "num_heads": model.num_heads, "num_layers": model.num_layers}
    curriculum = bool(prepared.stages)
    common: TaskFields = {
        "seeds": list(seeds),
        "final_train_loss": statistics.fmean(result.final_train_loss for result in results),
        "train_time_s": statistics.fmean(result.train_time_s for result in results),
        "model": results[-1].model,
        "steps": prepared.training.steps,
        "batch_size": prepared.training.batch_size,
    }
    if any(result.learned for result in results):  # per seed, in the order of "seeds"
        common["learned_per_seed"] = [result.learned for result in results]
    common = {**common, **validation_fields(prepared.task, results)}

    def identity(task: Task) -> TaskIdentity:
        """Which task the row scores, labelled with the model settings it trained with."""
        label = training_label(
            task.label,
            curriculum=curriculum,
            positional_encoding=model.positional_encoding,
            architecture=model.architecture,
            grid=prepared.job.grid,
            **shape,
        )
        sweep: TaskIdentity = {
            "grid": dict(prepared.job.grid),
            "sweep": sweep_label(label, prepared.job.grid),
        }
        return {
            "task": task.name,
            "task_options": dataclasses.asdict(task.options),
            "task_label": label,
            **(sweep if prepared.job.grid else {}),
        }

    task = prepared.task
    if isinstance(task, LanguageTask):
        scores = [result.language for result in results if result.language is not None]
        return {**identity(task), **common, **language_fields(task, seeds, scores)}

    def scored(
        task: Task,
        training: TrainConfig,
        scores: Sequence[tuple[float, float]],
        predictions: int | None = None,
    ) -> AccuracyScores:
        accuracies = [accuracy for accuracy, _ in scores]
        low, high = proportion_interval(accuracies, predictions) or (None, None)
        return {
            **identity(task),
            "accuracy_mean": statistics.fmean(accuracies),
            "accuracy_ci95": interval_half_width(accuracies),
            "accuracy_ci95_low": low,
            "accuracy_ci95_high": high,
            "accuracy_scored": predictions,
            "accuracy_std": statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0,
            "accuracy_per_seed": accuracies,
            "chance": task.chance,
            "majority_baseline": statistics.fmean(majority for _, majority in scores),
            "steps": training.steps,
            "batch_size": training.batch_size,
        }

    def at_length(length: int, scores: Sequence[LengthAccuracy]) -> LengthFields:
        """The fields of the row at another length: the scaled task's scores under the
        trained one's label, " at n=<length>" added (a task of its own in the tables)."""
        trained = identity(task)
        suffix = f" at n={length}"
        where: LengthFields = {"eval_length": length, "task_label": trained["task_label"] + suffix}
        if "sweep" in trained:
            where["sweep"] = trained["sweep"] + suffix
        failure = first_seed_failure(zip(seeds, (s.failure for s in scores), strict=True))
        if failure is not None:
            return {**where, **failure}
        counts = {score.scored for score in scores}
        pairs = [(score.accuracy, score.majority) for score in scores]
        fields = scored(
            task.at_length(length),
            prepared.training,
            typing.cast(list[tuple[float, float]], pairs),
            counts.pop() if len(counts) == 1 else None,
        )
        return {**fields, **where, "status": "ok", "error": None}

    accuracies: list[tuple[float, float]] = []
    for result in results:
        assert result.accuracy is not None and result.majority is not None, "an accuracy seed"
        accuracies.append((result.accuracy, result.majority))
    predictions = {result.scored for result in results}
    test_scores = scored(
        prepared.task,
        prepared.training,
        accuracies,
        predictions.pop() if len(predictions) == 1 else None,  # seeds' test sets agree
    )
    sizes = [result.state_sizes for result in results]
    fields: TaskOutcome = {**test_scores, **common, **state_fields(sizes, -1)}
    if prepared.job.eval_lengths:  # one row per further length, as a language task's
        fields = {**fields, "train_length": task.seq_len, "eval_length": task.seq_len}
        fields["evaluations"] = [
            at_length(each, [result.lengths[index] for result in results])
            for index, each in enumerate(
                evaluation_lengths(task.seq_len, prepared.job.eval_lengths)[1:]
            )
        ]
    if curriculum:
        phases = (*prepared.stages, (prepared.task, prepared.training))
        fields["curriculum"] = [
            {"task_label": task.label, "steps": training.steps, "batch_size": training.batch_size}
            for task, training in phases
        ]
        fields["stages"] = [
            {
                **scored(task, training, [result.stage_scores[index] for result in results]),
                **state_fields(sizes, index),
            }
            for index, (task, training) in enumerate(prepared.stages)
        ]
    return fields


def validation_fields(task: Task, results: Sequence[SeedResult]) -> TaskFields:
    """The seeds' scores on the validation split, in the task's metric (`validation_metric`):
    a sweep picks its grid point by their mean, and the test scores stay for the report.
    None of them when a seed has none (a result from before validation was scored)."""
    values = [result.validation for result in results]
    if any(value is None for value in values):
        return {}
    scores = typing.cast(list[float], values)
    return {
        "validation_metric": task.metric,
        "validation_mean": statistics.fmean(scores),
        "validation_ci95": interval_half_width(scores),
        "validation_per_seed": scores,
    }
