"""The plain-math oracles of the kernels: each kernel's answer written out as one dense
softmax over an (Nq, Nk) mask, at O(Nq · Nk) memory. The tests check every kernel's outputs
and gradients against these, and `dense_attention` is also what the fast paths recompute
when their gradients must themselves be differentiated, and what runs under torch.func
transforms: one oracle for both."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from einops import rearrange

from playground.kernels.common import additive
from playground.masks import masked_softmax


def dense_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """softmax(scale · q kᵀ + mask) v in torch's own operations, 0 for a row whose mask
    hides every key (−inf)."""
    scores = q @ k.transpose(-2, -1) * scale
    if mask is None:
        return scores.softmax(dim=-1) @ v
    return masked_softmax(scores + mask, ~torch.isneginf(mask)) @ v


def dense_banded(
    queries: torch.Tensor,
    keys_values: torch.Tensor,
    key_ok: torch.Tensor,
    num_heads: int,
    before: int,
    after: int,
    prefix_keys_values: torch.Tensor | None = None,
    prefix_ok: torch.Tensor | None = None,
    prefix_positions: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`banded_attention` written out: softmax over [prefix keys | sequence keys] with the
    band's rules -> (context (B, N, E), (B, N) bool: the rows that see a key; the others
    are 0 here and meaningless there)."""
    n, width = queries.shape[1], queries.shape[2]
    i = torch.arange(n, device=queries.device)[:, None]
    j = torch.arange(n, device=queries.device)[None, :]
    allowed = (j >= i - before) & (j <= i + after) & key_ok[:, None, :]  # (B, N, N)
    keys, values = keys_values.split(width, dim=-1)
    if prefix_keys_values is not None:
        prefix_keys, prefix_values = prefix_keys_values.split(width, dim=-1)
        if prefix_ok is None:
            prefix_ok = torch.ones(prefix_keys.shape[:2], dtype=torch.bool, device=keys.device)
        prefix_allowed = prefix_ok[:, None, :].expand(-1, n, -1)  # (B, N, G)
        if prefix_positions is not None:
            prefix_allowed = prefix_allowed & (prefix_positions[:, None, :] <= i)
        allowed = torch.cat([prefix_allowed, allowed], dim=-1)
        keys = torch.cat([prefix_keys, keys], dim=1)
        values = torch.cat([prefix_values, values], dim=1)
    q, k, v = (rearrange(t, "b n (h d) -> b h n d", h=num_heads) for t in (queries, keys, values))
    mask = additive(allowed[:, None], queries.dtype)  # (B, 1, N, G + N)
    context = dense_attention(q, k, v, mask, q.shape[-1] ** -0.5)
    return rearrange(context, "b h n d -> b n (h d)"), allowed.any(dim=-1)


def dense_blocked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    blocks: Sequence[tuple[int, int, int, int]],
    masks: Sequence[torch.Tensor | None],
    scale: float,
) -> torch.Tensor:
    """`blocked_attention` written out: one (B, H, Nq, Nk) additive mask, −inf outside
    every block's span, each block's mask (None: all seen; bool; additive float) within;
    as there, the masks get no gradient."""
    mask = q.new_full((q.shape[0], q.shape[1], q.shape[2], k.shape[2]), -math.inf)
    for (start, stop, key_start, key_stop), block_mask in zip(blocks, masks, strict=True):
        span = mask[:, :, start:stop, key_start:key_stop]
        if block_mask is None:
            span.fill_(0.0)
        elif block_mask.dtype == torch.bool:
            span.copy_(additive(block_mask, q.dtype).broadcast_to(span.shape))
        else:
            span.copy_(block_mask.broadcast_to(span.shape))
    return dense_attention(q, k, v, mask.detach(), scale)


def dense_relative(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    relative_bias: torch.Tensor,
    attention_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float,
) -> torch.Tensor:
    """`relative_bias_attention` written out: the Toeplitz bias T[h, i, j] =
    relative_bias[h, j − i + Nq − 1] as an (H, Nq, Nk) matrix."""
    n_q, n_k = q.shape[2], k.shape[2]
    i = torch.arange(n_q, device=q.device)[:, None]
    offset = torch.arange(n_k, device=q.device)[None, :] - i + n_q - 1  # j − i + Nq − 1
    bias = relative_bias[:, offset]  # (H, Nq, Nk)
    allowed = torch.ones(1, n_q, n_k, dtype=torch.bool, device=q.device)
    if attention_mask is not None:
        allowed = allowed & attention_mask[:, None, :]
    if is_causal:
        allowed = allowed & (offset <= n_q - 1)
    return dense_attention(q, k, v, torch.where(allowed[:, None], bias, -math.inf), scale)


def dense_hankel_biased(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    diagonals: torch.Tensor,
    scale: float,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """`hankel_biased_attention` written out: the Hankel bias B[h, i, j] =
    diagonals[h, i + j] as an (H, Nq, Nk) matrix, keys hidden where keep (B, 1, 1, Nk) is
    False."""
    n_q, n_k = q.shape[2], k.shape[2]
    index = torch.arange(n_q, device=q.device)[:, None] + torch.arange(n_k, device=q.device)
    bias = diagonals[:, index]  # (H, Nq, Nk)
    return dense_attention(q, k, v, bias if keep is None else bias.where(keep, -math.inf), scale)
