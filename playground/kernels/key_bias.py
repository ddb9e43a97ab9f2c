"""`key_bias_attention`: softmax(scale · q kᵀ + c) v for a bias c that depends on the key
(and the batch element and head) but not on the query, as one fused SDPA call with no
mask to read.

A bias per key is a rank-one term: q·k · scale + c_j = [q, 1]·[k, c_j / scale] · scale.
So each query gets one more coordinate, 1, and each key the coordinate c_j / scale, and
the fused kernel computes the biased scores itself; the bias never becomes a (Nq, Nk)
matrix in memory, and autograd gives c its gradient through the keys. The value gets a
zero coordinate too, dropped from the output: with a value of another width than the
keys, torch's CPU SDPA leaves its fused kernel for the math path (five times slower).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from playground.masks import allowed_keys


def key_bias_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_bias: torch.Tensor,
    attention_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float,
) -> torch.Tensor:
    """q (B, H, Nq, d), k and v (B, H, Nk, d), key_bias broadcastable to (B, H, 1, Nk)
    and finite -> context (B, H, Nq, d); a query that sees no key gets zero."""
    batch, heads, n_q, n_k = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    bias = key_bias.to(k.dtype).expand(batch, heads, 1, n_k).transpose(-2, -1)  # (B, H, Nk, 1)
    q_plus = torch.cat([q, q.new_ones(batch, heads, n_q, 1)], dim=-1)
    k_plus = torch.cat([k, bias / scale], dim=-1)
    v_plus = F.pad(v, (0, 1))
    if attention_mask is None:  # the fused kernel's own causality, top-left aligned
        context = F.scaled_dot_product_attention(
            q_plus, k_plus, v_plus, is_causal=is_causal, scale=scale
        )
        return context[..., :-1]
    allowed = allowed_keys(attention_mask, n_q, n_k, is_causal, q.device)
    assert allowed is not None  # a padding mask was given
    context = F.scaled_dot_product_attention(
        q_plus, k_plus, v_plus, attn_mask=allowed, scale=scale
    )[..., :-1]
    seen = allowed.any(dim=-1, keepdim=True)  # a query with no key: 0, not NaN
    return context.masked_fill(~seen, 0.0)
