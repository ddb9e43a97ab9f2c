"""Fast attention kernels a variant's fast path can be made of, each tested against a dense
reference (tests/test_kernels.py). They take projected tensors and return contexts; the
variant keeps its projections, its rules for which token is which, and its output.

- `banded_attention`: each query sees the keys within a band around it, plus a few prefix
  keys (global tokens) that every query may see; O(N · (band + G)) time and memory; on
  CPU a fused forward and backward over the band's spans only.
- `biased_attention`: softmax(scale · q kᵀ + bias) v on the CPU flash kernel with a fused
  backward that gives the bias its gradient too (SDPA gives none for a mask);
  `hankel_biased_attention` for a bias given by its anti-diagonals.
- `blocked_attention`: blocks of queries, each over its own span of keys with a mask;
  on CPU one fused forward and one fused backward over all of them.
- `relative_bias_attention`: softmax(scale · q kᵀ + T) v with a Toeplitz bias T (one value
  per head and relative position j − i), blocked over queries,
  `hankel_biased_attention` per block when T needs a gradient.

All are differentiable (twice, through torch's own operations under create_graph=True),
built on torch's fused attention kernels and `playground.kernels.native`'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch.utils.checkpoint import checkpoint

from playground.kernels import native
from playground.masks import masked_softmax

BAND_BLOCK = 64
"""Queries per block of `banded_attention` (fewer when the band is narrower). A block sees
its whole chunks of keys, about BAND_BLOCK + band keys for band + 1 useful ones, so smaller
blocks waste less work but make smaller matrix products."""


def _additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where allowed, −inf elsewhere."""
    return torch.zeros_like(allowed, dtype=dtype).masked_fill(~allowed, -math.inf)


def transforms_active() -> bool:
    """Whether a torch.func transform (grad, vmap, jacrev, …) is running. The autograd
    functions here are written for plain autograd (no setup_context, no vmap rule): under
    a transform the paths made of torch's own operations run instead."""
    return torch._C._functorch.peek_interpreter_stack() is not None


