"""The attention masks transformers passes, in the contract's terms.

An attention function gets HF's mask in one of its forms: None (no padding: causality then
comes from `is_causal`), a 4-D boolean mask (B, 1 or H, Nq, Nk) with True where a query may
see a key (what `sdpa_mask` builds, sliding windows and packed sequences included), a 4-D
float mask that adds 0 where a query may see a key and the dtype's minimum or −inf where
not (`eager_mask`), or a 2-D key padding mask (B, Nk). `allowed_pairs` turns each into one
boolean mask; `padding_of` reads a key padding mask back out of a padded causal or
bidirectional mask, for a module that takes padding and causality as the contract does,
and refuses any other pattern rather than drop it.
"""

from __future__ import annotations

import torch

from playground.errors import InvalidInput

FLOAT_MASK = (
    "a float attention mask may hold only 0 (attend) and the dtype's minimum or −inf (do "
    "not); values between add a bias, which this bridge does not take: pass a boolean mask "
    "(True = attend), or put the bias in the variant's score_mod"
)


def latest_causal(n_q: int, n_k: int, device: torch.device) -> torch.Tensor:
    """(Nq, Nk) bool: query i, the (Nk − Nq + i)-th position, sees the keys up to itself
    (bottom-right aligned, as a cache's new tokens are)."""
    return torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril(n_k - n_q)


def allowed_pairs(
    attention_mask: torch.Tensor | None, n_q: int, n_k: int, is_causal: bool, device: torch.device
) -> torch.Tensor | None:
    """(B or 1, 1 or H, Nq, Nk) bool, True where query i may see key j, or None for every
    pair. The queries are the last Nq of the Nk positions (a cache's new tokens)."""
    if attention_mask is None:
        return latest_causal(n_q, n_k, device)[None, None] if is_causal and n_q > 1 else None
    if attention_mask.dim() == 2:  # (B, Nk) key padding
        padding = attention_mask.bool()[:, None, None, :]
        return padding & latest_causal(n_q, n_k, device) if is_causal else padding
    if attention_mask.dim() != 4 or attention_mask.shape[-2:] != (n_q, n_k):
        raise InvalidInput(
            f"attention_mask must be (B, 1, Nq, Nk) = (B, 1, {n_q}, {n_k}) or a key padding "
            f"mask (B, {n_k}); got {tuple(attention_mask.shape)}"
        )
    if attention_mask.dtype == torch.bool:
        return attention_mask
    if not attention_mask.is_floating_point():
        return attention_mask != 0
    allowed = attention_mask > torch.finfo(attention_mask.dtype).min / 2
    if bool((attention_mask[allowed] != 0).any()):
        raise InvalidInput(FLOAT_MASK)
    return allowed


def padding_of(allowed: torch.Tensor | None, is_causal: bool) -> torch.Tensor | None:
    """(B, N) bool, the real tokens of a square mask (B, 1, N, N) that is key padding,
    with causality where `is_causal` (a key is real when some query sees it: itself at
    least); None when every token is real. Any other pattern (a sliding window, packed
    sequences, a custom mask) is refused: a module that takes padding and causality
    cannot follow it."""
    if allowed is None:
        return None
    n = allowed.shape[-1]
    real = allowed.any(dim=-2)[:, 0]  # (B, N)
    rebuilt = real[:, None, None, :]
    if is_causal:
        rebuilt = rebuilt & latest_causal(n, n, allowed.device)
    seen = real[:, None, :, None]  # a padded query's row is free: its output is padding's
    if not bool(((allowed == rebuilt) | ~seen).all()):
        raise InvalidInput(
            "this model's attention mask is not key padding"
            f"{' with causality' if is_causal else ''} (a sliding window, packed sequences "
            "or a custom mask): a swapped attention module takes padding and causality "
            "only; register the variant at kernel level instead (playground.hf.register), "
            "which reads any mask"
        )
    return None if bool(real.all()) else real
