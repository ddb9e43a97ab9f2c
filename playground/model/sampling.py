"""Greedy continuation of a byte prompt by a trained causal model, for a reader to see what
a bits-per-byte figure means.

Each new byte re-runs the full forward over the context (at most the model's training
length, the last bytes kept): simple and exact, and cheap at the few dozen bytes a report
shows.
"""

from __future__ import annotations

import torch

from playground.model.transformer import TransformerClassifier


@torch.no_grad()
def greedy_continuation(
    model: TransformerClassifier, prompt: bytes, new_bytes: int, *, device: str = "cpu"
) -> bytes:
    """The `new_bytes` bytes that `model` predicts most likely after `prompt`, one at a time."""
    model.eval()
    context = list(prompt) or [ord("\n")]
    made: list[int] = []
    window = model.config.max_seq_len
    for _ in range(new_bytes):
        tokens = torch.tensor([context[-window:]], dtype=torch.long, device=device)  # (1, n)
        logits = model(tokens)[0, -1]  # (256,): the next byte's scores
        byte = int(logits.argmax())
        context.append(byte)
        made.append(byte)
    return bytes(made)
