"""The decoding state a trained model keeps per sequence (playground.run.state_size), the
x axis of recall against state size (issue 43 part 3): exact attention's cache by hand,
linear attention's fixed state, a model that cannot decode placed by its key/value bytes,
and the accuracy rows that carry it (the task's and each curriculum stage's length)."""

from __future__ import annotations

from pathlib import Path

import pytest

from playground.model.transformer import ModelConfig, TransformerClassifier
from playground.registry import Registry, default_registry
from playground.run.accuracy import measure_accuracy
from playground.run.curriculum import Stage
from playground.run.jobs import AccuracyJob
from playground.run.state_size import (
    DECODING_STATE,
    KEY_VALUE_BYTES,
    state_size,
)

FLOAT32 = 4
LAYERS, D_MODEL, HEADS = 2, 32, 4


def model(variant: str, registry: Registry | None = None, causal: bool = True, **options):
    config = ModelConfig(
        vocab_size=16,
        num_classes=16,
        max_seq_len=128,
        variant=variant,
        variant_options=options,
        d_model=D_MODEL,
        num_heads=HEADS,
        num_layers=LAYERS,
        target="token",
        causal=causal,
    )
    return TransformerClassifier(config, registry or default_registry())


@pytest.mark.parametrize("length", [10, 48])
def test_exact_attentions_state_is_its_key_value_cache_at_exactly_the_length(length: int) -> None:
    # Per layer: keys and values, d_model floats each per token, and a one-byte "real
    # token" flag per slot. 10 tokens is below a growing cache's first allocation (16
    # slots): the state must be sized for the length, not for the cache's growth.
    size = state_size(model("vanilla"), length)
    assert size.source == DECODING_STATE
    assert size.bytes == LAYERS * length * (2 * D_MODEL * FLOAT32 + 1)


def test_grouped_key_value_heads_shrink_the_cache_by_their_share() -> None:
    size = state_size(model("gqa", num_kv_heads=1), 64)
    head = D_MODEL // HEADS
    assert size.bytes == LAYERS * 64 * (2 * head * FLOAT32 + 1)


def test_a_window_keeps_only_its_tokens() -> None:
    assert state_size(model("sliding_window", window=8), 64).bytes == LAYERS * 8 * (
        2 * D_MODEL * FLOAT32 + 1
    )


def test_linear_attentions_state_is_fixed_whatever_the_length() -> None:
    # Per layer and head: S = Σ φ(k) vᵀ (d_head × d_head) and z = Σ φ(k) (d_head).
    head = D_MODEL // HEADS
    expected = LAYERS * HEADS * (head * head + head) * FLOAT32
    linear = model("linear")
    short, long = state_size(linear, 16), state_size(linear, 96)
    assert short.bytes == long.bytes == expected
    assert short.source == DECODING_STATE


def test_a_bidirectional_model_is_placed_by_its_key_value_bytes() -> None:
    size = state_size(model("vanilla", causal=False), 40)
    assert size.source == KEY_VALUE_BYTES
    assert size.bytes == 2 * LAYERS * 40 * D_MODEL * FLOAT32


NO_DECODING_PLUGIN = """
import dataclasses

import playground

Vanilla = playground.get_variant("vanilla")


class CausalWithoutDecoding(Vanilla):
    name = "causal_without_decoding"
    capabilities = dataclasses.replace(
        Vanilla.capabilities, decoding=False, decoding_hint="a later token changes its outputs"
    )


@playground.hookimpl
def register_attention(register):
    register(CausalWithoutDecoding)
"""


def test_a_variant_that_declares_no_decoding_is_placed_by_its_key_value_bytes(
    tmp_path: Path,
) -> None:
    (tmp_path / "no_decoding.py").write_text(NO_DECODING_PLUGIN)
    registry = Registry()
    registry.load_directory(tmp_path, "test")
    size = state_size(model("causal_without_decoding", registry), 40)
    assert size.source == KEY_VALUE_BYTES
    assert size.bytes == 2 * LAYERS * 40 * D_MODEL * FLOAT32


def test_measuring_keeps_the_models_mode() -> None:
    trained = model("vanilla").train()
    state_size(trained, 16)
    assert trained.training
    evaluated = model("vanilla").eval()
    state_size(evaluated, 16)
    assert not evaluated.training


def job(causal: bool, curriculum: tuple[Stage, ...] = ()) -> AccuracyJob:
    return AccuracyJob(
        "vanilla",
        {},
        "mqar",
        {"seq_len": 32, "num_pairs": 2, "vocab_size": 16, "causal": causal},
        steps=2,
        batch_size=4,
        d_model=D_MODEL,
        num_heads=HEADS,
        num_layers=LAYERS,
        curriculum=curriculum,
    )


def test_accuracy_rows_carry_the_state_at_the_task_and_each_stages_length() -> None:
    stage = Stage({"seq_len": 16}, steps=2, batch_size=4)
    fields = measure_accuracy(default_registry(), job(True, (stage,)), seeds=(0,))
    per_token = 2 * D_MODEL * FLOAT32 + 1
    assert fields["state_bytes"] == LAYERS * 32 * per_token
    assert fields["state_source"] == DECODING_STATE
    (stage_fields,) = fields["stages"]
    assert stage_fields["state_bytes"] == LAYERS * 16 * per_token
    assert stage_fields["state_source"] == DECODING_STATE


def test_a_bidirectional_tasks_rows_say_nothing_about_decoding() -> None:
    fields = measure_accuracy(default_registry(), job(False), seeds=(0,))
    assert "state_bytes" not in fields and "state_source" not in fields
