"""Shared parts of the variants' decoding tests: a state decoded in place, and the largest
allocation of one step. Decoding's parity with the forward is the contract suite's
(playground.testing.decoding_checks), run for every shipped variant."""

from __future__ import annotations

import torch
from torch.profiler import profile

from playground import AttentionVariant
from playground.decoding import DecodingState
from playground.testing.decoding_checks import held_bytes


@torch.no_grad()
def decoded_in_place(
    module: AttentionVariant, batch: int = 2, prompt: int = 5, length: int = 12
) -> DecodingState:
    """The state after prefilling `prompt` random tokens into a state for `length` and
    decoding up to it: its tensors stay where prefill allocated them (the steps write into
    them), and it reports the bytes it holds."""
    dtype = next(module.parameters()).dtype
    x = torch.randn(batch, length, module.d_model, dtype=dtype)
    _, state = module.prefill(x[:, :prompt], max_length=length)
    storages = {t.untyped_storage().data_ptr() for t in state.tensors()}
    for t in range(prompt, length):
        module.decode_step(x[:, t : t + 1], state)
    assert {t.untyped_storage().data_ptr() for t in state.tensors()} == storages
    assert state.nbytes == held_bytes(state)
    return state


@torch.no_grad()
def largest_allocation_of_a_step(module: AttentionVariant, context: int) -> tuple[int, int]:
    """(bytes of the largest allocation of any op in one step after `context` tokens,
    the state's bytes), float32."""
    x = torch.randn(1, context + 1, module.d_model)
    _, state = module.prefill(x[:, :context], max_length=context + 1)
    with profile(profile_memory=True) as profiled:
        module.decode_step(x[:, context:], state)
    return max(event.cpu_memory_usage for event in profiled.events()), state.nbytes
