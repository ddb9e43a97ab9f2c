"""Masks shared by the variants: which keys each query may see, and a softmax that
gives exactly zero weight to the others (and an all-zero row when none is left).

Convention (docs/design.md, "The contract"): `attention_mask` is (B, Nk) bool, True = real token.
"""

from __future__ import annotations

import torch


def causal_mask(n_q: int, n_k: int, device: torch.device | None = None) -> torch.Tensor:
    """(Nq, Nk) bool, True where key j <= query i (top-left aligned, as in SDPA)."""
    return torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril()


def allowed_keys(
    attention_mask: torch.Tensor | None,
    n_q: int,
    n_k: int,
    is_causal: bool,
    device: torch.device | None = None,
) -> torch.Tensor | None:
    """(B or 1, 1, Nq, Nk) bool, True where a query may attend to a key; None if all may.

    Broadcasts over heads; combines the padding mask (masks keys) and causality.
    """
    allowed = None
    if attention_mask is not None:
        allowed = attention_mask[:, None, None, :]  # (B, 1, 1, Nk)
    if is_causal:
        causal = causal_mask(n_q, n_k, device)[None, None]  # (1, 1, Nq, Nk)
        allowed = causal if allowed is None else allowed & causal
    if allowed is not None:
        allowed = allowed.expand(-1, -1, n_q, n_k)
    return allowed


def masked_softmax(scores: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last dim with disallowed entries at exactly 0.

    A row with no finite score, because the mask allows no key or because the scores
    themselves are all −inf (a score_mod that hides keys), returns all zeros instead of
    NaN, and its scores get zero gradients: the contract's fully masked query, and what
    FlexAttention gives. A NaN score still makes its row NaN.
    """
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    if scores.shape[-1] == 0:  # no keys at all: nothing to reduce over
        return scores.softmax(dim=-1)
    # amax is NaN on a row holding a NaN, so such a row is not taken for an empty one.
    empty = torch.isneginf(scores.amax(dim=-1, keepdim=True))  # (..., 1)
    # Filled before the softmax too: its backward would turn the NaN of an all −inf row
    # into NaN gradients even where the weights are zeroed afterwards.
    weights = scores.masked_fill(empty, 0.0).softmax(dim=-1)
    return weights.masked_fill(empty, 0.0)


def empty_query_rows(allowed: torch.Tensor | None) -> torch.Tensor | None:
    """(B or 1, Nq, 1) bool: True for queries that may see no key at all.

    Their output must be exactly zero (the contract), after the output projection too.
    """
    if allowed is None:
        return None
    return ~allowed.any(dim=-1).any(dim=1)[..., None]


def queries_without_keys(
    attention_mask: torch.Tensor | None, n_q: int, n_k: int, is_causal: bool
) -> torch.Tensor | None:
    """(B, Nq, 1) bool, True for queries that see no key under a padding mask (B, Nk) and
    causality (query i sees keys j <= i): `empty_query_rows` without building the dense
    (B, Nq, Nk) mask, O(B · N). None when every query sees a key."""
    if attention_mask is None:
        return None  # causal alone: every query sees key 0
    if not is_causal:
        return (~attention_mask.any(dim=-1))[:, None, None].expand(-1, n_q, 1)
    seen_any = attention_mask.cumsum(dim=-1) > 0  # (B, Nk): a real key at or before j
    last_visible = torch.arange(n_q, device=attention_mask.device).clamp(max=n_k - 1)
    return ~seen_any[:, last_visible, None]
