"""Sigmoid attention: Ramapuram et al. 2025, "Theory, Analysis, and Best Practices for
Sigmoid Self-Attention", §3 and §4.

Each weight is an independent sigmoid instead of a row's softmax, so rows need not sum
to one and no row-wide reduction couples the keys:

    SigmoidAttn(Q, K, V) = σ(Q Kᵀ / √d + b) V,     b = −log n            (§3, §4.2)

The bias b = −log n keeps the initial row mass near that of softmax (§4.2); n is the
sequence length the model is trained at, a constant of the layer (`bias_length`, which a
model built for a task's length takes from it), not the length of each call: a bias that changed with the number of keys would let a query see
how many future tokens there are. Masked keys get weight 0 (σ is not evaluated there).
The public kernels (apple/ml-sigmoid-attention's FlashSigmoid) are CUDA-only and not on
PyPI: the tests check these equations.

The reference forms the (Nq, Nk) weights. The fast path takes blocks of queries over the
keys they may see; in training each block is recomputed in backward (activation
checkpointing), so memory stays O(N · block) at any length.

Decoding keeps every key and value (a key/value cache, allocated once when the length is
known): no row-wide normalisation couples the keys, so a new token's weights are
σ(q·k/√d + b) over the kept real keys, the same b, and its output is their sum with the
kept values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint

import playground
from playground import AttentionOutput, AttentionVariant, Capabilities, VariantConfig
from playground.heads import (
    add_projections,
    attention_flops,
    prefill_key_value_cache,
    project_heads,
    project_output,
    projection_flops,
)
from playground.masks import allowed_keys, empty_query_rows, queries_without_keys


@dataclass(frozen=True)
class SigmoidConfig(VariantConfig):
    bias_length: int = 1024
    """n of b = −log n: the sequence length the layer is trained at (§4.2)."""
    bias: bool = True
    """Add a bias to the q/k/v/out projections."""
    block_size: int = 256
    """Queries per block of the fast path. Results do not depend on it."""

    def __post_init__(self) -> None:
        playground.require_positive(self, "bias_length", "block_size")


class SigmoidAttention(AttentionVariant):
    name = "sigmoid"
    summary = "Elementwise sigmoid weights σ(q·k/√d − log n) instead of a row softmax."
    paper = "Ramapuram et al. 2025, Theory, Analysis, and Best Practices for Sigmoid Self-Attention, §3–4"
    Config = SigmoidConfig
    colour = "#ffbb78"  # light orange, in every figure
    capabilities = Capabilities(
        causal=True,
        padding_mask=True,
        cross_attention=True,
        need_weights=True,
        weights_sum_to_one=False,  # each weight is its own sigmoid
        dtypes=(torch.float32, torch.float64, torch.bfloat16),
    )
    suite_options = {"block_size": 5}  # several blocks and a partial one
    flops_uncounted = "the bias and σ of every score, 2 per score"
    flops_tolerance = 0.1  # 2 per score: 6% of the products at head width 8

    @staticmethod
    def flops(n_q: int, n_k: int, d_model: int, num_heads: int, **options: object) -> float:
        sigmoids = 2 * n_q * n_k * num_heads  # + b, then σ
        return projection_flops(n_q, n_k, d_model) + attention_flops(n_q * n_k, d_model) + sigmoids

    @classmethod
    def fit_options(cls, options: dict, seq_len: int) -> dict:
        """b = −log n for the length a model is built for, unless bias_length is given."""
        return {"bias_length": seq_len, **options}

    def __init__(self, d_model: int = 512, num_heads: int = 8, **options: object) -> None:
        super().__init__(d_model, num_heads, **options)
        add_projections(self, d_model, bias=self.config.bias)
        self.scale = 1 / math.sqrt(self.head_dim)
        self.logit_offset = -math.log(self.config.bias_length)  # b

    def _weights(self, q, k, allowed) -> torch.Tensor:
        """σ(q kᵀ / √d + b), 0 where not allowed."""
        weights = torch.sigmoid(q @ k.transpose(-2, -1) * self.scale + self.logit_offset)
        return weights if allowed is None else weights.masked_fill(~allowed, 0.0)

    def forward_reference(
        self, query, key, value, attention_mask, is_causal, need_weights
    ) -> AttentionOutput:
        q, k, v = project_heads(self, query, key, value)
        allowed = allowed_keys(attention_mask, q.shape[2], k.shape[2], is_causal, q.device)
        weights = self._weights(q, k, allowed)  # (B, H, Nq, Nk)
        output = project_output(self, weights @ v, empty_query_rows(allowed))
        return AttentionOutput(output, weights if need_weights else None)

    # --- fast path ----------------------------------------------------------------------
    def forward_fast(
        self, query, key, value, attention_mask, is_causal, need_weights
    ) -> AttentionOutput:
        q, k, v = project_heads(self, query, key, value)
        n_q, n_k, block = q.shape[2], k.shape[2], self.config.block_size
        recompute = torch.is_grad_enabled() and n_q > block
        keep = None if attention_mask is None else attention_mask[:, None, None, :]

        def attend(start: int, q_block, k, v, keep) -> torch.Tensor:
            allowed = keep
            if is_causal:
                position = torch.arange(start, start + q_block.shape[2], device=q.device)
                causal = position[:, None] >= torch.arange(k.shape[2], device=q.device)
                allowed = causal if allowed is None else allowed & causal
            return self._weights(q_block, k, allowed) @ v

        contexts = []
        for start in range(0, n_q, block):
            stop = min(start + block, n_q)
            seen = min(stop, n_k) if is_causal else n_k  # a causal block sees keys < stop
            arguments = (
                start,
                q[:, :, start:stop],
                k[:, :, :seen],
                v[:, :, :seen],
                None if keep is None else keep[..., :seen],
            )
            if recompute:
                contexts.append(checkpoint(attend, *arguments, use_reentrant=False))
            else:
                contexts.append(attend(*arguments))
        empty = queries_without_keys(attention_mask, n_q, n_k, is_causal)
        return AttentionOutput(project_output(self, torch.cat(contexts, dim=2), empty), None)

    # --- decoding: a key/value cache ---------------------------------------------------
    prefill_state = prefill_key_value_cache  # the prompt's outputs; its k and v cached

    def step_state(self, token, state):
        q, k, v = project_heads(self, token, token, token)  # (B, H, 1, d)
        state.append(keys=k, values=v)
        kept = state.kept_entries()
        allowed = state.kept_real()[:, None, None, :]  # (B, 1, 1, L): padding weighs 0
        weights = self._weights(q, kept["keys"], allowed)  # (B, H, 1, L)
        # The token sees itself, so it is never a query without keys.
        return project_output(self, weights @ kept["values"], None)


@playground.hookimpl
def register_attention(register):
    register(SigmoidAttention)
