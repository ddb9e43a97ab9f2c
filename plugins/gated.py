"""Gated attention: Qiu et al. 2025, "Gated Attention for Large Language Models:
Non-linearity, Sparsity, and Attention-Sink-Free", §2–3 (gate position G1).

Softmax attention whose per-head output is scaled by a sigmoid gate computed from the
same token's input, before the output projection:

    Y = softmax(Q Kᵀ / √d) V                   per head, (Nq, d)
    Y' = Y ⊙ σ(X W_θ)                          (§2.2, eq. 5; at G1, after SDPA)
    output = Concat_h(Y'_h) W^O

Head-wise (one gate per head and token, W_θ of d_model × H; the issue's default) or
elementwise (one per head dimension, d_model × d_model, as Qwen3-Next uses it). The gate
adds a non-linearity between W^V and W^O, and sparse gates remove the attention sink
(§4). The rest is `SoftmaxAttention`, so every path serves; the fast one is one SDPA call.
"""

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

import playground


@dataclass(frozen=True)
class GatedConfig(playground.SoftmaxConfig):
    gating: Literal["headwise", "elementwise"] = "headwise"
    """One gate per head and token ("headwise"), or one per head dimension ("elementwise",
    Qwen3-Next's)."""


class GatedAttention(playground.SoftmaxAttention):
    name = "gated"
    summary = "Softmax attention with a sigmoid output gate per head, from the query token."
    paper = "Qiu et al. 2025, Gated Attention for LLMs, §2.2 (G1)"
    Config = GatedConfig
    colour = "#ff9896"  # light red, in every figure
    flops_uncounted = "the gate's product Y ⊙ σ(X W_θ), 1 per query and feature"

    @staticmethod
    def flops(n_q: int, n_k: int, d_model: int, num_heads: int, **options: object) -> float:
        width = d_model if options.get("gating") == "elementwise" else num_heads
        gate = 2 * n_q * d_model * width + n_q * d_model  # X W_θ, then Y ⊙ σ(·)
        return playground.SoftmaxAttention.flops(n_q, n_k, d_model, num_heads) + gate

    def __init__(self, d_model=512, num_heads=8, **options):
        super().__init__(d_model, num_heads, **options)
        width = d_model if self.config.gating == "elementwise" else num_heads
        self.gate_proj = nn.Linear(d_model, width, bias=self.config.bias)  # W_θ

    def context_mod(self, context, query):
        gate = torch.sigmoid(self.gate_proj(query))  # (B, Nq, H) or (B, Nq, H·d)
        if self.config.gating == "elementwise":
            gate = gate.unflatten(-1, (self.num_heads, self.head_dim))  # (B, Nq, H, d)
        else:
            gate = gate[..., None]  # (B, Nq, H, 1)
        return context * gate.transpose(1, 2)  # (B, H, Nq, d)


@playground.hookimpl
def register_attention(register):
    register(GatedAttention)
