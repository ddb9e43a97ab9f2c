"""Fast attention kernels a variant's fast path can be made of, each tested against a dense
reference (tests/test_kernels.py). They take projected tensors and return contexts; the
variant keeps its projections, its rules for which token is which, and its output.

- `banded_attention`: each query sees the keys within a band around it, plus a few prefix
  keys (global tokens) that every query may see; O(N · (band + G)) time and memory.
- `biased_attention`: softmax(scale · q kᵀ + bias) v on the CPU flash kernel with a fused
  backward that gives the bias its gradient too (SDPA gives none for a mask).
- `relative_bias_attention`: softmax(scale · q kᵀ + T) v with a Toeplitz bias T (one value
  per head and relative position j − i), blocked over queries, `biased_attention` per
  block when T needs a gradient.

Both run on torch's fused `scaled_dot_product_attention` and are differentiable.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch.utils.checkpoint import checkpoint

BAND_BLOCK = 64
"""Queries per block of `banded_attention` (fewer when the band is narrower). A block sees
its whole chunks of keys, about BAND_BLOCK + band keys for band + 1 useful ones, so smaller
blocks waste less work but make smaller matrix products."""


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where allowed, −inf elsewhere."""
    return torch.zeros_like(allowed, dtype=dtype).masked_fill(~allowed, -math.inf)


