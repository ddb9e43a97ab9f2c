"""Mod attention through `flex_attention` with a block mask built from `mask_mod`,
causality and the padding mask (torch.nn.attention.flex_attention): compiled on CUDA,
SoftmaxAttention's fast path there; eager elsewhere, which is how the test suite runs this
path on a machine without a GPU (this torch compiles CPU flex for inference only, without
the log-sum-exp the empty rows are found from)."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import torch
from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention


def flex_mod_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    score_mod: Callable[..., torch.Tensor] | None,
    mask_mod: Callable[..., torch.Tensor] | None,
    attention_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q (B, H, Nq, d), k and v (B, H, Nk, d) -> (context (B, H, Nq, d), empty (B, Nq, 1)
    bool: the queries with no finite score in any head, whose context is zero). The mods
    are FlexAttention's, None where the variant has none."""
    batch, heads, n_q, n_k = q.shape[0], q.shape[1], q.shape[2], k.shape[2]

    def allowed(b, h, q_idx, kv_idx):
        allowed = mask_mod(b, h, q_idx, kv_idx) if mask_mod is not None else q_idx >= 0
        if is_causal:
            allowed = allowed & (q_idx >= kv_idx)
        if attention_mask is not None:
            allowed = allowed & attention_mask[b, kv_idx]
        return allowed

    block_mask = create_block_mask(allowed, batch, heads, n_q, n_k, device=q.device)
    attend = _compiled_flex_attention() if q.is_cuda else flex_attention
    with warnings.catch_warnings():  # eager off CUDA is chosen, not forgotten
        warnings.filterwarnings("ignore", "flex_attention called without torch.compile")
        context, aux = attend(
            q,
            k,
            v,
            score_mod=score_mod,
            block_mask=block_mask,
            scale=scale,
            return_aux=AuxRequest(lse=True),
        )  # (B, H, Nq, d), lse (B, H, Nq); a query that sees nothing gets 0 and lse −inf
    return context, torch.isneginf(aux.lse).all(dim=1)[..., None]


@functools.cache
def _compiled_flex_attention():
    return torch.compile(flex_attention, dynamic=False)
