"""How the mods are called (`SoftmaxAttention`'s score_mod and mask_mod, FlexAttention's
convention): their protocols, the broadcast index grid they are evaluated on, and the
pairs a mask_mod, causality and padding allow together."""

from __future__ import annotations

from typing import Protocol

import torch

from playground.kernels.mod_program import ModProgram


class ScoreMod(Protocol):
    """FlexAttention's score_mod: the scaled score of query q_idx and key kv_idx, changed."""

    def __call__(
        self,
        score: torch.Tensor,
        b: torch.Tensor,
        h: torch.Tensor,
        q_idx: torch.Tensor,
        kv_idx: torch.Tensor,
    ) -> torch.Tensor: ...


class MaskMod(Protocol):
    """FlexAttention's mask_mod: True where query q_idx may see key kv_idx."""

    def __call__(
        self, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> torch.Tensor: ...


def index_grid(
    batch: int, heads: int, queries: torch.Tensor, keys: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """b (B,1,1,1), h (1,H,1,1), q_idx (1,1,Nq,1), kv_idx (1,1,1,Nk): the broadcast
    index tensors the mods are evaluated on."""
    device = queries.device
    return (
        torch.arange(batch, device=device).view(-1, 1, 1, 1),
        torch.arange(heads, device=device).view(1, -1, 1, 1),
        queries.view(1, 1, -1, 1),
        keys.view(1, 1, 1, -1),
    )


def allowed_pairs(
    mask_mod: MaskMod | None,
    b: torch.Tensor,
    h: torch.Tensor,
    q_idx: torch.Tensor,
    kv_idx: torch.Tensor,
    keep: torch.Tensor | None,
    is_causal: bool,
) -> torch.Tensor | None:
    """mask_mod ∧ causality ∧ padding (`keep`, (B, Nk) bool), (B or 1, H or 1, Nq, Nk);
    None = all."""
    allowed = mask_mod(b, h, q_idx, kv_idx) if mask_mod is not None else None
    if is_causal:
        causal = q_idx >= kv_idx
        allowed = causal if allowed is None else allowed & causal
    if keep is not None:
        padding = keep[:, None, None, :]  # (B, 1, 1, Nk)
        allowed = padding if allowed is None else allowed & padding
    return allowed


class ProgramOf(Protocol):
    """The mods' bias for one call as a `ModProgram`, or why not (a str)."""

    def __call__(
        self,
        batch: int,
        heads: int,
        n_q: int,
        n_k: int,
        keep: torch.Tensor | None,
        is_causal: bool,
        device: torch.device,
    ) -> ModProgram | str: ...
