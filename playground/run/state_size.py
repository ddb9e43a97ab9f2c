"""What a trained model keeps per sequence to decode at a length: the x axis of recall
against state size (Zoology, Arora et al. 2023, Fig. 2; Based, Arora et al. 2024, Fig. 1).

`state_size(model, seq_len)` prefills each attention layer of the model with one random
sequence of exactly `seq_len` tokens, its state allocated for that many (`max_length`),
and adds up the layers' `DecodingState.nbytes`: a key/value cache's slots (and its
one-byte "real token" flags), a sliding window's rolling buffer, a recurrent state. The
state is the attention layers' own, so the model's read-out (its target) does not change
it and the layers are prefilled directly.

A model that cannot decode (bidirectional, or a variant that declares no decoding) has no
such state; it is placed by the key/value bytes exact attention would keep for it,
2 · layers · L · d_model · element size, and its source says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from playground.decoding import RecomputeState
from playground.model.transformer import TransformerClassifier
from playground.run.row_schema import StateFields
from playground.tasks import Task

DECODING_STATE = "decoding state"
RECOMPUTED_INPUTS = "decoding state (inputs kept, attention recomputed at each step)"
"""A variant on the core's default decoding keeps its inputs, not a cache
(`playground.decoding.RecomputeState`): real bytes, but not a cache's or a recurrence's."""
KEY_VALUE_BYTES = "key/value bytes (no decoding state)"


@dataclasses.dataclass(frozen=True)
class StateSize:
    """Bytes a model keeps per sequence to decode at `seq_len` tokens, and what they are."""

    seq_len: int
    bytes: int
    source: str
    """DECODING_STATE, RECOMPUTED_INPUTS or KEY_VALUE_BYTES."""


def key_value_bytes(model: TransformerClassifier, seq_len: int) -> int:
    """Exact attention's cache for this model: keys and values, d_model each per token
    and layer, in the model's element size."""
    config = model.config
    element = next(model.parameters()).element_size()
    return 2 * config.num_layers * seq_len * config.d_model * element


@torch.no_grad()
def state_size(model: TransformerClassifier, seq_len: int) -> StateSize:
    """The decoding state per sequence at exactly `seq_len` tokens, summed over layers,
    or the key/value bytes when the model cannot decode (see the module docstring)."""
    if not model.config.causal:  # a bidirectional model's outputs change with later tokens
        return StateSize(seq_len, key_value_bytes(model, seq_len), KEY_VALUE_BYTES)
    parameter = next(model.parameters())
    generator = torch.Generator(device=parameter.device).manual_seed(0)
    was_training = model.training
    model.eval()  # a variant that redraws features in training keeps its eval ones here
    try:
        states = []
        for attention in model.attentions:
            prompt = torch.randn(
                1,
                seq_len,
                model.config.d_model,
                generator=generator,
                dtype=parameter.dtype,
                device=parameter.device,
            )  # (1, L, d_model): a state's size depends on the length, not the values
            states.append(attention.prefill(prompt, max_length=seq_len)[1])
    except NotImplementedError:  # UnsupportedFeature is one: no decoding declared
        return StateSize(seq_len, key_value_bytes(model, seq_len), KEY_VALUE_BYTES)
    finally:
        model.train(was_training)
    recomputed = any(isinstance(state, RecomputeState) for state in states)
    source = RECOMPUTED_INPUTS if recomputed else DECODING_STATE
    return StateSize(seq_len, sum(state.nbytes for state in states), source)


def scored_state_sizes(
    model: TransformerClassifier, tasks: Sequence[Task]
) -> tuple[StateSize | None, ...]:
    """The state at each scored task's length (None for a task that is not causal), or ()
    when none is causal: a bidirectional task's row says nothing about decoding."""
    if not any(task.needs_causal for task in tasks):
        return ()
    return tuple(state_size(model, task.seq_len) if task.needs_causal else None for task in tasks)


def state_fields(per_seed: Sequence[Sequence[StateSize | None]], index: int) -> StateFields:
    """A row's `state_bytes` and `state_source`: the first seed's size at the scored task
    `index` (`scored_state_sizes`' order; the seeds agree, as the state depends on the
    model's shape, not its weights). Both None for a task that is not causal (a curriculum
    stage's row must not keep the task's), none at all when no seed measured a state."""
    sizes = [sizes[index] for sizes in per_seed if sizes]
    if not sizes:
        return {}
    size = sizes[0]
    return {
        "state_bytes": None if size is None else size.bytes,
        "state_source": None if size is None else size.source,
    }
