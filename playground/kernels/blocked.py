"""`blocked_attention`: blocks of queries, each over its own span of keys with a mask; on
CPU one fused forward and one fused backward (`_FlashBlocks`) over all of them. The same
blocks with each row's bias computed by a mod program are `mods.kernel.program_attention`,
which shares `native_blocks` and `check_blocks`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from playground.kernels import native
from playground.kernels.common import (
    additive,
    differentiable_gradients,
    rows_unit_stride,
    transforms_active,
)
from playground.kernels.reference import dense_attention

Block = tuple[int, int, int, int]
"""(start, stop, key_start, key_stop): a block of queries and the span of keys it sees."""


class _FlashBlocks(torch.autograd.Function):
    """`blocked_attention` on CPU: in float32 where `playground.kernels.native` is built, its
    blocked forward and backward over every block at once; elsewhere the flash kernel per
    block, keeping the per-row log-sum-exp, and its own backward per block. Either way
    each span's key and value gradients are added in place onto the keys' and values',
    where autograd through per-block slices would give each block a zero tensor the size
    of all the keys. Under create_graph=True, torch's own operations instead
    (`differentiable_gradients`)."""

    # ctx: torch's FunctionCtx, carrying this Function's own attributes (blocks, scale).
    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        blocks: tuple[Block, ...],
        masks: Sequence[torch.Tensor | None],
        scale: float,
    ) -> torch.Tensor:
        if q.dtype == torch.float32 and (kernels := native.load()) is not None:
            out, log_sum_exp = kernels.blocked_forward(
                *(rows_unit_stride(t) for t in (q, k, v)),
                native_blocks(blocks),
                _native_masks(masks, q),
                scale,
            )
        else:
            batch, heads, n_q = q.shape[:3]
            out = torch.zeros_like(q, memory_format=torch.contiguous_format)
            lse_dtype = torch.promote_types(q.dtype, torch.float32)  # the flash kernel's
            log_sum_exp = q.new_zeros(batch, heads, n_q, dtype=lse_dtype)
            for (start, stop, key_start, key_stop), mask in zip(blocks, masks, strict=True):
                if key_stop <= key_start or stop <= start:
                    continue  # no keys: 0
                out[:, :, start:stop], log_sum_exp[:, :, start:stop] = (
                    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                        q[:, :, start:stop],
                        k[:, :, key_start:key_stop],
                        v[:, :, key_start:key_stop],
                        attn_mask=mask,
                        scale=scale,
                    )
                )
        ctx.save_for_backward(q, k, v, out, log_sum_exp, *masks)
        ctx.blocks, ctx.scale = blocks, scale
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, log_sum_exp, *masks = ctx.saved_tensors
        blocks: tuple[Block, ...] = ctx.blocks
        scale: float = ctx.scale
        if torch.is_grad_enabled():  # create_graph=True

            def recompute() -> torch.Tensor:
                context = torch.zeros_like(q)
                for (start, stop, key_start, key_stop), mask in zip(blocks, masks, strict=True):
                    if key_stop > key_start and stop > start:
                        keys = slice(key_start, key_stop)
                        context[:, :, start:stop] = dense_attention(
                            q[:, :, start:stop], k[:, :, keys], v[:, :, keys], mask, scale
                        )
                return context

            return (*differentiable_gradients((q, k, v), grad_out, recompute), None, None, None)
        # Contiguous: whatever layout k and v came in (an expanded view, a transposed
        # cache), the gradients are written row by row.
        grad_k = torch.zeros(k.shape, dtype=k.dtype)
        grad_v = torch.zeros(v.shape, dtype=v.dtype)
        if q.dtype == torch.float32 and (kernels := native.load()) is not None:
            grad_q = kernels.blocked_backward(
                *(rows_unit_stride(t) for t in (q, k, v, out)),
                log_sum_exp,
                rows_unit_stride(grad_out),
                grad_k,
                grad_v,
                native_blocks(blocks),
                _native_masks(masks, q),
                scale,
            )
            return grad_q, grad_k, grad_v, None, None, None
        grad_q = torch.zeros_like(q)
        for (start, stop, key_start, key_stop), mask in zip(blocks, masks, strict=True):
            if key_stop <= key_start or stop <= start:
                continue
            keys = slice(key_start, key_stop)
            dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grad_out[:, :, start:stop],
                q[:, :, start:stop],
                k[:, :, keys],
                v[:, :, keys],
                out[:, :, start:stop],
                log_sum_exp[:, :, start:stop].contiguous(),
                0.0,
                False,
                attn_mask=mask,
                scale=scale,
            )
            grad_q[:, :, start:stop] = dq
            grad_k[:, :, keys] += dk
            grad_v[:, :, keys] += dv
        return grad_q, grad_k, grad_v, None, None, None


# torch leaves Function.apply unannotated; its signature is the forward's, less ctx.
_flash_blocks: Callable[
    [
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
        tuple[Block, ...],
        Sequence[torch.Tensor | None],
        float,
    ],
    torch.Tensor,
] = _FlashBlocks.apply


def _block_mask(mask: torch.Tensor, dtype: torch.dtype, rows: int, span: int) -> torch.Tensor:
    """A block's mask as the kernels read it: additive in `dtype` (bool: 0 / −inf), 4-D
    (1 or B, 1 or H, rows, span) with unit-stride rows (broadcast rows may be stride 0)."""
    if mask.dtype == torch.bool:
        mask = additive(mask, dtype)
    try:
        shape = torch.broadcast_shapes(mask.shape, (1, 1, rows, span))
    except RuntimeError:
        shape = ()
    if len(shape) != 4:
        raise ValueError(
            f"a block's mask must broadcast to (B, H, {rows}, {span}); got {tuple(mask.shape)}"
        )
    mask = mask.to(dtype).broadcast_to(shape)
    return mask if mask.stride(-1) == 1 or span == 1 else mask.contiguous()


def native_blocks(blocks: Sequence[Block]) -> torch.Tensor:
    """Blocks as `playground.kernels.native` takes them: (blocks, 4) int64."""
    return torch.tensor(blocks, dtype=torch.long).view(-1, 4)


def _native_masks(masks: Sequence[torch.Tensor | None], like: torch.Tensor) -> list[torch.Tensor]:
    """Masks as `playground.kernels.native` takes them: an empty tensor for none."""
    return [like.new_empty(0) if mask is None else mask for mask in masks]


def check_blocks(blocks: Sequence[Block], n_q: int, n_k: int) -> None:
    """Blocks within the queries and keys, their queries disjoint (a query in two blocks
    would have two outputs): else a ValueError that names the block."""
    covered = 0
    for index, (start, stop, key_start, key_stop) in sorted(
        enumerate(blocks), key=lambda item: item[1][0]
    ):
        if not (0 <= start <= stop <= n_q and 0 <= key_start <= key_stop <= n_k):
            raise ValueError(
                f"block {index} {(start, stop, key_start, key_stop)} lies outside the "
                f"{n_q} queries or {n_k} keys; give 0 <= start <= stop <= Nq and "
                f"0 <= key_start <= key_stop <= Nk"
            )
        if start < covered and stop > start:
            raise ValueError(
                f"block {index} {(start, stop, key_start, key_stop)} shares queries with "
                f"another block; each query belongs to one block at most"
            )
        covered = max(covered, stop)


def blocked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    blocks: Sequence[Block],
    masks: Sequence[torch.Tensor | None],
    scale: float,
) -> torch.Tensor:
    """Blocks of queries, each over its own span of keys -> context (B, H, Nq, d).

    q (B, H, Nq, d), k and v (B, H, Nk, d). blocks[i] = (start, stop, key_start,
    key_stop): queries start … stop − 1 see only keys key_start … key_stop − 1, further
    limited by masks[i]: None (every key of the span), bool (True: seen) or an additive
    float bias, broadcastable to (B, H, stop − start, key_stop − key_start); a mask gets
    no gradient (a learned bias: `biased_attention`). Blocks must not share queries. A
    query whose mask hides every key of its span gets 0 on CPU (SDPA elsewhere gives
    NaN: let it see a key and zero it after), as does a query in no block, or in a block
    without keys.

    Hide keys with −inf (or False): a row hidden only by huge finite values comes out as
    the mean of its values, but float32's log-sum-exp cannot hold that row's sum, and its
    gradients are wrong by up to the span's length (torch's flash kernel alike).

    How: on CPU, `_FlashBlocks` (native forward and backward in float32, else the flash
    kernel's; a backward that never holds a gradient the size of all keys per block);
    elsewhere, and under torch.func transforms, SDPA per block under autograd. Time and
    memory are those of the spans, O(Σ block · span).
    """

    def batch_and_width(t: torch.Tensor) -> tuple[int, int] | None:
        return (t.shape[0], t.shape[3]) if t.dim() == 4 else None

    if batch_and_width(q) is None or batch_and_width(k) != batch_and_width(q) or k.shape != v.shape:
        raise ValueError(
            f"q must be (B, H, Nq, d) and k, v (B, H, Nk, d) alike; got q "
            f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if k.shape[1] != q.shape[1]:
        raise ValueError(f"q has {q.shape[1]} heads but k and v {k.shape[1]}: give as many")
    if len(masks) != len(blocks):
        raise ValueError(f"{len(blocks)} blocks but {len(masks)} masks: give one per block")
    if any(mask is not None and mask.requires_grad for mask in masks):
        raise ValueError(
            "blocked_attention gives masks no gradient; a learned bias needs "
            "biased_attention (or relative_bias_attention), which returns one"
        )
    check_blocks(blocks, q.shape[2], k.shape[2])
    if q.numel() == 0:
        return q.mul(0)  # no batch, heads or width: empty, with a graph
    masks = [
        None if mask is None else _block_mask(mask, q.dtype, stop - start, key_stop - key_start)
        for (start, stop, key_start, key_stop), mask in zip(blocks, masks, strict=True)
    ]
    if q.device.type == "cpu" and not transforms_active():
        # The flash kernel reads rows as unit-stride whatever their strides.
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        return _flash_blocks(q, k, v, tuple(blocks), masks, scale)
    context = q.new_zeros(q.shape)
    for (start, stop, key_start, key_stop), mask in zip(blocks, masks, strict=True):
        if key_stop > key_start and stop > start:
            context[:, :, start:stop] = F.scaled_dot_product_attention(
                q[:, :, start:stop],
                k[:, :, key_start:key_stop],
                v[:, :, key_start:key_stop],
                attn_mask=mask,
                scale=scale,
            )
    return context
