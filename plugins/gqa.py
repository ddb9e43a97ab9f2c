"""Grouped-query attention: Ainslie et al. 2023, "GQA: Training Generalized Multi-Query
Transformer Models from Multi-Head Checkpoints", §2.2; multi-query attention (one key and
value head) is Shazeer 2019, "Fast Transformer Decoding: One Write-Head is All You Need".

The H query heads share G ≤ H key/value heads, H/G queries to a group:

    head_h = softmax(Q W_h^Q (K W_g^K)ᵀ / √d) V W_g^V,    g = ⌊h / (H/G)⌋

so keys and values shrink to G·d numbers per token: what a decoder caches falls by H/G.
G = H is multi-head attention, G = 1 multi-query attention. Head h uses group h // (H/G)
as in HF Llama's `repeat_kv`.

The reference repeats each key/value head H/G times and runs exact attention; the fast
path hands the G heads to fused SDPA with `enable_gqa`, which never repeats them.
Decoding caches the G key/value heads only, and a new token's H queries read them grouped,
without repeating them: the state is G/H of exact attention's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import playground
from playground import AttentionOutput, AttentionVariant, Capabilities, VariantConfig
from playground.decoding import TokenCache, cached_attention, refuse_forward_arguments
from playground.heads import attention_flops, project_output, split_heads
from playground.masks import allowed_keys, empty_query_rows, masked_softmax


@dataclass(frozen=True)
class GqaConfig(VariantConfig):
    num_kv_heads: int = 2
    """Key/value heads G, shared by groups of num_heads / G query heads (1: multi-query
    attention; num_heads: multi-head attention)."""
    bias: bool = True
    """Add a bias to the q/k/v/out projections (Llama has none: use False to match it)."""

    def __post_init__(self) -> None:
        playground.require_positive(self, "num_kv_heads")


class GroupedQueryAttention(AttentionVariant):
    name = "gqa"
    summary = "Query heads share fewer key/value heads (G groups); G = 1 is multi-query."
    paper = "Ainslie et al. 2023, GQA: Grouped-Query Attention, §2.2"
    Config = GqaConfig
    colour = "#e377c2"  # pink, in every figure
    capabilities = Capabilities(
        causal=True,
        padding_mask=True,
        cross_attention=True,
        need_weights=True,
        dtypes=(torch.float32, torch.float64, torch.bfloat16, torch.float16),
    )

    @staticmethod
    def flops(n_q: int, n_k: int, d_model: int, num_heads: int, **options: Any) -> float:
        kv_width = d_model * int(options.get("num_kv_heads", 2)) // num_heads
        projections = 2 * 2 * n_q * d_model * d_model + 2 * 2 * n_k * d_model * kv_width
        return float(projections) + attention_flops(n_q * n_k, d_model)

    def __init__(self, d_model: int = 512, num_heads: int = 8, **options: object) -> None:
        super().__init__(d_model, num_heads, **options)
        groups = self.config.num_kv_heads
        if num_heads % groups:
            raise playground.ConfigError(
                f"num_kv_heads = {groups} must divide num_heads = {num_heads}, so that every "
                f"key/value head serves the same number of query heads"
            )
        self.num_kv_heads = groups
        bias, kv_width = self.config.bias, groups * self.head_dim
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, kv_width, bias=bias)
        self.v_proj = nn.Linear(d_model, kv_width, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def kv_cache_per_token(self) -> int:
        return 2 * self.num_kv_heads * self.head_dim

    def _project(self, query, key, value):
        """q (B, H, Nq, d); k, v (B, G, Nk, d)."""
        return (
            split_heads(self.q_proj(query), self.num_heads),
            split_heads(self.k_proj(key), self.num_kv_heads),
            split_heads(self.v_proj(value), self.num_kv_heads),
        )

    def forward_reference(
        self, query, key, value, attention_mask, is_causal, need_weights
    ) -> AttentionOutput:
        q, k, v = self._project(query, key, value)
        group = self.num_heads // self.num_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, H, ·)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, Nq, Nk)
        allowed = allowed_keys(attention_mask, q.shape[2], k.shape[2], is_causal, q.device)
        weights = masked_softmax(scores, allowed)
        output = project_output(self, weights @ v, empty_query_rows(allowed))
        return AttentionOutput(output, weights if need_weights else None)

    # --- fast path ----------------------------------------------------------------------
    def forward_fast(
        self, query, key, value, attention_mask, is_causal, need_weights
    ) -> AttentionOutput:
        q, k, v = self._project(query, key, value)
        if attention_mask is None:
            context = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True)
            return AttentionOutput(project_output(self, context, None), None)
        allowed = allowed_keys(attention_mask, q.shape[2], k.shape[2], is_causal, q.device)
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)
        return AttentionOutput(project_output(self, context, empty_query_rows(allowed)), None)

    # --- decoding: a cache of the G key/value heads ------------------------------------
    def prefill_state(self, prompt, attention_mask, max_length, **extra):
        refuse_forward_arguments(self.name, extra)  # its state keeps none
        output = self(prompt, attention_mask=attention_mask, is_causal=True).output
        _, k, v = self._project(prompt, prompt, prompt)  # k, v (B, G, P, d)
        cache = TokenCache.of_prompt(prompt, attention_mask, max_length, keys=k, values=v)
        return output, cache

    def step_state(self, token, state):
        q, k, v = self._project(token, token, token)  # q (B, H, 1, d); k, v (B, G, 1, d)
        state.append(keys=k, values=v)
        kept = state.kept_entries()
        allowed = state.kept_real()[:, None, None, :]  # (B, 1, 1, L)
        context, empty = cached_attention(
            q, kept["keys"], kept["values"], allowed, self.head_dim**-0.5
        )
        return project_output(self, context, empty)

    # --- on heads projected elsewhere (playground.hf): exact attention -------------------
    def attend_heads(self, q, k, v, allowed, *, scale, q_idx, kv_idx, dropout=0.0):
        """Exact softmax attention on another model's q, k and v, whose G key/value heads
        each serve H / G query heads: one fused call, no copy of k or v."""
        return cached_attention(q, k, v, allowed, scale, dropout)[0]


@playground.hookimpl
def register_attention(register):
    register(GroupedQueryAttention)
