"""Vanilla multi-head attention: Vaswani et al. 2017, "Attention Is All You Need", §3.2.

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V                      (§3.2.1, eq. 1)
    MultiHead(Q, K, V) = Concat(head_1, …, head_h) W^O,
        head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)                 (§3.2.2)

with h = 8 heads and d_model = 512 by default, so d_k = d_v = 64.

`impl="reference"` follows that math line by line. `impl="fast"` calls
`torch.nn.functional.scaled_dot_product_attention`, which dispatches to fused kernels
(flash / memory-efficient on CUDA, a flash-style kernel on CPU) that never materialise the
(n × n) score matrix. SDPA does not return the probabilities, so a `need_weights=True`
call runs the reference (the core does that for every variant whose fast path returns no
weights; O(n²) memory for that call only).

Decoding keeps every key and value (a key/value cache, allocated once when the length is
known): a new token's query attends over the cache with one fused SDPA call, reading each
kept key and value once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import playground
from playground import AttentionOutput, AttentionVariant, Capabilities, VariantConfig
from playground.decoding import cached_attention
from playground.heads import (
    add_projections,
    attention_flops,
    prefill_key_value_cache,
    project_heads,
    project_output,
    projection_flops,
)
from playground.masks import allowed_keys, empty_query_rows, masked_softmax


@dataclass(frozen=True)
class VanillaConfig(VariantConfig):
    bias: bool = True
    """Add a bias to the q/k/v/out projections (nn.MultiheadAttention's default)."""
    dropout: float = 0.0
    """Dropout on the attention probabilities, in training mode only (paper: 0.1)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1); got {self.dropout}")


class VanillaAttention(AttentionVariant):
    name = "vanilla"
    summary = "Exact softmax multi-head attention; fast path is fused SDPA."
    paper = "Vaswani et al. 2017, Attention Is All You Need, §3.2"
    Config = VanillaConfig
    colour = "#1f77b4"  # blue, in every figure
    capabilities = Capabilities(
        causal=True,
        padding_mask=True,
        cross_attention=True,
        need_weights=True,
        dtypes=(torch.float32, torch.float64, torch.bfloat16, torch.float16),
    )

    @staticmethod
    def flops(n_q: int, n_k: int, d_model: int, num_heads: int, **options: object) -> float:
        return projection_flops(n_q, n_k, d_model) + attention_flops(n_q * n_k, d_model)

    def __init__(self, d_model: int = 512, num_heads: int = 8, **options: object) -> None:
        super().__init__(d_model, num_heads, **options)
        add_projections(self, d_model, bias=self.config.bias)  # W^Q, W^K, W^V, W^O

    def forward_reference(
        self, query, key, value, attention_mask, is_causal, need_weights
    ) -> AttentionOutput:
        q, k, v = project_heads(self, query, key, value)  # (B, H, N, d_k)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, Nq, Nk)
        allowed = allowed_keys(attention_mask, q.shape[2], k.shape[2], is_causal, q.device)
        # -inf (not the usual -1e9) so masked keys get exactly 0 and a row with no key
        # left is all zeros rather than uniform over padding.
        weights = masked_softmax(scores, allowed)  # (B, H, Nq, Nk)
        mixed = F.dropout(weights, self.config.dropout, self.training) @ v  # (B, H, Nq, d_v)
        output = project_output(self, mixed, empty_query_rows(allowed))  # (B, Nq, d_model)
        return AttentionOutput(output, weights if need_weights else None)

    def forward_fast(
        self, query, key, value, attention_mask, is_causal, need_weights
    ) -> AttentionOutput:
        q, k, v = project_heads(self, query, key, value)
        dropout = self.config.dropout if self.training else 0.0
        if attention_mask is None:
            # is_causal lets SDPA pick its causal flash kernel without building a mask.
            mixed = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=is_causal)
            return AttentionOutput(project_output(self, mixed, None), None)
        allowed = allowed_keys(attention_mask, q.shape[2], k.shape[2], is_causal, q.device)
        mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout)
        return AttentionOutput(project_output(self, mixed, empty_query_rows(allowed)), None)

    # --- decoding: a key/value cache ---------------------------------------------------
    prefill_state = prefill_key_value_cache  # the prompt's outputs; its k and v cached

    def step_state(self, token, state):
        q, k, v = project_heads(self, token, token, token)  # (B, H, 1, d)
        state.append(keys=k, values=v)
        kept = state.kept_entries()
        allowed = state.kept_real()[:, None, None, :]  # (B, 1, 1, L): padding is not seen
        context, empty = cached_attention(
            q, kept["keys"], kept["values"], allowed, self.head_dim**-0.5
        )
        return project_output(self, context, empty)

    # --- on heads projected elsewhere (playground.hf): exact attention -------------------
    def attend_heads(self, q, k, v, allowed, *, scale, q_idx, kv_idx, dropout=0.0):
        """Exact softmax attention (eq. 1) on another model's q, k and v: one fused call."""
        return cached_attention(q, k, v, allowed, scale, dropout)[0]


@playground.hookimpl
def register_attention(register):
    register(VanillaAttention)
