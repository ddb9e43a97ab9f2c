"""The CPU block scheduler of mod attention: softmax attention whose scores and mask are
changed by FlexAttention-style mods (`playground.softmax_attention`), run over blocks of
queries so that keys a block cannot see are never touched.

`ModScheduler` holds one call's mods (already checked by their owner, which names the
hook when a result is wrong) and runs them on projected q, k, v:

- On every call, as FlexAttention builds its block mask, `mask_mod` (with causality) is
  evaluated into the span of keys each block of queries can see (`key_spans`): a mod may
  read state that changes between calls (document ids, a scheduled window), so nothing
  is kept from an earlier call. A window of w then costs O(n·(w + block)) attention time
  and memory, plus O(n²) cheap evaluations of the rule itself.
- Within a span, an additive `score_mod` (score + f(b, h, q, kv)) becomes a bias for
  fused SDPA (`span_mask`); any other is applied to explicit block scores.
- In training each block is recomputed in backward (activation checkpointing), so memory
  stays O(n · block) and parameters used in `score_mod` get their gradients; without a
  `score_mod`, when all blocks' masks together take no more than q, k and v (a window's
  do; a dense causal mask's do not), the masks are kept instead and every block goes to
  one `blocked_attention` call, whose fused backward adds each span's key gradients in
  place. FlexAttention has no CPU backward, which is why this path exists.

Which of its paths a call takes was decided once, by `mods.dispatch.cpu_path`: the
scheduler is given the `CpuPath` and runs it (a program, blocks of masked SDPA, or blocks
of explicit scores), never deciding again.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from playground.kernels.biased import biased_attention
from playground.kernels.blocked import blocked_attention
from playground.kernels.common import transforms_active
from playground.masks import masked_softmax
from playground.mods.dispatch import CpuPath
from playground.mods.grid import (
    PROGRAM_FINE_BLOCK,
    MaskMod,
    ScoreMod,
    Span,
    allowed_pairs,
    coarsest_spans,
    index_grid,
    offset_spans,
)
from playground.mods.kernel import program_attention
from playground.mods.program import ModProgram

MOD_CHUNK_ELEMENTS = 2**19
"""How many (b, h, q, kv) entries the CPU fast path evaluates a mod on per call."""
SPAN_CHUNK_ELEMENTS = 2**16
"""How many (q, kv) entries `mask_mod` is evaluated on per call while finding each block's
key span: the whole (Nq, Nk) grid is visited on every call, and at this size a mod's
integer intermediates stay in cache."""


@dataclass(frozen=True)
class ModScheduler:
    """One call's mods and the CPU schedule that runs them (module docstring)."""

    score_mod: ScoreMod | None
    """score_mod(score, b, h, q_idx, kv_idx): a floating tensor that broadcasts to its
    arguments' shape; None when the scores are not changed."""
    mask_mod: MaskMod | None
    """mask_mod(b, h, q_idx, kv_idx): bool (B or 1, H or 1, Nq, Nk), full size in the
    query and key dimensions; None when every key is allowed."""
    path: CpuPath
    """The path `mods.dispatch.cpu_path` chose for this call: `SDPA`, `PROGRAM`,
    `MASKED_BLOCKS` (an additive score_mod's f(b, h, q_idx, kv_idx) goes to fused SDPA as
    a bias) or `SCORE_BLOCKS`."""
    scale: float
    block_size: int
    """Queries per block: bounds working memory to (B, H, block_size, span)."""
    program: ModProgram | None = None
    """This call's mods as a program for the native kernels (`mods.lowering`), given
    with the `PROGRAM` path."""
    relative_mask: bool = False
    """mask_mod is proven a function of h and kv_idx − q_idx (`mods.structure.relative_mask`):
    the key spans then come from the offsets it allows, O(Nq + Nk)."""

    def key_spans(
        self,
        batch: int,
        heads: int,
        n_q: int,
        n_k: int,
        is_causal: bool,
        device: torch.device,
        block: int | None = None,
    ) -> list[Span]:
        """Per block of queries: (start, stop, key_start, key_stop), the keys from the
        first to the last any of its queries may see under mask_mod and causality (the
        padding mask is applied within the spans).

        Derived again on every call, as FlexAttention's block mask is: a mask_mod may read
        state that changes between calls of one shape (document ids set per batch, a
        window a schedule widens), and spans kept from an earlier call would silently
        drop the keys it now allows."""
        block = block or self.block_size
        if self.mask_mod is not None and self.relative_mask:
            return offset_spans(self.mask_mod, heads, n_q, n_k, is_causal, device, block)
        spans = []
        keys = torch.arange(n_k, device=device)
        # Rows per evaluation of the mod, so that its intermediates stay small.
        rows = max(1, min(block, SPAN_CHUNK_ELEMENTS // n_k))
        for start in range(0, n_q, block):
            stop = min(start + block, n_q)
            if self.mask_mod is None:  # causality at most: query i sees keys 0 … i
                spans.append((start, stop, 0, min(stop, n_k) if is_causal else n_k))
                continue
            seen = torch.zeros(n_k, dtype=torch.uint8, device=device)  # keys anyone here sees
            for first in range(start, stop, rows):
                queries = torch.arange(first, min(first + rows, stop), device=device)
                b, h, q_idx, kv_idx = index_grid(batch, heads, queries, keys)
                allowed = self.mask_mod(b, h, q_idx, kv_idx)
                if is_causal:
                    allowed = allowed & (q_idx >= kv_idx)
                # (B?, H?, rows, Nk) -> (Nk,); a max over bytes is vectorised, bool any is not.
                seen = seen.maximum(allowed.view(torch.uint8).amax(dim=(0, 1, 2)))
            where = seen.nonzero()
            key_start, key_stop = (int(where[0]), int(where[-1]) + 1) if len(where) else (0, 0)
            spans.append((start, stop, key_start, key_stop))
        return spans

    def span_mask(
        self,
        start: int,
        key_start: int,
        shape: tuple[int, int, int, int],
        keep: torch.Tensor | None,
        is_causal: bool,
        like: torch.Tensor,
        scratch: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """SDPA's attn_mask for one block of queries over its span of keys, and which of
        its queries see any key: (mask, sees) with mask (B, H or 1, blk, span), bool or
        the additive score_mod's bias with −inf where not allowed, and sees (B, H or 1,
        blk), None when every query sees some key; (None, None) when every query sees
        every key unbiased. `like` gives the bias its dtype and device; `scratch` (flat
        uint8), if given, holds the mask.

        The mods are evaluated a few rows at a time (MOD_CHUNK_ELEMENTS), so an eager
        mod's intermediates stay in cache; one pass over the whole block is several
        times slower than the attention it feeds."""
        batch, heads, block, span = shape
        keys = torch.arange(key_start, key_start + span, device=like.device)
        # A bias has a head dimension and is evaluated in chunks; a bool mask (mask_mod,
        # causality, padding) is small enough in one piece.
        rows = max(1, MOD_CHUNK_ELEMENTS // (batch * heads * span))
        rows = rows if self.score_mod is not None else block
        zero = torch.zeros((), dtype=like.dtype, device=like.device)
        masks: list[torch.Tensor] = []
        sees: list[torch.Tensor] = []
        for first in range(start, start + block, rows):
            queries = torch.arange(first, min(first + rows, start + block), device=keys.device)
            b, h, q_idx, kv_idx = index_grid(batch, heads, queries, keys)
            mask = None
            if self.score_mod is not None:  # f(b, h, q, kv), broadcast to this chunk's rows
                bias = self.score_mod(zero, b, h, q_idx, kv_idx).to(like.dtype)
                mask = bias.broadcast_to(
                    torch.broadcast_shapes(bias.shape, (1, 1, len(queries), span))
                )
            allowed = allowed_pairs(self.mask_mod, b, h, q_idx, kv_idx, keep, is_causal)
            if allowed is not None:  # None: every key seen
                allowed = allowed.expand(batch, -1, len(queries), span)
                mask = allowed if mask is None else mask.masked_fill(~allowed, -math.inf)
            if mask is not None:
                # A query sees a key when it may and its score there is finite (a score_mod
                # may give −inf): (B, H or 1, rows).
                if mask.dtype == torch.bool:
                    seen = mask.any(dim=-1).expand(batch, -1, -1)
                else:
                    seen = ~torch.isneginf(mask.detach().amax(dim=-1)).expand(batch, -1, -1)
                if not bool(seen.all()):
                    # A query that sees nothing would make SDPA's softmax NaN: let it see
                    # its first key (finite), and zero it afterwards.
                    first_key = ~seen[..., None] & (torch.arange(span, device=keys.device) == 0)
                    fill = True if mask.dtype == torch.bool else 0.0
                    mask = mask.masked_fill(first_key, fill)
                sees.append(seen)
            if mask is None:  # nothing hidden or biased: then the block is one chunk (rows)
                return None, None
            masks.append(mask)
        shape = (*masks[0].shape[:-2], block, span)
        out = None
        if scratch is not None:
            size = math.prod(shape) * masks[0].element_size()
            out = scratch[:size].view(masks[0].dtype).view(shape)
        seen_rows = torch.cat(sees, dim=-1) if sees else None
        if seen_rows is not None and bool(seen_rows.all()):
            seen_rows = None  # every query sees a key: nothing to zero
        return torch.cat(masks, dim=-2, out=out), seen_rows

    def attend_span(
        self,
        start: int,
        key_start: int,
        is_causal: bool,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        keep: torch.Tensor | None,
        scratch: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One block: q (B, H, blk, d) over the span's k, v (B, H, span, d) -> context
        (B, H, blk, d) and empty (B, blk) bool, the queries that see no key at all.
        `scratch`: memory for the block's mask (`span_mask`)."""
        batch, heads, block, span = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        sees: torch.Tensor | None  # (B, H or 1, blk): which queries see a key; None: all
        if self.path is CpuPath.SCORE_BLOCKS:
            assert self.score_mod is not None, "SCORE_BLOCKS is the path of a score_mod"
            b, h, q_idx, kv_idx = index_grid(
                batch,
                heads,
                torch.arange(start, start + block, device=q.device),
                torch.arange(key_start, key_start + span, device=q.device),
            )
            scores = q @ k.transpose(-2, -1) * self.scale  # (B, H, blk, span)
            scores = self.score_mod(scores, b, h, q_idx, kv_idx).to(q.dtype)
            scores = scores.broadcast_to(batch, heads, block, span)
            allowed = allowed_pairs(self.mask_mod, b, h, q_idx, kv_idx, keep, is_causal)
            if allowed is not None:  # None: every key seen
                scores = scores.masked_fill(~allowed, -math.inf)
            # A query sees a key when it may and its score there is finite (B, H, blk).
            sees = ~torch.isneginf(scores.amax(dim=-1))
            context = masked_softmax(scores, None) @ v
        else:
            mask, sees = self.span_mask(
                start, key_start, (batch, heads, block, span), keep, is_causal, q, scratch
            )
            if mask is not None and mask.requires_grad and not q.is_cuda:
                # A learned bias: SDPA would give it no gradient but on its unfused kernel.
                context = biased_attention(q, k, v, mask, self.scale)
            else:
                context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
            if sees is not None:
                context = context.masked_fill(~sees[..., None], 0.0)
        if sees is None:
            return context, torch.zeros(batch, block, dtype=torch.bool, device=q.device)
        return context, ~sees.any(dim=1)  # (B, H, blk, d), (B, blk)

    def mask_bytes(
        self,
        spans: list[Span],
        batch: int,
        heads: int,
        attention_mask: torch.Tensor | None,
        device: torch.device,
    ) -> int:
        """Bytes that every block's mask, kept for backward as SDPA keeps it (float, one
        per batch element and head it differs by), would take together."""
        b, h, q_idx, kv_idx = index_grid(
            batch,
            heads,
            torch.zeros(1, dtype=torch.long, device=device),
            torch.zeros(1, dtype=torch.long, device=device),
        )
        probe = self.mask_mod(b, h, q_idx, kv_idx) if self.mask_mod is not None else q_idx >= 0
        copies = (batch if attention_mask is not None else probe.shape[0]) * probe.shape[1]
        entries = sum(
            (stop - start) * (key_stop - key_start) for start, stop, key_start, key_stop in spans
        )
        return 4 * copies * entries

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attention_mask: torch.Tensor | None,
        is_causal: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """q (B, H, Nq, d), k and v (B, H, Nk, d) -> (context (B, H, Nq, d), empty
        (B, Nq, 1) bool, the queries that see no key, or None when there are none), on
        the path this scheduler was given."""
        if self.path is CpuPath.SDPA:
            # Nothing to mask but causality, which SDPA does itself: no blocks needed.
            context = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=self.scale)
            return context, None
        batch, heads, n_q, n_k = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        if self.path is CpuPath.PROGRAM:
            assert self.program is not None, "the PROGRAM path comes with its program"
            fine = min(self.block_size, PROGRAM_FINE_BLOCK)
            spans = self.key_spans(batch, heads, n_q, n_k, is_causal, q.device, fine)
            spans = coarsest_spans(spans, self.block_size)
            context, log_sum_exp = program_attention(q, k, v, spans, self.program, self.scale)
            empty = torch.isneginf(log_sum_exp).all(dim=1)[..., None]  # (B, Nq, 1)
            return context, empty if bool(empty.any()) else None
        spans = self.key_spans(batch, heads, n_q, n_k, is_causal, q.device)
        return self.attend_blocks(q, k, v, spans, attention_mask, is_causal)

    def attend_blocks(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        spans: list[Span],
        attention_mask: torch.Tensor | None,
        is_causal: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`attend` on torch's operations, block by block (the module docstring)."""
        batch, heads = q.shape[0], q.shape[1]
        # Training: recompute each block in backward, so only one block's scores live;
        # unless the blocks keep only a mask for backward (no score_mod), and all of
        # their masks together are no larger than q, k and v (a window, not a dense
        # causal mask): then keeping them costs less than running each block twice.
        # (torch.func transforms have no saved-tensor hooks, which checkpointing needs.)
        recompute = torch.is_grad_enabled() and len(spans) > 1 and not transforms_active()
        if recompute and self.score_mod is None:
            recompute = self.mask_bytes(spans, batch, heads, attention_mask, q.device) > (
                3 * q.numel() * q.element_size()
            )
        if torch.is_grad_enabled() and not q.is_cuda and not recompute:
            fused = self.attend_fused(q, k, v, spans, attention_mask, is_causal)
            if fused is not None:
                return fused
        scratch = None
        if not torch.is_grad_enabled() and self.path is not CpuPath.SCORE_BLOCKS:
            # Inference: every block's mask in one buffer, whose pages are then touched
            # once per call; a fresh large allocation per block costs as much in page
            # faults as evaluating the mod.
            widest = max(
                (stop - start) * (key_stop - key_start)
                for start, stop, key_start, key_stop in spans
            )
            # A bias (B, H, blk, span) in q's dtype, or a bool mask, which has a head
            # dimension when mask_mod depends on the head.
            per_entry = heads * (q.element_size() if self.score_mod is not None else 1)
            scratch = q.new_empty(batch * widest * per_entry, dtype=torch.uint8)
        contexts, empties = [], []
        for start, stop, key_start, key_stop in spans:
            if key_stop <= key_start:  # this block sees no key at all
                # Attention over no key: zero, yet in q's, k's and v's graph, so that
                # their gradients are zero (as the reference's), not missing.
                no_keys = k[:, :, :0]
                contexts.append(q[:, :, start:stop] @ no_keys.transpose(-2, -1) @ v[:, :, :0])
                empties.append(torch.ones(batch, stop - start, dtype=torch.bool, device=q.device))
                continue
            attend = functools.partial(
                self.attend_span, start, key_start, is_causal, scratch=scratch
            )
            arguments = (
                q[:, :, start:stop],
                k[:, :, key_start:key_stop],
                v[:, :, key_start:key_stop],
                None if attention_mask is None else attention_mask[:, key_start:key_stop],
            )
            if recompute:
                context, empty = checkpoint(attend, *arguments, use_reentrant=False)
            else:
                context, empty = attend(*arguments)
            contexts.append(context)
            empties.append(empty)
        context = torch.cat(contexts, dim=2)  # (B, H, Nq, d)
        empty = torch.cat(empties, dim=1)[..., None]  # (B, Nq, 1)
        return context, empty if empty.any() else None

    def attend_fused(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        spans: list[Span],
        attention_mask: torch.Tensor | None,
        is_causal: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """Training on CPU when every block's mask is kept: one `blocked_attention` call
        over all blocks, whose backward adds each span's key gradients in place (autograd
        through per-block slices would give every block a zero tensor the size of all
        the keys). -> (context (B, H, Nq, d), empty (B, Nq, 1) or None), or None when this
        path does not apply: a score_mod that is not additive, or a bias that needs a
        gradient (the per-block path gives it one)."""
        if self.path is CpuPath.SCORE_BLOCKS:
            return None
        batch, heads = q.shape[0], q.shape[1]
        masks: list[torch.Tensor | None] = []
        seen_parts: list[torch.Tensor] = []
        for start, stop, key_start, key_stop in spans:
            if key_stop <= key_start:
                masks.append(None)
                seen_parts.append(
                    torch.zeros(batch, 1, stop - start, dtype=torch.bool, device=q.device)
                )
                continue
            keep = None if attention_mask is None else attention_mask[:, key_start:key_stop]
            shape = (batch, heads, stop - start, key_stop - key_start)
            mask, sees = self.span_mask(start, key_start, shape, keep, is_causal, q)
            if mask is not None and mask.requires_grad:
                return None
            masks.append(mask)
            seen_parts.append(
                torch.ones(batch, 1, stop - start, dtype=torch.bool, device=q.device)
                if sees is None
                else sees
            )
        context = blocked_attention(q, k, v, spans, masks, self.scale)
        seen = torch.cat(
            [rows.expand(batch, heads, -1) for rows in seen_parts], dim=-1
        )  # (B, H, Nq)
        if bool(seen.all()):
            return context, None
        context = context.masked_fill(~seen[..., None], 0.0)
        return context, ~seen.any(dim=1)[..., None]