def banded_attention(
    queries: torch.Tensor,
    keys_values: torch.Tensor,
    key_ok: torch.Tensor,
    num_heads: int,
    before: int,
    after: int,
    prefix_keys_values: torch.Tensor | None = None,
    prefix_ok: torch.Tensor | None = None,
    prefix_positions: torch.Tensor | None = None,
    block: int = BAND_BLOCK,
) -> torch.Tensor:
    """Banded multi-head attention over one sequence of tokens -> context (B, N, E).

    queries (B, N, E) and keys_values (B, N, 2E) (keys then values, one product of both
    projections) are projected, heads not yet split. Query i sees key j when
    i − before <= j <= i + after and key_ok[b, j] (B, N) bool, and sees prefix key g
    (prefix_keys_values (B, G, 2E)) when prefix_ok[b, g] and, if prefix_positions (B, G)
    is given, when prefix_positions[b, g] <= i (causal prefix keys).

    A row that would see no key is let see its own key, so that nothing is NaN: its output
    is meaningless, and the caller replaces or zeroes it.

    How: keys are cut into chunks of `block`, each chunk preceded by the G prefix keys, so
    all a block of queries may see (its band's chunks, the prefix of the first) is one
    contiguous stretch of that buffer; one SDPA call per sequence over (blocks, H, block,
    span) reads the overlapping stretches as a strided view, with no per-block copies.
    """
    batch, n, width = queries.shape
    block = max(1, min(block, max(before, after, 1), n))
    num_blocks = -(-n // block)
    chunks_before = min(-(-before // block), num_blocks - 1)
    chunks_after = min(-(-after // block), num_blocks - 1)
    num_prefix = 0 if prefix_keys_values is None else prefix_keys_values.shape[1]
    rows = num_prefix + block  # buffer rows per chunk
    span = (chunks_before + 1 + chunks_after) * rows  # buffer rows a block of queries sees

    def chunked(tensor: torch.Tensor, fill, prefix: torch.Tensor | None) -> torch.Tensor:
        """(B, N, C) and (B, G, C) -> (B, chunks·rows, C): [G prefix, block keys] per
        chunk, `fill` past the ends. Written in place: each element is copied once."""
        chunks = chunks_before + num_blocks + chunks_after
        buffer = tensor.new_empty(batch, chunks, rows, tensor.shape[-1])
        if prefix is not None:
            buffer[:, :, :num_prefix] = prefix[:, None]
        keys = buffer[:, :, num_prefix:]  # (B, chunks, block, C)
        full, rest = divmod(n, block)  # whole chunks of keys, keys in the last one
        keys[:, :chunks_before] = fill
        keys[:, chunks_before : chunks_before + full] = tensor[:, : full * block].unflatten(
            1, (full, block)
        )
        keys[:, chunks_before + full :] = fill
        if rest:
            keys[:, chunks_before + full, :rest] = tensor[:, full * block :]
        return buffer.flatten(1, 2)

    def spans(buffer: torch.Tensor) -> torch.Tensor:
        """(B, chunks·rows, C) -> (B, blocks, span, C), a view (spans overlap)."""
        return buffer.unfold(1, span, rows).transpose(-1, -2)

    # (Rebinding the name frees the unchunked tensor once it is in the buffer.)
    keys_values = spans(chunked(keys_values, 0.0, prefix_keys_values))
    keys, values = keys_values.split(width, dim=-1)  # (B, blocks, span, E) each, views
    if prefix_ok is None and num_prefix:
        prefix_ok = torch.ones(batch, num_prefix, dtype=torch.bool, device=queries.device)
    prefix_flags = None if prefix_ok is None else prefix_ok[..., None]
    ok = spans(chunked(key_ok[..., None], False, prefix_flags))[..., 0]  # (B, blocks, span)

    # Which columns of a span lie within each query's band; the prefix slots of the
    # first chunk only (the same for every block). -> (block, span)
    query = torch.arange(block, device=queries.device)[:, None]  # within its block
    column = torch.arange(span, device=queries.device)
    chunk, slot = column // rows, column % rows  # (span,)
    offset = query - (chunk - chunks_before) * block - (slot - num_prefix)  # query - key
    in_band = (offset <= before) & (offset >= -after)
    seen = torch.where(slot < num_prefix, chunk == 0, in_band)
    mask = _additive(ok, queries.dtype)[:, :, None, :] + _additive(seen, queries.dtype)
    if prefix_positions is not None and num_prefix:
        query_position = torch.arange(num_blocks * block, device=queries.device)
        future = prefix_positions[:, None, None, :] > query_position.view(num_blocks, block, 1)
        mask[..., :num_prefix].masked_fill_(future, -math.inf)  # (B, blocks, block, G)
    # A row that sees nothing would make SDPA return NaN: it sees its own key instead.
    empty = torch.isneginf(mask).all(dim=-1)  # (B, blocks, block)
    own = chunks_before * rows + num_prefix  # the column of query 0's own key
    mask[..., own : own + block].diagonal(dim1=-2, dim2=-1).masked_fill_(empty, 0.0)

    if num_blocks * block > n:
        queries = F.pad(queries, (0, 0, 0, num_blocks * block - n))  # (B, blocks·block, E)
    h = num_heads
    queries = rearrange(queries, "b (nb blk) (h d) -> b nb h blk d", blk=block, h=h)
    # One call per sequence: the blocks of a sequence share one stride into the buffer.
    contexts = [
        F.scaled_dot_product_attention(
            queries[b],  # (blocks, H, block, d)
            rearrange(keys[b], "nb s (h d) -> nb h s d", h=h),  # (blocks, H, span, d)
            rearrange(values[b], "nb s (h d) -> nb h s d", h=h),
            attn_mask=mask[b, :, None],  # (blocks, 1, block, span)
        ).transpose(1, 2)  # (blocks, block, H, d): SDPA's memory order for such queries
        for b in range(batch)
    ]
    context = contexts[0][None] if batch == 1 else torch.stack(contexts)
    context = rearrange(context, "b nb blk h d -> b (nb blk) (h d)")
    return context[:, :n]  # (B, N, E)


class _FlashWithBiasGradient(torch.autograd.Function):
    """softmax(scale · q kᵀ + bias) v for one block, with the gradient of the bias too
    (SDPA gives none for `attn_mask`, and falls back to its unfused kernel when the mask
    needs one).

    forward: the CPU flash kernel, keeping its output O and per-row log-sum-exp L; saved
    for backward are only these, the inputs and `bias` as given (no (blk, Nk) tensor
    when it is a view, as in `relative_bias_attention`) and padding as a (B, Nk) mask.
    backward, from the block's recomputed probabilities P = exp(scale · q kᵀ + bias − L):
    dv = Pᵀ dO, dP = dO vᵀ, dS = P ⊙ (dP − rowsum(dO ⊙ O)), dq = scale · dS k,
    dk = scale · dSᵀ q, and the bias gets dS summed over what it broadcasts: five products,
    as many as the flash backward's own, which cannot return dS.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, keep, scale):
        mask = bias if keep is None else bias.masked_fill(~keep, -math.inf)
        out, log_sum_exp = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, attn_mask=mask, scale=scale
        )  # a row that sees no key: O = 0, L = 0
        ctx.save_for_backward(q, k, v, bias, keep, out, log_sum_exp)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, bias, keep, out, log_sum_exp = ctx.saved_tensors
        dtype = q.dtype
        if dtype in (torch.bfloat16, torch.float16):
            # The flash kernel keeps L in float32; the backward runs there too, as SDPA's
            # own low-precision backward accumulates in float32.
            q, k, v, bias, out, grad_out = (t.float() for t in (q, k, v, bias, out, grad_out))
        mask = bias if keep is None else bias.masked_fill(~keep, -math.inf)
        batch, heads, block, n_k = *q.shape[:3], k.shape[2]
        q, k, v = q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)  # (B·H, ·, d)
        grad_out, out = grad_out.flatten(0, 1), out.flatten(0, 1)
        scores = torch.bmm(q * ctx.scale, k.transpose(1, 2)).view(batch, heads, block, n_k)
        # In the forward's order, scale · q kᵀ + bias, then − L: large logits lose less.
        scores = scores.add_(mask).sub_(log_sum_exp.to(scores.dtype)[..., None]).flatten(0, 1)
        # exp is many times slower below −87, where float32 underflows, than above it:
        # clamp there, then set what was clamped (P <= 1.65e−38: every hidden key) to 0.
        probabilities = F.threshold_(scores.clamp_(min=-87.0).exp_(), 1.7e-38, 0.0)  # P
        grad_v = torch.bmm(probabilities.transpose(1, 2), grad_out)
        row_dot = (grad_out * out).sum(dim=-1, keepdim=True)  # rowsum(dO ⊙ O)
        grad_scores = torch.bmm(grad_out, v.transpose(1, 2)).sub_(row_dot)  # dP − rowsum
        grad_scores = grad_scores.mul_(probabilities)  # dS
        grad_q = torch.bmm(grad_scores, k).mul_(ctx.scale)
        grad_k = torch.bmm(grad_scores.transpose(1, 2), q).mul_(ctx.scale)
        grad_bias = grad_scores.view(batch, heads, block, n_k).sum_to_size(bias.shape)
        shape = (batch, heads, -1, q.shape[-1])
        return (
            grad_q.view(shape).to(dtype),
            grad_k.view(shape).to(dtype),
            grad_v.view(shape).to(dtype),
            grad_bias.to(dtype),
            None,
            None,
        )


def biased_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    scale: float,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(scale · q kᵀ + bias) v -> (B, H, Nq, d) on the CPU flash kernel, with the
    gradient of `bias` as well as of q, k and v (`_FlashWithBiasGradient`).

    q (B, H, Nq, d), k and v (B, H, Nk, d); bias broadcasts to (B, H, Nq, Nk) and may be
    a view (it is what is kept for backward, with `keep`); keep (B, 1, 1, Nk) bool, if
    given, hides keys (−inf). A row that sees no key outputs 0.
    """
    return _FlashWithBiasGradient.apply(q, k, v, bias, keep, scale)


def relative_bias_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    relative_bias: torch.Tensor,
    attention_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float,
    block_size: int,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """softmax(scale · q kᵀ + T) v -> context (B, H, Nq, d), blocked over queries.

    q (B, H, Nq, d), k and v (B, H, Nk, d). relative_bias (H, Nq + Nk − 1): entry
    r + Nq − 1 is the bias of relative position r = j − i, so T[h, i, j] =
    relative_bias[h, j − i + Nq − 1], a Toeplitz matrix. attention_mask (B, Nk) bool, True
    = a real key; `is_causal` hides keys j > i. A query that sees no key gets whatever
    SDPA gives (zero its output: `playground.masks.queries_without_keys`).

    How: with the keys reversed (j' = Nk − 1 − j) the bias depends on i + j' only, so each
    query's row of T is a window of one vector, and a block's (block, Nk) bias is a strided
    view of it, never materialised as an (Nq, Nk) matrix. SDPA's fused kernel then reads it
    as an additive mask; in inference without padding all queries go in one call.
    In training, when the bias needs a gradient (a learned bias), each block runs on
    `biased_attention`, which keeps O(block) per block and forms the bias gradient
    in its own backward; SDPA would fall back to its unfused kernel and keep every
    block's probabilities. Under dropout, SDPA's unfused kernel runs and each block is
    recomputed in backward (activation checkpointing), so memory stays at one block's worth.
    """
    n_q, n_k = q.shape[2], k.shape[2]
    k, v = k.flip(2), v.flip(2)  # key j at index Nk − 1 − j
    # Entry t of the reversed vector is relative position Nk − 1 − t; contiguous so that
    # the mask rows are unit-stride, which the fused kernel reads without a copy.
    bias = relative_bias.flip(-1).to(q.dtype).contiguous()  # (H, Nq + Nk − 1)
    if is_causal:
        # t < Nk − 1 are relative positions j − i > 0: keys in the query's future.
        bias = bias.index_fill(1, torch.arange(n_k - 1, device=bias.device), float("-inf"))
    keep = None if attention_mask is None else attention_mask.flip(-1)[:, None, None, :]

    def attend_block(start: int, stop: int, q_block, k, v, bias, keep) -> torch.Tensor:
        # A causal block sees keys j <= stop − 1 only: reversed indices from Nk − stop.
        first = max(0, n_k - stop) if is_causal else 0
        windows = bias[:, start + first : stop + n_k - 1]  # diagonals of this block
        mask = windows.unfold(1, n_k - first, 1)[None]  # (1, H, block, Nk − first), a view
        block_keep = None if keep is None else keep[..., first:]
        if fused_gradient:
            return biased_attention(
                q_block, k[:, :, first:], v[:, :, first:], mask, scale, block_keep
            )
        if keep is not None:
            mask = mask.masked_fill(~block_keep, float("-inf"))  # (B, H, block, ·)
        return F.scaled_dot_product_attention(
            q_block,
            k[:, :, first:],
            v[:, :, first:],
            attn_mask=mask,
            dropout_p=dropout_p,
            scale=scale,
        )  # (B, H, block, d)

    # The bias needs a gradient: the fused forward and backward above, which keep nothing
    # of size (block, Nk), so no recomputation either. Otherwise SDPA's flash kernel keeps
    # its mask for backward, a view unless padding made it a (B, H, block, Nk) tensor, and
    # under dropout its unfused kernel keeps the probabilities: then each block is
    # recomputed in backward instead.
    fused_gradient = (
        torch.is_grad_enabled() and bias.requires_grad and dropout_p == 0.0 and not q.is_cuda
    )
    recompute = (
        torch.is_grad_enabled()
        and n_q > block_size
        and not fused_gradient
        and (keep is not None or dropout_p > 0.0)
    )
    if not torch.is_grad_enabled() and keep is None:
        block_size = n_q  # nothing of size (block, Nk) is formed: one call is enough
    blocks = []
    for start in range(0, n_q, block_size):
        stop = min(start + block_size, n_q)
        arguments = (start, stop, q[:, :, start:stop], k, v, bias, keep)
        if recompute:
            blocks.append(checkpoint(attend_block, *arguments, use_reentrant=False))
        else:
            blocks.append(attend_block(*arguments))
    return torch.cat(blocks, dim=2)  # (B, H, Nq, d)
