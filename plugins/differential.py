"""Differential attention: Ye et al. 2025, "Differential Transformer", §2.1.

Each head's queries and keys are split in two halves, and the head attends with the
difference of the two softmax maps, which cancels the attention both give to irrelevant
context (common-mode noise):

    [Q₁; Q₂] = X W^Q,  [K₁; K₂] = X W^K,  V = X W^V
    DiffAttn(X) = (softmax(Q₁K₁ᵀ / √d) − λ softmax(Q₂K₂ᵀ / √d)) V          (eq. 1)
    λ = exp(λ_q1 · λ_k1) − exp(λ_q2 · λ_k2) + λ_init                         (eq. 2)
    λ_init = 0.8 − 0.6 · exp(−0.3 · (l − 1)),  l = 1 … L the layer          (eq. 3)
    head_i' = (1 − λ_init) · RMSNorm(head_i),   output = Concat(head_i') W^O   (eqs. 4–5)

Here a head is d_model / num_heads = 2d wide: its first d query/key channels are Q₁, K₁,
the next d are Q₂, K₂, and its value keeps all 2d (so num_heads here is the paper's h,
half of a baseline's heads at equal width). λ's four vectors (d each, initialised
N(0, 0.1²)) are shared by the heads of a layer; the norm (`subln`, the reference's name) is an RMSNorm over 2d with a
learned weight, ε = 1e-5, in float32. `layer_depth` is l − 1. The weights, a difference of two
distributions, sum to 1 − λ and may be negative. The public reference (microsoft/unilm
Diff-Transformer/multihead_diffattn.py) is not on PyPI: tests check these equations.

The reference forms both maps; the fast path runs both halves as 2H heads of one fused
SDPA call (q and k zero-padded to the value's width, which the fused kernels need) and
subtracts the two outputs (A₁V − λ A₂V = (A₁ − λA₂)V), in O(n) memory.

Decoding keeps both halves of every key, K₁ and K₂, and the values (a key/value cache of
d_model + d_model numbers per token, as exact attention's, allocated once when the length
is known): a new token forms its two maps over the kept real keys, subtracts them with λ,
mixes the kept values once, and normalises its heads as above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import playground
from playground import AttentionOutput, AttentionVariant, Capabilities, VariantConfig
from playground.decoding import TokenCache, refuse_forward_arguments
from playground.heads import (
    add_projections,
    attention_flops,
    project_heads,
    project_output,
    projection_flops,
)
from playground.masks import allowed_keys, empty_query_rows, masked_softmax


@dataclass(frozen=True)
class DifferentialConfig(VariantConfig):
    layer_depth: int = 0
    """The layer's index from 0 (l − 1 in eq. 3): λ_init = 0.8 − 0.6 · exp(−0.3 · layer_depth)."""
    bias: bool = False
    """Add a bias to the q/k/v/out projections (the paper's have none)."""

    def __post_init__(self) -> None:
        if self.layer_depth < 0:
            raise ValueError(f"layer_depth must be a non-negative integer; got {self.layer_depth}")


