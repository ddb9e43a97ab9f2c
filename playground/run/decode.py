"""The decode pass: what one generated token costs a variant at a context length.

`prefilled` starts a variant's decoding state from a random prompt of the context length,
as the runner's decode pass and `playground info` do, so both read the state's own bytes.
"""

from __future__ import annotations

import torch

from playground.contract import AttentionVariant
from playground.decoding import DecodingState


@torch.no_grad()
def prefilled(
    module: AttentionVariant,
    length: int,
    *,
    batch: int = 1,
    extra_tokens: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> DecodingState:
    """`module`'s decoding state after a random prompt of `length` tokens, sized for
    `extra_tokens` more (its max_length)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    prompt = torch.randn(
        batch, length, module.d_model, generator=generator, dtype=dtype, device=device
    )
    return module.prefill(prompt, max_length=length + extra_tokens)[1]