def _dense_attention(q, k, v, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """softmax(scale · q kᵀ + mask) v in torch's own operations, 0 for a row whose mask
    hides every key (−inf): what the fused autograd functions recompute when their
    gradients must themselves be differentiated."""
    scores = q @ k.transpose(-2, -1) * scale
    if mask is None:
        return scores.softmax(dim=-1) @ v
    return masked_softmax(scores + mask, ~torch.isneginf(mask)) @ v


def _differentiable_gradients(inputs, grad_output, recompute) -> list[torch.Tensor | None]:
    """The gradients of recompute() at `inputs` (None where one needs none), themselves
    differentiable. A fused backward's results are not, so under create_graph=True (a
    gradient penalty, a Hessian-vector product) the autograd functions here hand over to
    torch's own operations, at the memory of an unfused attention."""
    wanted = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    with torch.enable_grad():
        output = recompute()
    grads = iter(
        torch.autograd.grad(output, wanted, grad_output, create_graph=True, allow_unused=True)
    )
    return [
        next(grads) if isinstance(t, torch.Tensor) and t.requires_grad else None for t in inputs
    ]


@dataclass(frozen=True)
class _Band:
    """Where things lie in `banded_attention`'s key buffer.

    Keys are cut into chunks of `block`, each chunk preceded by the G prefix keys, with
    `chunks_before` and `chunks_after` chunks of filler past the ends; all a block of
    queries may see (its band's chunks, the prefix of the first) is then one contiguous
    `span` of the buffer, and consecutive blocks' spans are `rows` apart."""

    n: int
    block: int
    num_blocks: int
    chunks_before: int
    chunks_after: int
    num_prefix: int

    @classmethod
    def of(cls, n: int, before: int, after: int, block: int, num_prefix: int) -> _Band:
        block = max(1, min(block, max(before, after, 1), n))
        num_blocks = -(-n // block)
        return cls(
            n,
            block,
            num_blocks,
            min(-(-before // block), num_blocks - 1),
            min(-(-after // block), num_blocks - 1),
            num_prefix,
        )

    @property
    def rows(self) -> int:
        """Buffer rows per chunk: G prefix keys, then `block` keys."""
        return self.num_prefix + self.block

    @property
    def span_chunks(self) -> int:
        return self.chunks_before + 1 + self.chunks_after

    @property
    def span(self) -> int:
        return self.span_chunks * self.rows

    @property
    def chunks(self) -> int:
        return self.chunks_before + self.num_blocks + self.chunks_after

    def chunked(self, tensor: torch.Tensor, fill, prefix: torch.Tensor | None) -> torch.Tensor:
        """(B, N, C) and (B, G, C) -> (B, chunks·rows, C): [G prefix, block keys] per
        chunk, `fill` past the ends. Written in place: each element is copied once."""
        batch, width = tensor.shape[0], tensor.shape[-1]
        buffer = tensor.new_empty(batch, self.chunks, self.rows, width)
        if prefix is not None:
            buffer[:, :, : self.num_prefix] = prefix[:, None]
        keys = buffer[:, :, self.num_prefix :]  # (B, chunks, block, C)
        full, rest = divmod(self.n, self.block)  # whole chunks of keys, keys in the last one
        first = self.chunks_before
        keys[:, :first] = fill
        keys[:, first : first + full] = tensor[:, : full * self.block].unflatten(
            1, (full, self.block)
        )
        keys[:, first + full :] = fill
        if rest:
            keys[:, first + full, :rest] = tensor[:, full * self.block :]
        return buffer.flatten(1, 2)

    def spans(self, buffer: torch.Tensor) -> torch.Tensor:
        """(B, chunks·rows, C) -> (B, blocks, span, C), a view (spans overlap)."""
        return buffer.unfold(1, self.span, self.rows).transpose(-1, -2)

    def unchunked(self, buffer_grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The gradient of `chunked`: (B, chunks, rows, C) -> that of its tensor (B, N, C)
        and of its prefix (B, G, C), which every chunk holds a copy of."""
        first = self.chunks_before
        keys = buffer_grad[:, first : first + self.num_blocks, self.num_prefix :]
        prefix = buffer_grad[:, :, : self.num_prefix].sum(dim=1)
        return keys.flatten(1, 2)[:, : self.n], prefix

    def mask(
        self,
        key_ok: torch.Tensor,
        prefix_ok: torch.Tensor | None,
        prefix_positions: torch.Tensor | None,
        before: int,
        after: int,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        """(B, blocks, block, span) additive: 0 where a query sees a column of its span,
        −inf elsewhere; a row that would see nothing sees its own key."""
        device, batch = key_ok.device, key_ok.shape[0]
        if prefix_ok is None and self.num_prefix:
            prefix_ok = torch.ones(batch, self.num_prefix, dtype=torch.bool, device=device)
        prefix_flags = None if prefix_ok is None else prefix_ok[..., None]
        ok = self.spans(self.chunked(key_ok[..., None], False, prefix_flags))[..., 0]
        # Which columns of a span lie within each query's band; the prefix slots of the
        # first chunk only (the same for every block). -> (block, span)
        query = torch.arange(self.block, device=device)[:, None]  # within its block
        column = torch.arange(self.span, device=device)
        chunk, slot = column // self.rows, column % self.rows  # (span,)
        offset = query - (chunk - self.chunks_before) * self.block - (slot - self.num_prefix)
        in_band = (offset <= before) & (offset >= -after)
        seen = torch.where(slot < self.num_prefix, chunk == 0, in_band)
        mask = _additive(ok, dtype)[:, :, None, :] + _additive(seen, dtype)
        if prefix_positions is not None and self.num_prefix:
            query_position = torch.arange(self.num_blocks * self.block, device=device)
            future = prefix_positions[:, None, None, :] > query_position.view(
                self.num_blocks, self.block, 1
            )
            mask[..., : self.num_prefix].masked_fill_(future, -math.inf)  # (B, blocks, block, G)
        # A row that sees nothing would make SDPA return NaN: it sees its own key instead.
        empty = torch.isneginf(mask).all(dim=-1)  # (B, blocks, block)
        own = self.chunks_before * self.rows + self.num_prefix  # query 0's own key
        mask[..., own : own + self.block].diagonal(dim1=-2, dim2=-1).masked_fill_(empty, 0.0)
        return mask

    def blocks(self) -> list[tuple[int, int, int, int]]:
        """Per block: its queries' start and stop, and its span's first and last + 1 rows
        of the buffer."""
        return [
            (i * self.block, (i + 1) * self.block, i * self.rows, i * self.rows + self.span)
            for i in range(self.num_blocks)
        ]

    def native_layout(self, mask: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The blocks as `playground.kernels.native` takes them: (blocks, 4) int64 (`blocks()`),
        and the mask (B, blocks, block, span) as one (B, 1, block, span) view per block."""
        return torch.tensor(self.blocks(), dtype=torch.long), list(mask[:, :, None].unbind(1))

    def query_blocks(self, queries: torch.Tensor, num_heads: int) -> torch.Tensor:
        """(B, N, E) -> (B, blocks, H, block, d), a view of queries padded to whole blocks."""
        if self.num_blocks * self.block > self.n:
            queries = F.pad(queries, (0, 0, 0, self.num_blocks * self.block - self.n))
        return rearrange(queries, "b (nb blk) (h d) -> b nb h blk d", blk=self.block, h=num_heads)

    def context(self, blocks: torch.Tensor) -> torch.Tensor:
        """(B, blocks, H, block, d) -> (B, N, E)."""
        return rearrange(blocks, "b nb h blk d -> b (nb blk) (h d)")[:, : self.n]


def _by_head(blocks: torch.Tensor) -> torch.Tensor:
    """(B, blocks, H, block, ·) -> (B, H, blocks·block, ·), a view when it can be: how
    `playground.kernels.native` reads the band's queries, outputs and their gradients."""
    return blocks.transpose(1, 2).flatten(2, 3)


def _keys_and_values(buffer: torch.Tensor, num_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The band's buffer (B, R, 2E), or its gradient, as keys and values (B, H, R, d),
    views: how `playground.kernels.native` reads them."""
    pair = buffer.unflatten(-1, (2, num_heads, -1)).transpose(1, 3)  # (B, H, 2, R, d)
    return pair[:, :, 0], pair[:, :, 1]


def _span_heads(spans: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(blocks, span, E) -> (blocks, H, span, d), a view."""
    return rearrange(spans, "nb s (h d) -> nb h s d", h=num_heads)


class _FlashBand(torch.autograd.Function):
    """`banded_attention` on CPU: in float32 where `playground.kernels.native` is built, its
    blocked forward and backward over the blocks' spans (strided views of the key buffer,
    never copied per block), the backward adding each span's key and value gradients in
    place onto the buffer's; elsewhere one flash call per sequence forward and
    `python_backward`. Then the buffer's gradient goes onto keys and prefix. Only the
    blocks within the band are ever touched, in backward as in forward; autograd would go
    through the buffer's copies and views instead, with a zero tensor per step. The buffer is not kept: backward lays it
    out again from the inputs (one copy), which also lets a backward under
    create_graph=True differentiate through it (`_differentiable_gradients`)."""

    @staticmethod
    def forward(ctx, queries, keys_values, prefix_keys_values, mask, band, num_heads):
        buffer = band.chunked(keys_values, 0.0, prefix_keys_values)  # (B, chunks·rows, 2E)
        q = band.query_blocks(queries, num_heads)
        if q.dtype == torch.float32 and native.load() is not None:
            out, log_sum_exp = native.load().blocked_forward(
                _rows_unit_stride(_by_head(q)),
                *_keys_and_values(buffer, num_heads),
                *band.native_layout(mask),
                q.shape[-1] ** -0.5,
            )  # (B, H, blocks·block, ·): as blocks, views
            out = rearrange(out, "b h (nb blk) d -> b nb h blk d", blk=band.block)
            log_sum_exp = rearrange(log_sum_exp, "b h (nb blk) -> b nb h blk", blk=band.block)
        else:
            width = queries.shape[-1]
            outs, sums = [], []
            for b, spans in enumerate(band.spans(buffer)):  # (blocks, span, 2E)
                keys, values = spans.split(width, dim=-1)
                out, log_sum_exp = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                    q[b],
                    _span_heads(keys, num_heads),
                    _span_heads(values, num_heads),
                    attn_mask=mask[b, :, None],
                )
                outs.append(out)
                sums.append(log_sum_exp)
            out, log_sum_exp = torch.stack(outs), torch.stack(sums)  # (B, blocks, H, block, ·)
        ctx.save_for_backward(queries, keys_values, prefix_keys_values, mask, out, log_sum_exp)
        ctx.band, ctx.num_heads = band, num_heads
        return band.context(out)

    @staticmethod
    def backward(ctx, grad_context):
        queries, keys_values, prefix, mask, out, log_sum_exp = ctx.saved_tensors
        band, heads = ctx.band, ctx.num_heads
        if torch.is_grad_enabled():  # create_graph=True

            def recompute():
                buffer = band.spans(band.chunked(keys_values, 0.0, prefix))
                keys, values = (
                    rearrange(t, "b nb s (h d) -> b nb h s d", h=heads)
                    for t in buffer.split(queries.shape[-1], dim=-1)
                )
                q = band.query_blocks(queries, heads)  # (B, blocks, H, block, d)
                scale = q.shape[-1] ** -0.5
                return band.context(_dense_attention(q, keys, values, mask[:, :, None], scale))

            grads = _differentiable_gradients(
                (queries, keys_values, prefix), grad_context, recompute
            )
            return (*grads, None, None, None)
        buffer = band.chunked(keys_values, 0.0, prefix)
        q = band.query_blocks(queries, heads)
        grad_out = band.query_blocks(grad_context, heads)  # (B, blocks, H, block, d)
        if q.dtype == torch.float32 and native.load() is not None:
            grad_context, grad_buffer = _FlashBand.native_backward(
                q, buffer, mask, out, log_sum_exp, grad_out, band
            )
        else:
            grad_context, grad_buffer = _FlashBand.python_backward(
                q, buffer, mask, out, log_sum_exp, grad_out, band
            )
        grad_keys_values, grad_prefix = band.unchunked(
            grad_buffer.unflatten(1, (band.chunks, band.rows))
        )
        return (
            grad_context,
            grad_keys_values,
            grad_prefix if prefix is not None else None,
            None,
            None,
            None,
        )

    @staticmethod
    def native_backward(q, buffer, mask, out, log_sum_exp, grad_out, band):
        """The context's gradient (B, N, E) and the buffer's (B, chunks·rows, 2E) from
        `playground.kernels.native`'s blocked backward, which adds each span's key and value
        gradients in place onto the buffer's: (B, blocks, H, block, ·) tensors are read
        as (B, H, blocks·block, ·), the buffer's keys and values as (B, H, rows, d)."""
        heads = q.shape[2]
        grad_buffer = torch.zeros_like(buffer)
        grad_q = native.load().blocked_backward(
            _rows_unit_stride(_by_head(q)),
            *_keys_and_values(buffer, heads),
            _rows_unit_stride(_by_head(out)),
            _by_head(log_sum_exp),
            _rows_unit_stride(_by_head(grad_out)),
            *_keys_and_values(grad_buffer, heads),
            *band.native_layout(mask),
            q.shape[-1] ** -0.5,
        )
        return rearrange(grad_q, "b h n d -> b n (h d)")[:, : band.n], grad_buffer

    @staticmethod
    def python_backward(q, buffer, mask, out, log_sum_exp, grad_out, band):
        """The context's gradient (B, N, E) and the buffer's (B, chunks·rows, 2E) by the
        flash kernel's own backward per sequence, each span's key and value gradient then
        folded back onto the buffer by `span_chunks` shifted adds."""
        heads = q.shape[2]
        grad_q = torch.empty_like(out)
        width = buffer.shape[-1] // 2
        # (B, chunks, rows, 2, H, d): keys' then values' gradient per buffer row
        grad_buffer = buffer.new_zeros(
            buffer.shape[0], band.chunks, band.rows, 2, heads, width // heads
        )
        for b, spans in enumerate(band.spans(buffer)):
            keys, values = spans.split(width, dim=-1)
            dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grad_out[b],
                q[b],
                _span_heads(keys, heads),
                _span_heads(values, heads),
                out[b],
                log_sum_exp[b],
                0.0,
                False,
                attn_mask=mask[b, :, None],
            )
            grad_q[b] = dq
            # Block i's span is chunks i … i + span_chunks − 1 of the buffer.
            for kv, grad in ((0, dk), (1, dv)):
                grad = grad.unflatten(2, (band.span_chunks, band.rows))  # (blocks, H, c, r, d)
                for chunk in range(band.span_chunks):
                    target = grad_buffer[b, chunk : chunk + band.num_blocks, :, kv]
                    target += grad[:, :, chunk].transpose(1, 2)  # (blocks, rows, H, d)
        return band.context(grad_q), grad_buffer.flatten(1, 2).flatten(-3)


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

    How: keys are laid out in a buffer (`_Band`) where all a block of queries may see is
    one contiguous span, so one attention call per sequence over (blocks, H, block, span)
    reads the overlapping spans as a strided view, with no per-block copies. On CPU
    `_FlashBand` runs it forward and backward (native kernels in float32, else the flash
    kernel's); elsewhere (and under torch.func transforms) SDPA under autograd.
    """
    num_prefix = 0 if prefix_keys_values is None else prefix_keys_values.shape[1]
    band = _Band.of(queries.shape[1], before, after, block, num_prefix)
    mask = band.mask(key_ok, prefix_ok, prefix_positions, before, after, queries.dtype)
    if queries.device.type == "cpu" and not transforms_active():
        # The flash kernel reads rows as unit-stride whatever their strides.
        queries = queries if queries.stride(-1) == 1 else queries.contiguous()
        return _FlashBand.apply(queries, keys_values, prefix_keys_values, mask, band, num_heads)
    # (Rebinding the name frees the unchunked tensor once it is in the buffer.)
    keys_values = band.spans(band.chunked(keys_values, 0.0, prefix_keys_values))
    keys, values = keys_values.split(queries.shape[-1], dim=-1)  # (B, blocks, span, E) each
    q = band.query_blocks(queries, num_heads)
    # One call per sequence: the blocks of a sequence share one stride into the buffer.
    contexts = [
        F.scaled_dot_product_attention(
            q[b],  # (blocks, H, block, d)
            _span_heads(keys[b], num_heads),  # (blocks, H, span, d)
            _span_heads(values[b], num_heads),
            attn_mask=mask[b, :, None],  # (blocks, 1, block, span)
        )
        for b in range(queries.shape[0])
    ]
    return band.context(torch.stack(contexts))


Block = tuple[int, int, int, int]
"""(start, stop, key_start, key_stop): a block of queries and the span of keys it sees."""


class _FlashBlocks(torch.autograd.Function):
    """`blocked_attention` on CPU: in float32 where `playground.kernels.native` is built, its
    blocked forward and backward over every block at once; elsewhere the flash kernel per
    block, keeping the per-row log-sum-exp, and its own backward per block. Either way
    each span's key and value gradients are added in place onto the keys' and values',
    where autograd through per-block slices would give each block a zero tensor the size
    of all the keys. Under create_graph=True, torch's own operations instead
    (`_differentiable_gradients`)."""

    @staticmethod
    def forward(ctx, q, k, v, blocks, masks, scale):
        if q.dtype == torch.float32 and native.load() is not None:
            out, log_sum_exp = native.load().blocked_forward(
                *(_rows_unit_stride(t) for t in (q, k, v)),
                _native_blocks(blocks),
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
    def backward(ctx, grad_out):
        q, k, v, out, log_sum_exp, *masks = ctx.saved_tensors
        blocks, scale = ctx.blocks, ctx.scale
        if torch.is_grad_enabled():  # create_graph=True

            def recompute():
                context = torch.zeros_like(q)
                for (start, stop, key_start, key_stop), mask in zip(blocks, masks, strict=True):
                    if key_stop > key_start and stop > start:
                        keys = slice(key_start, key_stop)
                        context[:, :, start:stop] = _dense_attention(
                            q[:, :, start:stop], k[:, :, keys], v[:, :, keys], mask, scale
                        )
                return context

            return (*_differentiable_gradients((q, k, v), grad_out, recompute), None, None, None)
        # Contiguous: whatever layout k and v came in (an expanded view, a transposed
        # cache), the gradients are written row by row.
        grad_k = torch.zeros(k.shape, dtype=k.dtype)
        grad_v = torch.zeros(v.shape, dtype=v.dtype)
        if q.dtype == torch.float32 and native.load() is not None:
            grad_q = native.load().blocked_backward(
                *(_rows_unit_stride(t) for t in (q, k, v, out)),
                log_sum_exp,
                _rows_unit_stride(grad_out),
                grad_k,
                grad_v,
                _native_blocks(blocks),
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


def _block_mask(mask: torch.Tensor, dtype: torch.dtype, rows: int, span: int) -> torch.Tensor:
    """A block's mask as the kernels read it: additive in `dtype` (bool: 0 / −inf), 4-D
    (1 or B, 1 or H, rows, span) with unit-stride rows (broadcast rows may be stride 0)."""
    if mask.dtype == torch.bool:
        mask = _additive(mask, dtype)
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


def _native_blocks(blocks: Sequence[Block]) -> torch.Tensor:
    """Blocks as `playground.kernels.native` takes them: (blocks, 4) int64."""
    return torch.tensor(blocks, dtype=torch.long).view(-1, 4)


def _native_masks(masks: Sequence[torch.Tensor | None], like: torch.Tensor) -> list:
    """Masks as `playground.kernels.native` takes them: an empty tensor for none."""
    return [like.new_empty(0) if mask is None else mask for mask in masks]


def _check_blocks(blocks: Sequence[Block], n_q: int, n_k: int) -> None:
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
    _check_blocks(blocks, q.shape[2], k.shape[2])
    if q.numel() == 0:
        return q.mul(0)  # no batch, heads or width: empty, with a graph
    masks = [
        None if mask is None else _block_mask(mask, q.dtype, stop - start, key_stop - key_start)
        for (start, stop, key_start, key_stop), mask in zip(blocks, masks, strict=True)
    ]
    if q.device.type == "cpu" and not transforms_active():
        # The flash kernel reads rows as unit-stride whatever their strides.
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        return _FlashBlocks.apply(q, k, v, tuple(blocks), masks, scale)
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


class BackwardScratch:
    """Memory that the backward passes of the blocks of one call share.

    A fresh tensor of tens of MiB is new pages to the allocator, and the page faults of
    writing it cost about as much as the matrix product that fills it; the blocks of one
    call are differentiated one after another, so they can take turns with one buffer.
    Hold one per call (never across calls): it is freed with the autograd graph, so peak
    memory counts it.
    """

    def __init__(self) -> None:
        self._memory: dict[str, torch.Tensor] = {}
        self._zeroed: tuple | None = None  # (layout, address) of the zeroed Hankel buffer

    def matrix(self, name: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """A buffer of `shape` (contents undefined) in like's dtype and device."""
        size = math.prod(shape)
        memory = self._memory.get(name)
        if (
            memory is None
            or memory.numel() < size
            or memory.dtype != like.dtype
            or memory.device != like.device
        ):
            memory = self._memory[name] = like.new_empty(size)
        return memory[:size].view(shape)

    def hankel(
        self, shape: tuple[int, int, int, int], like: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(skew (B, H, Nq, Nq + Nk − 1), view (B, H, Nq, Nk)) with view[b, h, i, j] =
        skew[b, h, i, i + j] and skew zero elsewhere: what is written to the view, summed
        over queries (skew.sum(2)), is summed along each anti-diagonal i + j = t. Only
        the view is ever written, so the rest stays zero while the layout stays."""
        batch, heads, n_q, n_k = shape
        width = n_q + n_k - 1
        layout = (batch, heads, n_q, width)
        skew = self.matrix("hankel", layout, like)
        if self._zeroed != (layout, skew.data_ptr()):
            skew.zero_()
            self._zeroed = (layout, skew.data_ptr())
        view = skew.as_strided(shape, (heads * n_q * width, n_q * width, width + 1, 1))
        return skew, view


class _FlashWithBiasGradient(torch.autograd.Function):
    """softmax(scale · q kᵀ + B) v for one block, with the gradient of the bias too (SDPA
    gives none for `attn_mask`, and falls back to its unfused kernel when the mask needs
    one). B is `bias` as given, broadcast to (B, H, Nq, Nk), or, when `hankel`, the Hankel
    matrix B[h, i, j] = bias[h, i + j] of bias (H, Nq + Nk − 1).

    forward: the CPU flash kernel, keeping its output O and per-row log-sum-exp L; saved
    for backward are only these, the inputs and `bias` as given (no (Nq, Nk) tensor unless
    the caller made one) and padding as a (B, Nk) mask.
    backward, from the block's recomputed probabilities P = exp(scale · q kᵀ + B − L):
    dv = Pᵀ dO, dP = dO vᵀ, dS = P ⊙ (dP − rowsum(dO ⊙ O)), dq = scale · dS k,
    dk = scale · dSᵀ q: five products, as many as the flash backward's own, which cannot
    return dS. The bias gets dS summed over what it broadcasts, or for a Hankel bias along
    anti-diagonals: dS (at a batch, its sum over the batch) is written skewed
    (`BackwardScratch.hankel`) so that each anti-diagonal is a column, and one sum over
    queries gives them all.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, keep, scale, hankel, scratch):
        if hankel:
            mask = _hankel_mask(bias, keep, k.shape[2])
        else:
            mask = bias if keep is None else bias.masked_fill(~keep, -math.inf)
        out, log_sum_exp = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, attn_mask=mask, scale=scale
        )  # a row that sees no key: O = 0, L = 0
        ctx.save_for_backward(q, k, v, bias, keep, out, log_sum_exp)
        ctx.scale, ctx.hankel, ctx.scratch = scale, hankel, scratch
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, bias, keep, out, log_sum_exp = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True
            return (*_second_order_biased(ctx, grad_out, None), None, None, None, None)
        dtype = q.dtype
        if dtype in (torch.bfloat16, torch.float16):
            # The flash kernel keeps L in float32; the backward runs there too, as SDPA's
            # own low-precision backward accumulates in float32.
            q, k, v, bias, out, grad_out = (t.float() for t in (q, k, v, bias, out, grad_out))
        if ctx.hankel and q.dtype == torch.float32 and native.load() is not None:
            grads = _native_hankel_backward(ctx, grad_out, False)
            return (*(g.to(dtype) for g in grads), None, None, None, None)
        batch, heads, block, n_k = *q.shape[:3], k.shape[2]
        scratch = ctx.scratch or BackwardScratch()
        q, k, v = q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)  # (B·H, ·, d)
        grad_out, out = grad_out.flatten(0, 1), out.flatten(0, 1)
        # S − L = (B − L) + scale · q kᵀ: one pass writes B − L, the product adds to it.
        scores = scratch.matrix("scores", (batch * heads, block, n_k), q)
        grid = scores.view(batch, heads, block, n_k)
        bias_grid = bias.unfold(-1, n_k, 1) if ctx.hankel else bias
        torch.sub(bias_grid, log_sum_exp.to(scores.dtype)[..., None], out=grid)
        if keep is not None:
            grid.masked_fill_(~keep, -math.inf)
        scores.baddbmm_(q, k.transpose(1, 2), alpha=ctx.scale)
        # exp is many times slower below −87, where float32 underflows, than above it:
        # clamp there, then set what was clamped (P <= 1.65e−38: every hidden key) to 0.
        probabilities = F.threshold_(scores.clamp_(min=-87.0).exp_(), 1.7e-38, 0.0)  # P
        # Products with a transposed operand run fastest as (d, ·) · (·, Nk), so dv and dk
        # are formed transposed: dvᵀ = dOᵀ P, dkᵀ = scale · qᵀ dS.
        grad_v = torch.bmm(grad_out.transpose(1, 2).contiguous(), probabilities)
        row_dot = (grad_out * out).sum(dim=-1, keepdim=True)  # rowsum(dO ⊙ O)
        # dP − rowsum(dO ⊙ O) (a baddbmm onto the broadcast row sums takes a per-matrix
        # loop on CPU: slower than the product and a subtraction).
        grad_scores = scratch.matrix("grad_scores", (batch * heads, block, n_k), q)
        grad_scores.baddbmm_(grad_out, v.transpose(1, 2), beta=0).sub_(row_dot)
        if ctx.hankel and batch == 1:
            # dS written skewed (products would not write a strided output), its
            # anti-diagonals summed below. With a batch, the sum over it comes first (it is
            # contiguous), and only that (H, Nq, Nk) is skewed: B times less to zero and sum.
            skew, skewed = scratch.hankel((batch, heads, block, n_k), q)
            grad_scores = torch.mul(grad_scores, probabilities, out=skewed.flatten(0, 1))
        else:
            grad_scores = grad_scores.mul_(probabilities)  # dS
        grad_q = torch.bmm(grad_scores, k).mul_(ctx.scale)
        grad_k = torch.bmm(q.transpose(1, 2).contiguous(), grad_scores).mul_(ctx.scale)
        if ctx.hankel:
            if batch > 1:
                skew, skewed = scratch.hankel((1, heads, block, n_k), q)
                torch.sum(grad_scores.view(batch, 1, heads, block, n_k), dim=0, out=skewed)
            grad_bias = skew.sum(dim=2).sum_to_size(bias.shape)  # (H, Nq + Nk − 1)
        else:
            grad_bias = grad_scores.view(batch, heads, block, n_k).sum_to_size(bias.shape)
        shape = (batch, heads, -1, q.shape[-1])
        transposed = (batch, heads, q.shape[-1], -1)
        return (
            grad_q.view(shape).to(dtype),
            grad_k.view(transposed).transpose(2, 3).to(dtype),
            grad_v.view(transposed).transpose(2, 3).to(dtype),
            grad_bias.to(dtype),
            None,
            None,
            None,
            None,
        )


def _second_order_biased(ctx, grad_out: torch.Tensor, hankel: bool | None) -> list:
    """q, k, v and bias gradients, differentiable, for a context that saved (q, k, v,
    bias, keep, out, log_sum_exp) and its `scale` (and `hankel`, unless given)."""
    q, k, v, bias, keep, _, _ = ctx.saved_tensors
    hankel = ctx.hankel if hankel is None else hankel

    def recompute():
        if hankel:
            mask = _hankel_mask(bias, keep, k.shape[2])
        else:
            mask = bias if keep is None else bias.masked_fill(~keep, -math.inf)
        return _dense_attention(q, k, v, mask.expand(*q.shape[:3], k.shape[2]), ctx.scale)

    return _differentiable_gradients((q, k, v, bias), grad_out, recompute)


def _rows_unit_stride(tensor: torch.Tensor) -> torch.Tensor:
    """tensor (B, H, N, d) as it is when its rows are unit-stride, else a contiguous copy
    (a gradient that autograd expanded, say)."""
    rows_apart = tensor.shape[-2] == 1 or tensor.stride(-2) >= tensor.shape[-1]
    return tensor if tensor.stride(-1) == 1 and rows_apart else tensor.contiguous()


def _keys_kept(keep: torch.Tensor | None, batch: int, n_k: int) -> torch.Tensor:
    """keep (B or 1, 1, 1, Nk) -> a contiguous (B, Nk) bool tensor; None -> an empty one."""
    if keep is None:
        return torch.empty(0, dtype=torch.bool)
    return keep.expand(batch, 1, 1, n_k).reshape(batch, n_k).contiguous()


def _native_hankel_backward(ctx, grad_out: torch.Tensor, causal: bool) -> tuple:
    """dq, dk, dv and the Hankel bias's gradient (float32) from `playground.kernels.native`, for a
    context that saved (q, k, v, bias, keep, out, log_sum_exp) and its `scale`."""
    q, k, v, bias, keep, out, log_sum_exp = ctx.saved_tensors
    grad_q, grad_k, grad_v, grad_bias = native.load().hankel_biased_backward(
        *(_rows_unit_stride(t.float()) for t in (q, k, v)),
        bias.float().contiguous(),
        _keys_kept(keep, q.shape[0], k.shape[2]),
        _rows_unit_stride(out.float()),
        log_sum_exp.contiguous(),
        _rows_unit_stride(grad_out.float()),
        ctx.scale,
        causal,
    )
    return grad_q, grad_k, grad_v, grad_bias.sum(dim=0).sum_to_size(bias.shape)  # over B


def biased_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    scale: float,
    keep: torch.Tensor | None = None,
    scratch: BackwardScratch | None = None,
) -> torch.Tensor:
    """softmax(scale · q kᵀ + bias) v -> (B, H, Nq, d) on the CPU flash kernel, with the
    gradient of `bias` as well as of q, k and v (`_FlashWithBiasGradient`).

    q (B, H, Nq, d), k and v (B, H, Nk, d); bias broadcasts to (B, H, Nq, Nk) and may be
    a view (it is what is kept for backward, with `keep`); keep (B, 1, 1, Nk) bool, if
    given, hides keys (−inf). A row that sees no key outputs 0. Blocks of one call that
    pass the same `scratch` share their backward's memory.
    """
    if transforms_active():
        mask = bias if keep is None else bias.masked_fill(~keep, -math.inf)
        return _dense_attention(q, k, v, mask, scale)
    return _FlashWithBiasGradient.apply(q, k, v, bias, keep, scale, False, scratch)


def hankel_biased_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    diagonals: torch.Tensor,
    scale: float,
    keep: torch.Tensor | None = None,
    scratch: BackwardScratch | None = None,
) -> torch.Tensor:
    """`biased_attention` with the Hankel bias B[h, i, j] = diagonals[h, i + j],
    diagonals (H, Nq + Nk − 1): never formed as a matrix, and its gradient is reduced
    along anti-diagonals inside the backward."""
    if transforms_active():
        return _dense_attention(q, k, v, _hankel_mask(diagonals, keep, k.shape[2]), scale)
    return _FlashWithBiasGradient.apply(q, k, v, diagonals, keep, scale, True, scratch)


def _block_view(
    bias: torch.Tensor, keep: torch.Tensor | None, start: int, stop: int, n_k: int, causal: bool
) -> tuple[int, torch.Tensor, torch.Tensor | None]:
    """What queries start … stop − 1 see, keys reversed (j' = Nk − 1 − j): the first key
    index (a causal block sees keys j <= stop − 1 only: reversed indices from Nk − stop),
    the block's bias diagonals (H, block + Nk − first − 1) and its keys' mask, or None."""
    first = max(0, n_k - stop) if causal else 0
    block_keep = None if keep is None else keep[..., first:]
    return first, bias[:, start + first : stop + n_k - 1], block_keep


def _hankel_mask(diagonals: torch.Tensor, keep: torch.Tensor | None, n_k: int) -> torch.Tensor:
    """The additive mask B[h, i, j] = diagonals[h, i + j] over n_k keys: (1, H, Nq, n_k), a
    strided view; with keep (B, 1, 1, n_k), a (B, H, Nq, n_k) tensor with −inf at hidden keys."""
    mask = diagonals.unfold(-1, n_k, 1)[None]
    return mask if keep is None else mask.masked_fill(~keep, -math.inf)


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
                attn_mask=_hankel_mask(windows, block_keep, n_k - first),
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
            return (*_second_order_biased(ctx, grad_out, True), None, None, None, None)
        dtype = ctx.saved_tensors[0].dtype
        grads = _native_hankel_backward(ctx, grad_out, ctx.is_causal)
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
    along the anti-diagonals in its own backward; SDPA would fall back to its unfused kernel and keep every
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
        first, windows, block_keep = _block_view(bias, keep, start, stop, n_k, is_causal)
        if fused_gradient:
            return hankel_biased_attention(
                q_block, k[:, :, first:], v[:, :, first:], windows, scale, block_keep, scratch
            )
        return F.scaled_dot_product_attention(
            q_block,
            k[:, :, first:],
            v[:, :, first:],
            attn_mask=_hankel_mask(windows, block_keep, n_k - first),
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
