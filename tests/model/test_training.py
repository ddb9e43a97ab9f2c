"""The training loop: the schedule, a tiny run per task that beats chance within seconds
(it guards the loop, not the final accuracy), and measure_accuracy's row."""

from __future__ import annotations

import itertools

import pytest
import torch

from playground.errors import ConfigError, UnknownVariant
from playground.model.training import (
    TrainConfig,
    evaluate,
    learning_rate_factor,
    majority_rate,
    train,
)
from playground.model.transformer import ModelConfig, TransformerClassifier
from playground.registry import Registry
from playground.run.accuracy import measure_accuracy
from playground.run.jobs import AccuracyJob
from playground.tasks import Task
from playground.tasks.listops import ListOps
from playground.tasks.mqar import MQAR
from playground.tasks.positional import Lookback


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread (and do not fight a busy machine for two)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_learning_rate_warms_up_then_decays_to_zero() -> None:
    factors = [learning_rate_factor(step, 100, 0.1) for step in range(100)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in itertools.pairwise(factors[9:]))
    assert factors[-1] < 0.01


@pytest.mark.parametrize(
    ("task", "steps", "margin"),
    [
        # Two pairs, eight values: even "one of the two values in the sequence" is 4 × chance.
        (MQAR(seq_len=12, num_pairs=2, vocab_size=18), 150, 2.0),
        (Lookback(seq_len=12, offset=2, vocab_size=8), 120, 2.0),
        (ListOps(min_length=4, max_length=12, max_depth=3, max_args=3), 150, 1.5),
    ],
    ids=lambda value: getattr(value, "name", str(value)),
)
def test_a_tiny_vanilla_run_beats_chance(
    bundled_registry: Registry, task: Task, steps: int, margin: float
) -> None:
    train_data, test_data = task.split(seed=0, num_train=2048, num_test=256)
    torch.manual_seed(0)
    config = ModelConfig(
        vocab_size=task.vocab_size,
        num_classes=task.num_classes,
        max_seq_len=task.seq_len,
        variant="vanilla",
        d_model=32,
        num_heads=2,
        target=task.target,
    )
    model = TransformerClassifier(config, bundled_registry)
    result = train(model, train_data, TrainConfig(steps=steps, batch_size=32), seed=0)
    accuracy = evaluate(model, test_data)
    baseline = max(task.chance, majority_rate(test_data))
    assert accuracy > margin * baseline, (accuracy, baseline)
    assert sum(result.losses[-10:]) < sum(result.losses[:10])


def test_measure_accuracy_returns_the_row_fields(bundled_registry: Registry) -> None:
    job = AccuracyJob(
        "t5_relative",
        {"num_buckets": 8, "max_distance": 8},
        "lookback",
        {"seq_len": 12, "offset": 2, "vocab_size": 8},
        steps=5,
        d_model=16,
        num_heads=2,
        num_layers=1,
    )
    row = measure_accuracy(bundled_registry, job, seeds=[0, 1])
    assert row["task"] == "lookback" and row["steps"] == 5
    assert (
        row["task_label"]
        == "lookback(seq_len=12, offset=2, vocab_size=8) d_model=16 num_heads=2 num_layers=1"
    )
    assert row["task_options"] == {"seq_len": 12, "offset": 2, "vocab_size": 8}
    assert len(row["accuracy_per_seed"]) == 2 and row["seeds"] == [0, 1]
    assert row["accuracy_mean"] == pytest.approx(sum(row["accuracy_per_seed"]) / 2)
    assert row["accuracy_std"] >= 0 and row["train_time_s"] > 0
    assert row["chance"] == pytest.approx(1 / 7)
    assert row["model"]["shared_across_layers"] == []  # one layer: nothing to share with
    # the proportion interval is recorded with the held-out predictions it rests on
    from playground.run.stats import proportion_interval

    assert row["accuracy_scored"] > 0
    interval = proportion_interval(row["accuracy_per_seed"], row["accuracy_scored"])
    assert (row["accuracy_ci95_low"], row["accuracy_ci95_high"]) == interval


def test_measure_accuracy_is_repeatable_for_a_seed(bundled_registry: Registry) -> None:
    def run() -> float:
        job = AccuracyJob(
            "vanilla", {}, "lookback", {"seq_len": 12, "offset": 2},
            steps=5, d_model=16, num_heads=2, num_layers=1,
        )  # fmt: skip
        return measure_accuracy(bundled_registry, job, seeds=[3])["accuracy_mean"]

    assert run() == run()


def test_measure_accuracy_errors_name_the_problem(bundled_registry: Registry) -> None:
    with pytest.raises(UnknownVariant, match="task"):
        measure_accuracy(bundled_registry, AccuracyJob("vanilla", {}, "mqr", {}, steps=1))
    with pytest.raises(ConfigError, match="num_pairs"):
        measure_accuracy(
            bundled_registry, AccuracyJob("vanilla", {}, "mqar", {"num_pairs": 99}, steps=1)
        )


def test_a_diverging_run_is_invalid_naming_the_non_finite_loss(
    bundled_registry: Registry,
) -> None:
    """A learning rate that blows the weights up: not an `ok` row with accuracy 0, but
    InvalidOutput (recorded `invalid`) naming the loss and the step."""
    from playground.errors import InvalidOutput, failure_fields

    job = AccuracyJob(
        "vanilla", {}, "lookback", {"seq_len": 12, "offset": 2},
        steps=6, d_model=16, num_heads=2, num_layers=1, learning_rate=1e30,
    )  # fmt: skip
    pattern = r"diverged: the loss is (nan|inf) at step \d of 6"
    with pytest.raises(InvalidOutput, match=pattern) as raised:
        measure_accuracy(bundled_registry, job, seeds=[0])
    assert failure_fields(raised.value)["status"] == "invalid"


def test_a_batch_larger_than_the_data_is_refused_at_run_time(bundled_registry: Registry) -> None:
    """The spec refuses it; a direct caller of `train` gets the same clear error instead
    of every step silently training on everything."""
    task = Lookback(seq_len=12, offset=2, vocab_size=8)
    train_data, _ = task.split(seed=0, num_train=16, num_test=4)
    config = ModelConfig(
        vocab_size=task.vocab_size, num_classes=task.num_classes, max_seq_len=task.seq_len,
        variant="vanilla", d_model=16, num_heads=2, target=task.target,
    )  # fmt: skip
    model = TransformerClassifier(config, bundled_registry)
    with pytest.raises(ConfigError, match=r"batch_size 32 is more than the 16 training examples"):
        train(model, train_data, TrainConfig(steps=1, batch_size=32), seed=0)
    train(model, train_data, TrainConfig(steps=1, batch_size=16), seed=0)  # at most: fine
