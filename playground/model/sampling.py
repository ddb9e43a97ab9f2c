"""Generation by a trained causal model, one token at a time through its decoding state
(`TransformerClassifier.prefill` / `decode_step`): each new token costs one step of every
layer's cache or recurrent state, not a forward over the whole context.
"""

from __future__ import annotations

from typing import Any

import torch

from playground.decoding import left_aligned
from playground.errors import ConfigError
from playground.model.transformer import TransformerClassifier


@torch.no_grad()
def generate(
    model: TransformerClassifier,
    prompt: torch.Tensor,
    max_new_tokens: int,
    *,
    attention_mask: torch.Tensor | None = None,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """The `max_new_tokens` tokens (B, max_new_tokens) that follow `prompt` (B, P) int64,
    padded on either side as `attention_mask` (B, P) bool says: each sequence goes on
    from its last real token, as it would alone. A model whose positions are relative
    (its variant encodes them) or absent decodes the batch at the positions of the
    left-padded batch (see `TransformerClassifier.prefill`), which gives each sequence
    what it gives alone; one with absolute (sinusoidal) positions would shift a shorter
    prompt's positions by its padding there, so its prompts of each length are decoded
    as a batch of their own, unpadded. Greedy (the most likely token) at temperature 0;
    otherwise drawn from softmax(logits / temperature), among the `top_k` most likely
    when given, with `generator`. Puts the model in eval mode (no dropout)."""
    if prompt.dim() != 2 or prompt.shape[1] == 0:
        raise ConfigError(
            f"prompt must be (batch, length ≥ 1) token ids; got {tuple(prompt.shape)}"
        )
    if max_new_tokens < 0 or temperature < 0 or (top_k is not None and top_k < 1):
        raise ConfigError(
            f"max_new_tokens and temperature must be ≥ 0 and top_k ≥ 1; got {max_new_tokens}, "
            f"{temperature}, {top_k}"
        )
    model.eval()
    if attention_mask is not None and model.positional_encoding is not None:
        lengths = attention_mask.bool().sum(dim=1)  # (B,) real tokens
        if bool((lengths != lengths[0]).any()):
            return _by_length(
                model,
                prompt,
                attention_mask.bool(),
                lengths,
                max_new_tokens,
                temperature=temperature,
                top_k=top_k,
                generator=generator,
            )
    logits, state = model.prefill(
        prompt, attention_mask, max_length=prompt.shape[1] + max_new_tokens
    )
    last = prompt.new_full((prompt.shape[0],), prompt.shape[1] - 1)  # each last real token
    if attention_mask is not None:
        last -= attention_mask.flip(1).long().argmax(dim=1)  # right padding after it
    logits = logits[torch.arange(prompt.shape[0]), last][:, None]  # (B, 1, C)
    made = []
    for step in range(max_new_tokens):
        token = _choose(logits[:, -1], temperature, top_k, generator)[:, None]  # (B, 1)
        made.append(token)
        if step + 1 < max_new_tokens:
            logits = model.decode_step(token, state)
    if not made:
        return prompt.new_zeros(prompt.shape[0], 0)
    return torch.cat(made, dim=1)


def _by_length(
    model: TransformerClassifier,
    prompt: torch.Tensor,
    real: torch.Tensor,
    lengths: torch.Tensor,
    max_new_tokens: int,
    **sampling: Any,
) -> torch.Tensor:
    """`generate` for prompts of different lengths (real (B, P) bool, lengths (B,)) under
    absolute positions: each length's prompts as one unpadded batch, so every prompt's
    first real token is at position 0, as when it is alone."""
    left_aligned(real)  # refuses padding between real tokens
    if bool((lengths == 0).any()):
        row = int((lengths == 0).nonzero()[0, 0])
        raise ConfigError(f"sequence {row} of the prompt has no real token to continue from")
    made = prompt.new_zeros(prompt.shape[0], max_new_tokens)
    for length in lengths.unique().tolist():
        rows = (lengths == length).nonzero().flatten()
        group = prompt[rows][real[rows]].view(len(rows), length)  # (rows, length)
        made[rows] = generate(model, group, max_new_tokens, **sampling)
    return made


def _choose(
    logits: torch.Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None
) -> torch.Tensor:
    """(B,) the next token of each sequence from its logits (B, C)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probabilities = (logits.float() / temperature).softmax(dim=-1)
    return torch.multinomial(probabilities, 1, generator=generator)[:, 0]


def continue_bytes(
    model: TransformerClassifier, prompt: bytes, new_bytes: int, *, device: str = "cpu"
) -> bytes:
    """The `new_bytes` bytes a byte-level model predicts most likely after `prompt` (a
    newline when the prompt is empty), for a reader to see what bits per byte mean.

    The prompt keeps its last bytes that leave room for the new ones within the model's
    training length (at least one), so the continuation is read at lengths it was
    trained at whenever `new_bytes` allows."""
    kept = max(1, model.config.max_seq_len - new_bytes)
    context = list(prompt[-kept:]) or [ord("\n")]
    tokens = torch.tensor([context], dtype=torch.long, device=device)  # (1, P)
    return bytes(generate(model, tokens, new_bytes)[0].tolist())
