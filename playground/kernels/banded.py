"""`banded_attention`: each query sees the keys within a band around it, plus a few prefix
keys (global tokens) that every query may see; O(N · (band + G)) time and memory; on CPU a
fused forward and backward (`_FlashBand`) over the band's spans only."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange

from playground.kernels import native
from playground.kernels.common import (
    additive,
    differentiable_gradients,
    rows_unit_stride,
    transforms_active,
)
from playground.kernels.reference import dense_attention

BAND_BLOCK = 64
"""Queries per block of `banded_attention` (fewer when the band is narrower). A block sees
its whole chunks of keys, about BAND_BLOCK + band keys for band + 1 useful ones, so smaller
blocks waste less work but make smaller matrix products."""


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
        mask = additive(ok, dtype)[:, :, None, :] + additive(seen, dtype)
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
        """The blocks as `playground.kernels.native` takes them: (blocks, 4) int64
        (`blocks()`), and the mask (B, blocks, block, span) as one (B, 1, block, span) view
        per block."""
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
    through the buffer's copies and views instead, with a zero tensor per step. The buffer
    is not kept: backward lays it out again from the inputs (one copy), which also lets a
    backward under create_graph=True differentiate through it (`differentiable_gradients`)."""

    @staticmethod
    def forward(ctx, queries, keys_values, prefix_keys_values, mask, band, num_heads):
        buffer = band.chunked(keys_values, 0.0, prefix_keys_values)  # (B, chunks·rows, 2E)
        q = band.query_blocks(queries, num_heads)
        if q.dtype == torch.float32 and (kernels := native.load()) is not None:
            out, log_sum_exp = kernels.blocked_forward(
                rows_unit_stride(_by_head(q)),
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
                return band.context(dense_attention(q, keys, values, mask[:, :, None], scale))

            grads = differentiable_gradients(
                (queries, keys_values, prefix), grad_context, recompute
            )
            return (*grads, None, None, None)
        buffer = band.chunked(keys_values, 0.0, prefix)
        q = band.query_blocks(queries, heads)
        grad_out = band.query_blocks(grad_context, heads)  # (B, blocks, H, block, d)
        if q.dtype == torch.float32 and (kernels := native.load()) is not None:
            grad_context, grad_buffer = _FlashBand.native_backward(
                kernels, q, buffer, mask, out, log_sum_exp, grad_out, band
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
    def native_backward(kernels, q, buffer, mask, out, log_sum_exp, grad_out, band):
        """The context's gradient (B, N, E) and the buffer's (B, chunks·rows, 2E) from the
        blocked backward of `kernels` (what `native.load()` returned), which adds each
        span's key and value gradients in place onto the buffer's: (B, blocks, H, block, ·)
        tensors are read as (B, H, blocks·block, ·), the buffer's keys and values as
        (B, H, rows, d)."""
        heads = q.shape[2]
        grad_buffer = torch.zeros_like(buffer)
        grad_q = kernels.blocked_backward(
            rows_unit_stride(_by_head(q)),
            *_keys_and_values(buffer, heads),
            rows_unit_stride(_by_head(out)),
            _by_head(log_sum_exp),
            rows_unit_stride(_by_head(grad_out)),
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
