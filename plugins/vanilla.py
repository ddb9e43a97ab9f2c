"""Vanilla multi-head attention: Vaswani et al. 2017, "Attention Is All You Need", §3.2.

    Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V                      (§3.2.1, eq. 1)
    MultiHead(Q, K, V) = Concat(head_1, …, head_h) W^O,
        head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)                 (§3.2.2)

with h = 8 heads and d_model = 512 by default, so d_k = d_v = 64.

`impl="reference"` follows that math line by line. `impl="fast"` calls
`torch.nn.functional.scaled_dot_product_attention`, which dispatches to fused kernels
(flash / memory-efficient on CUDA, a flash-style kernel on CPU) that never materialise the
(n × n) score matrix. SDPA does not return the probabilities, so with `need_weights=True`
the fast path computes them explicitly, exactly as the reference does, and uses those same
weights for the output (O(n²) memory for that call only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

import playground
from playground import AttentionOutput, AttentionVariant, Capabilities, VariantConfig
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
        projections = 2 * (n_q + 2 * n_k + n_q) * d_model * d_model  # q, k, v, out
        scores_and_mix = 2 * 2 * n_q * n_k * d_model  # Q Kᵀ and P V, all heads together
        return float(projections + scores_and_mix)

    def __init__(self, d_model: int = 512, num_heads: int = 8, **options: object) -> None:
        super().__init__(d_model, num_heads, **options)
        bias = self.config.bias
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)  # W^Q for all heads at once
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)  # W^O

    def _project_heads(self, query, key, value):
        h = self.num_heads
        q = rearrange(self.q_proj(query), "b n (h d) -> b h n d", h=h)  # (B, H, Nq, d_k)
        k = rearrange(self.k_proj(key), "b n (h d) -> b h n d", h=h)  # (B, H, Nk, d_k)
        v = rearrange(self.v_proj(value), "b n (h d) -> b h n d", h=h)  # (B, H, Nk, d_v)
        return q, k, v

    def _merge_heads(self, context: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
        empty = empty_query_rows(allowed)  # (B, Nq, 1): queries with no key to see
        if empty is None:
            return self.out_proj(rearrange(context, "b h n d -> b n (h d)"))  # (B, Nq, d_model)
        # Such a query outputs zero, not the projection's bias. Zeroing the context too
        # keeps a kernel's NaN on those rows out of the weight gradients.
        context = context.masked_fill(empty[:, None], 0.0)
        output = self.out_proj(rearrange(context, "b h n d -> b n (h d)"))  # (B, Nq, d_model)
        return output.masked_fill(empty, 0.0)

    def forward_reference(
        self, query, key, value, attention_mask, is_causal, need_weights
    ) -> AttentionOutput:
        q, k, v = self._project_heads(query, key, value)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, Nq, Nk)
        allowed = allowed_keys(attention_mask, q.shape[2], k.shape[2], is_causal, q.device)
        # -inf (not the usual -1e9) so masked keys get exactly 0 and a row with no key
        # left is all zeros rather than uniform over padding.
        weights = masked_softmax(scores, allowed)  # (B, H, Nq, Nk)
        mixed = F.dropout(weights, self.config.dropout, self.training) @ v  # (B, H, Nq, d_v)
        return AttentionOutput(self._merge_heads(mixed, allowed), weights if need_weights else None)

    def forward_fast(
        self, query, key, value, attention_mask, is_causal, need_weights
    ) -> AttentionOutput:
        if need_weights:
            return self.forward_reference(query, key, value, attention_mask, is_causal, True)
        q, k, v = self._project_heads(query, key, value)
        dropout = self.config.dropout if self.training else 0.0
        if attention_mask is None:
            # is_causal lets SDPA pick its causal flash kernel without building a mask.
            mixed = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=is_causal)
            return AttentionOutput(self._merge_heads(mixed, None), None)
        allowed = allowed_keys(attention_mask, q.shape[2], k.shape[2], is_causal, q.device)
        mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout)
        return AttentionOutput(self._merge_heads(mixed, allowed), None)


@playground.hookimpl
def register_attention(register):
    register(VanillaAttention)
