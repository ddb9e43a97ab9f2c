"""A tiny transformers Llama with a variant swapped in, in the calling convention of the
playground's own model, so that the runner trains, scores and samples it unchanged
(`architecture = "hf_llama"` in a spec's task table).

The Llama has the playground model's width, depth, heads and vocabulary, Llama's own
feed-forward width rule (SwiGLU, about 8/3 · d_model, rounded up to a multiple of 64: that
of the 7B config scaled down), RMSNorm, rotary positions (kept for a variant that does not
encode positions itself, see `swap.py`), no dropout and untied embeddings. Its attention
is the variant's module in every layer (`swap_attention`), so what differs between two
rows is the attention alone.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from playground.contract import AttentionVariant
from playground.hf.library import require
from playground.hf.swap import SwapReport, swap_attention
from playground.hf.swapped import SwappedAttention

FEED_FORWARD_MULTIPLE = 64
"""Llama rounds its SwiGLU width up to a multiple of this (256 at 7B scale)."""


def feed_forward_width(d_model: int) -> int:
    """Llama's SwiGLU hidden width for d_model: 2/3 of 4 · d_model, rounded up."""
    width = int(2 * 4 * d_model / 3)
    return -(-width // FEED_FORWARD_MULTIPLE) * FEED_FORWARD_MULTIPLE


class LlamaLanguageModel(nn.Module):
    """`config` is the playground's ModelConfig (its vocabulary, width, heads, layers,
    variant and options; read by the runner's rows too); `cls` the variant's class."""

    def __init__(self, config: Any, cls: type[AttentionVariant]) -> None:
        super().__init__()
        transformers = require()
        self.config = config
        self.shared: tuple[str, ...] = ()
        self.positional_encoding = None  # the Llama's own rotary positions, in its layers
        llama = transformers.LlamaConfig(
            vocab_size=config.vocab_size,
            hidden_size=config.d_model,
            intermediate_size=feed_forward_width(config.d_model),
            num_hidden_layers=config.num_layers,
            num_attention_heads=config.num_heads,
            num_key_value_heads=config.num_heads,
            max_position_embeddings=max(config.max_seq_len, 2048),
            tie_word_embeddings=False,
        )
        self.llama = transformers.LlamaForCausalLM(llama)
        options = cls.fit_options(dict(config.variant_options), config.max_seq_len)
        self.swap: SwapReport = swap_attention(self.llama, cls, **options)

    @property
    def attentions(self) -> list[AttentionVariant]:
        return [m.variant for m in self.llama.modules() if isinstance(m, SwappedAttention)]

    def forward(
        self,
        tokens: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits (B, L, vocab) of tokens (B, L); only those at `positions` (B, L) bool,
        (P, vocab), when given."""
        logits = self.llama(input_ids=tokens, attention_mask=attention_mask, use_cache=False).logits
        return logits if positions is None else logits[positions]

    @torch.no_grad()
    def prefill(
        self,
        tokens: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        max_length: int | None = None,
    ) -> tuple[torch.Tensor, LlamaState]:
        """Logits of a prompt (B, P) and the state for `decode_step`: HF's cache, holding
        each layer's decoding state (`swap.py`)."""
        transformers = require()
        cache = transformers.DynamicCache(config=self.llama.config)
        mask = torch.ones_like(tokens) if attention_mask is None else attention_mask.long()
        logits = self.llama(input_ids=tokens, attention_mask=mask, cache=cache, use_cache=True)
        return logits.logits, LlamaState(cache, mask)

    @torch.no_grad()
    def decode_step(self, token: torch.Tensor, state: LlamaState) -> torch.Tensor:
        """Logits (B, 1, vocab) of the next token (B, 1) of every sequence."""
        state.mask = torch.cat([state.mask, torch.ones_like(token)], dim=1)
        output = self.llama(
            input_ids=token, attention_mask=state.mask, cache=state.cache, use_cache=True
        )
        return output.logits


class LlamaState:
    """HF's cache (with each swapped layer's decoding state on it) and the attention mask
    so far (B, length)."""

    def __init__(self, cache: Any, mask: torch.Tensor) -> None:
        self.cache = cache
        self.mask = mask
