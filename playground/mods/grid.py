"""How the mods are called (`SoftmaxAttention`'s score_mod and mask_mod, FlexAttention's
convention): their protocols, the broadcast index grid they are evaluated on, the pairs a
mask_mod, causality and padding allow together, and the spans of keys blocks of queries
see (`Span`, merged into the coarsest blocks that compute barely more pairs); a relative
score_mod evaluated once per offset."""

from __future__ import annotations

from typing import Protocol

import torch


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


Span = tuple[int, int, int, int]
"""(start, stop, key_start, key_stop): a block of queries and the keys it may see."""
PROGRAM_FINE_BLOCK = 64
"""The program path's spans are found per this many queries, then merged into the largest
blocks (up to block_size) that compute barely more pairs: a narrow band keeps blocks
small, where a block of 256 over a band of 129 keys would compute three times its pairs,
and dense attention keeps them large, where the products are most efficient."""
MERGE_SLACK = 1.1
"""How many more (query, key) pairs a coarser block may compute than the finest."""


def coarsest_spans(fine: list[Span], block_size: int) -> list[Span]:
    """`fine` spans (consecutive blocks of queries) merged in groups of 2^k, for the largest
    2^k · fine block ≤ block_size whose blocks compute at most MERGE_SLACK times the
    finest's (query, key) pairs; a merged block sees the hull of its parts' keys."""

    def merged(group: int) -> list[Span]:
        spans = []
        for first in range(0, len(fine), group):
            part = [span for span in fine[first : first + group]]
            seen = [span for span in part if span[3] > span[2]]
            key_start = min((span[2] for span in seen), default=0)
            key_stop = max((span[3] for span in seen), default=0)
            spans.append((part[0][0], part[-1][1], key_start, key_stop))
        return spans

    def pairs(spans: list[Span]) -> int:
        return sum(
            (stop - start) * (key_stop - key_start) for start, stop, key_start, key_stop in spans
        )

    if not fine:
        return fine
    rows = fine[0][1] - fine[0][0]
    best, group = fine, 2
    while rows * group <= block_size:
        candidate = merged(group)
        if pairs(candidate) > MERGE_SLACK * pairs(fine):
            break
        best, group = candidate, group * 2
    return best


def offset_grid(
    heads: int, n_q: int, n_k: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The relative offsets r = kv − q from −(Nq − 1) to Nk − 1 (R,) and index tensors
    b (1,1,1,1), h (1,H,1,1), q_idx and kv_idx (1,1,1,R) that hold one in-range pair per
    offset, (q, kv) = (−r, 0) for r < 0 and (0, r) otherwise: a mod of kv − q alone,
    evaluated on them, gives its value per offset, and a mod that looks indices up in a
    table stays in it."""
    offsets = torch.arange(-(n_q - 1), n_k, device=device)
    b, h, q_idx, kv_idx = index_grid(1, heads, (-offsets).clamp(min=0), offsets.clamp(min=0))
    return offsets, b, h, q_idx.view(1, 1, 1, -1), kv_idx


def score_per_offset(
    score_mod: ScoreMod, heads: int, n_q: int, n_k: int, like: torch.Tensor
) -> torch.Tensor:
    """(H, Nq + Nk − 1): g(h, r) of a relative score_mod (score + g(h, kv − q)) for
    r = kv_idx − q_idx from −(Nq − 1) to Nk − 1, evaluated once per offset at the in-range
    pairs of `offset_grid`, for `relative_bias_attention`'s Toeplitz view; in `like`'s
    dtype and on its device."""
    offsets, b, h, q_idx, kv_idx = offset_grid(heads, n_q, n_k, like.device)
    zero = torch.zeros((), dtype=like.dtype, device=like.device)
    bias = score_mod(zero, b, h, q_idx, kv_idx)
    return bias.to(like.dtype).broadcast_to(1, heads, 1, len(offsets))[0, :, 0]


def offset_spans(
    mask_mod: MaskMod,
    heads: int,
    n_q: int,
    n_k: int,
    is_causal: bool,
    device: torch.device,
    block: int,
) -> list[Span]:
    """`ModScheduler.key_spans` of a relative mask_mod (a function of h and kv − q only):
    the offsets r = kv − q it allows (in any head, evaluated at in-range pairs (−r, 0) or
    (0, r), as for a relative score_mod), and for each block of queries the hull of q + r
    over them, within the keys; O(Nq + Nk) evaluations, O(blocks · log) for the spans."""
    offsets, b, h, q_idx, kv_idx = offset_grid(heads, n_q, n_k, device)
    allowed = mask_mod(b, h, q_idx, kv_idx)  # (1, H or 1, 1, R)
    allowed = allowed.reshape(-1, len(offsets)).any(dim=0)
    if is_causal:
        allowed &= offsets <= 0
    seen = offsets[allowed]  # the offsets some query may see, ascending
    starts = torch.arange(0, n_q, block, device=device)
    stops = (starts + block).clamp(max=n_q)
    # A query q of the block reaches a key with offset r when 0 <= q + r < Nk: r from
    # 1 − stop to Nk − 1 − start, the first and last such r of `seen` by binary search.
    first = torch.searchsorted(seen, 1 - stops)
    last = torch.searchsorted(seen, n_k - 1 - starts, right=True) - 1
    reaches = first <= last
    if len(seen) == 0:
        key_starts = key_stops = torch.zeros_like(starts)
    else:
        low = seen[first.clamp(max=len(seen) - 1)]
        high = seen[last.clamp(min=0)]
        key_starts = torch.where(reaches, (starts + low).clamp(min=0), 0)
        key_stops = torch.where(reaches, (stops + high).clamp(max=n_k), 0)
    return list(
        zip(starts.tolist(), stops.tolist(), key_starts.tolist(), key_stops.tolist(), strict=True)
    )
