"""`relative_bias_attention`: softmax(scale · q kᵀ + T) v with a Toeplitz bias T (one value
per head and relative position j − i), blocked over queries, each block's bias a strided view;
`hankel_biased_attention` per block (or `_NativeRelativeBias` over all of them) when T needs a
gradient."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from playground.kernels import native
from playground.kernels.biased import (
    BackwardScratch,
    hankel_biased_attention,
    hankel_mask,
    native_hankel_backward,
    second_order_biased,
)
from playground.kernels.common import transforms_active


def _block_view(
    bias: torch.Tensor, keep: torch.Tensor | None, start: int, stop: int, n_k: int, causal: bool
) -> tuple[int, torch.Tensor, torch.Tensor | None]:
    """What queries start … stop − 1 see, keys reversed (j' = Nk − 1 − j): the first key
    index (a causal block sees keys j <= stop − 1 only: reversed indices from Nk − stop),
    the block's bias diagonals (H, block + Nk − first − 1) and its keys' mask, or None."""
    first = max(0, n_k - stop) if causal else 0
    block_keep = None if keep is None else keep[..., first:]
    return first, bias[:, start + first : stop + n_k - 1], block_keep


class _NativeRelativeBias(torch.autograd.Function):
    """`relative_bias_attention`'s training path where `playground.kernels.native` is built.

    forward: the CPU flash kernel block by block, as `hankel_biased_attention` does (each
    block's bias a strided view, a causal block's later keys skipped), keeping every
    block's O and L. backward: one native call over all queries, which tiles them itself,
    accumulates dK and dV in place and sums dS along anti-diagonals into the bias
    gradient: no per-block gradients to allocate, zero and add up.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, keep, scale, block_size, is_causal):
        n_q, n_k = q.shape[2], k.shape[2]
        outs, sums = [], []
        for start in range(0, n_q, block_size):
            stop = min(start + block_size, n_q)
            first, windows, block_keep = _block_view(bias, keep, start, stop, n_k, is_causal)
            out, log_sum_exp = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q[:, :, start:stop],
                k[:, :, first:],
                v[:, :, first:],
                attn_mask=hankel_mask(windows, block_keep, n_k - first),
                scale=scale,
            )
            outs.append(out)
            sums.append(log_sum_exp)
        out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)  # (B, H, Nq, d)
        log_sum_exp = sums[0] if len(sums) == 1 else torch.cat(sums, dim=2)  # (B, H, Nq)
        ctx.save_for_backward(q, k, v, bias, keep, out, log_sum_exp)
        ctx.scale, ctx.is_causal = scale, is_causal
        return out

    @staticmethod
    def backward(ctx, grad_out):
        if torch.is_grad_enabled():  # create_graph=True
            return (*second_order_biased(ctx, grad_out, True), None, None, None, None)
        dtype = ctx.saved_tensors[0].dtype
        grads = native_hankel_backward(ctx, grad_out, ctx.is_causal)
        return (*(g.to(dtype) for g in grads), None, None, None, None)


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
    `hankel_biased_attention`, which keeps O(block) per block and sums the bias gradient
    along the anti-diagonals in its own backward; SDPA would fall back to its unfused kernel
    and keep every block's probabilities. Under dropout, SDPA's unfused kernel runs and each
    block is recomputed in backward (activation checkpointing), so memory stays at one
    block's worth.
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
        first, windows, block_keep = _block_view(bias, keep, start, stop, n_k, is_causal)
        if fused_gradient:
            return hankel_biased_attention(
                q_block, k[:, :, first:], v[:, :, first:], windows, scale, block_keep, scratch
            )
        return F.scaled_dot_product_attention(
            q_block,
            k[:, :, first:],
            v[:, :, first:],
            attn_mask=hankel_mask(windows, block_keep, n_k - first),
            dropout_p=dropout_p,
            scale=scale,
        )  # (B, H, block, d)

    # The bias needs a gradient: the fused forward and backward above, which keep nothing
    # of size (block, Nk), so no recomputation either. Otherwise SDPA's flash kernel keeps
    # its mask for backward, a view unless padding made it a (B, H, block, Nk) tensor, and
    # under dropout its unfused kernel keeps the probabilities: then each block is
    # recomputed in backward instead.
    fused_gradient = (
        torch.is_grad_enabled()
        and bias.requires_grad
        and dropout_p == 0.0
        and not q.is_cuda
        and not transforms_active()
    )
    if fused_gradient and q.dtype != torch.float64 and native.load() is not None:
        # Keys contiguous once here, not strided rows in every tile's products.
        return _NativeRelativeBias.apply(
            q, k.contiguous(), v.contiguous(), bias, keep, scale, block_size, is_causal
        )
    scratch = BackwardScratch() if fused_gradient else None
    recompute = (
        torch.is_grad_enabled()
        and n_q > block_size
        and not fused_gradient
        and (keep is not None or dropout_p > 0.0)
        and not transforms_active()  # torch.func has no saved-tensor hooks
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
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=2)  # (B, H, Nq, d)
