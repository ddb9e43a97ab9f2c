"""Generation by a trained causal model, one token at a time through its decoding state
(`TransformerClassifier.prefill` / `decode_step`): each new token costs one step of every
layer's cache or recurrent state, not a forward over the whole context.
"""

from __future__ import annotations

import torch

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
    from its last real token, at the positions of the left-padded batch (see
    `TransformerClassifier.prefill`). Greedy (the most likely token) at temperature 0;
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