class DifferentialAttention(AttentionVariant):
    name = "differential"
    summary = "Two softmax maps per head, subtracted with a learned λ; heads RMS-normalised."
    paper = "Ye et al. 2025, Differential Transformer, §2.1"
    Config = DifferentialConfig
    colour = "#98df8a"  # light green, in every figure
    flops_uncounted = "A₁ − λA₂, 2 per score; the heads' RMSNorm and scale, 6 per feature"
    flops_tolerance = 0.1  # 2 per score: 6% of the products at head width 8
    capabilities = Capabilities(
        causal=True,
        padding_mask=True,
        cross_attention=True,
        need_weights=True,
        weights_sum_to_one=False,  # they sum to 1 − λ
        weights_nonnegative=False,
        dtypes=(torch.float32, torch.float64, torch.bfloat16),
    )

    @staticmethod
    def flops(n_q: int, n_k: int, d_model: int, num_heads: int, **options: object) -> float:
        # Q₁K₁ᵀ and Q₂K₂ᵀ are half-width each: one Q Kᵀ's worth; (A₁ − λA₂) V one P V
        # (eq. 1, as the paper's code computes it; the fast path's A₁V and A₂V are two
        # because fused kernels cannot subtract the maps).
        maps = 2 * n_q * n_k * num_heads  # A₁ − λ A₂
        norm = 6 * n_q * d_model  # RMSNorm of each head, × (1 − λ_init) (eq. 4)
        return (
            projection_flops(n_q, n_k, d_model) + attention_flops(n_q * n_k, d_model) + maps + norm
        )

    def __init__(self, d_model: int = 512, num_heads: int = 8, **options: object) -> None:
        super().__init__(d_model, num_heads, **options)
        if self.head_dim % 2:
            raise playground.ConfigError(
                f"differential attention splits each head's queries and keys in two, so "
                f"d_model / num_heads = {self.head_dim} must be even"
            )
        add_projections(self, d_model, bias=self.config.bias)
        half = self.head_dim // 2
        self.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * self.config.layer_depth)
        self.lambda_q1 = nn.Parameter(torch.randn(half) * 0.1)
        self.lambda_k1 = nn.Parameter(torch.randn(half) * 0.1)
        self.lambda_q2 = nn.Parameter(torch.randn(half) * 0.1)
        self.lambda_k2 = nn.Parameter(torch.randn(half) * 0.1)
        self.subln = nn.RMSNorm(self.head_dim, eps=1e-5)
        self.scale = 1 / math.sqrt(half)

    def differential_lambda(self) -> torch.Tensor:
        """λ of eq. 2, a scalar, computed in float32."""
        first = torch.exp((self.lambda_q1.float() * self.lambda_k1.float()).sum())
        second = torch.exp((self.lambda_q2.float() * self.lambda_k2.float()).sum())
        return first - second + self.lambda_init

    def learned_summary(self):
        """λ of eq. 2 after training (it starts near λ_init of eq. 3)."""
        return {"λ (eq. 2)": self.differential_lambda()}

    def _halves(self, query, key, value):
        """q and k (B, H, N, 2, d): the two halves of each head; v (B, H, Nk, 2d)."""
        q, k, v = project_heads(self, query, key, value)
        return q.unflatten(-1, (2, -1)), k.unflatten(-1, (2, -1)), v

    @staticmethod
    def _halves_as_heads(x: torch.Tensor) -> torch.Tensor:
        """(B, H, N, 2, d) -> (B, 2H, N, d): half i of head h becomes head 2h + i."""
        return x.movedim(3, 2).flatten(1, 2)

    def _heads_out(self, heads: torch.Tensor, query, empty) -> torch.Tensor:
        """(B, H, Nq, 2d) -> output: per-head RMSNorm (float32), × (1 − λ_init), W^O."""
        dtype = torch.float64 if heads.dtype == torch.float64 else torch.float32
        weight = self.subln.weight.to(dtype)
        normed = F.rms_norm(heads.to(dtype), (self.head_dim,), weight, self.subln.eps)
        return project_output(self, normed.to(heads.dtype) * (1 - self.lambda_init), empty)

    def forward_reference(
        self, query, key, value, attention_mask, is_causal, need_weights
    ) -> AttentionOutput:
        q, k, v = self._halves(query, key, value)
        allowed = allowed_keys(attention_mask, q.shape[2], k.shape[2], is_causal, q.device)
        maps = [
            masked_softmax(
                q[..., half, :] @ k[..., half, :].transpose(-2, -1) * self.scale, allowed
            )
            for half in (0, 1)
        ]  # A₁, A₂ (B, H, Nq, Nk)
        weights = maps[0] - self.differential_lambda().to(q.dtype) * maps[1]
        output = self._heads_out(weights @ v, query, empty_query_rows(allowed))
        return AttentionOutput(output, weights if need_weights else None)

    # --- fast path ----------------------------------------------------------------------
    def forward_fast(
        self, query, key, value, attention_mask, is_causal, need_weights
    ) -> AttentionOutput:
        q, k, v = self._halves(query, key, value)
        # Both halves as 2H heads of one call: (B, H, 2, N, d) -> (B, 2H, N, d), each half
        # mixing the head's whole value (2d). Fused kernels need one head width for q, k
        # and v, so q and k are padded with d zeros: the scores do not change.
        q2 = F.pad(self._halves_as_heads(q), (0, q.shape[-1]))
        k2 = F.pad(self._halves_as_heads(k), (0, k.shape[-1]))
        v2 = v.repeat_interleave(2, dim=1)
        allowed = allowed_keys(attention_mask, q.shape[2], k.shape[2], is_causal, q.device)
        if allowed is None:
            both = F.scaled_dot_product_attention(q2, k2, v2, is_causal=is_causal, scale=self.scale)
        else:
            both = F.scaled_dot_product_attention(q2, k2, v2, attn_mask=allowed, scale=self.scale)
        first, second = both.unflatten(1, (-1, 2)).unbind(2)  # A₁V, A₂V (B, H, Nq, 2d)
        heads = first - self.differential_lambda().to(q.dtype) * second
        return AttentionOutput(self._heads_out(heads, query, empty_query_rows(allowed)), None)

    # --- decoding: both key halves and the values, cached ------------------------------
    def prefill_state(self, prompt, attention_mask, max_length, **extra):
        refuse_forward_arguments(self.name, extra)  # its state keeps none
        output = self(prompt, attention_mask=attention_mask, is_causal=True).output
        _, k, v = self._halves(prompt, prompt, prompt)  # k (B, H, P, 2, d); v (B, H, P, 2d)
        # K₁ and K₂ as 2H heads of d, (B, 2H, P, d): each half's keys contiguous.
        cache = TokenCache.of_prompt(
            prompt, attention_mask, max_length, keys=self._halves_as_heads(k), values=v
        )
        return output, cache

    def step_state(self, token, state):
        q, k, v = self._halves(token, token, token)  # q, k (B, H, 1, 2, d); v (B, H, 1, 2d)
        state.append(keys=self._halves_as_heads(k), values=v)
        kept = state.kept_entries()  # keys (B, 2H, L, d), values (B, H, L, 2d)
        allowed = state.kept_real()[:, None, None, :]  # (B, 1, 1, L)
        scores = self._halves_as_heads(q) @ kept["keys"].transpose(-2, -1) * self.scale
        maps = masked_softmax(scores, allowed).unflatten(1, (-1, 2))  # (B, H, 2, 1, L)
        weights = maps[:, :, 0] - self.differential_lambda().to(q.dtype) * maps[:, :, 1]
        # The token sees itself, so it is never a query without keys.
        return self._heads_out(weights @ kept["values"], token, None)  # eq. 1, then eqs. 4–5


@playground.hookimpl
def register_attention(register):
    register(DifferentialAttention)
