"""Longformer attention: Beltagy et al. 2020, "Longformer: The Long-Document Transformer", §3.

    sliding window (§3.1)   query i attends to keys j with |i - j| <= w, w = attention_window / 2
    global attention (§3.1) a few task-chosen tokens attend to every token, and every token
                            attends to them
    projections (§3.1)      global attention has its own Q_g, K_g, V_g, initialised as copies
                            of the local Q_s, K_s, V_s

The exact rules are those of HF transformers' `LongformerSelfAttention`, so weights port:
- a local query's softmax runs over [the global keys | its window minus global and padded
  keys], every score from the LOCAL q and k and every value the LOCAL v (a global key inside
  the window is counted once, in the global part);
- a global query's row is full attention over all non-padded keys with q_g, k_g, v_g;
- a padded query attends to nothing: its weights and its output row (after out_proj) are 0,
  and a padded position is never global;
- scores are scaled by 1/√d_head.

Causal mode (not in the paper) keeps every rule and removes the future: the window looks
back only (i - w <= j <= i), a global query i sees the keys j <= i, and a global key j is seen
only by queries i >= j.

`impl="reference"` builds the full (N, N) mask of these rules and does a masked softmax:
O(N²), the oracle. `impl="fast"` is banded, O(N·(w + G)) in time and memory, any N (padded
internally, cut back): queries go in blocks of `BLOCK`; keys go in chunks of `BLOCK`, each
chunk preceded by the G global keys, so all a block may see (its window's chunks, the globals
of the first) is one contiguous stretch of that buffer. One `scaled_dot_product_attention`
call per sequence, over (blocks, H, BLOCK, span) with an additive mask, reads those
overlapping stretches as a strided view (no per-block copies); the global rows are one more
call over (B, H, G, N). Backward runs through SDPA. SDPA cannot return probabilities, so
`need_weights=True` runs the reference (the dense (B, H, N, N) weights are O(N²) anyway).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

import playground
from playground import AttentionOutput, AttentionVariant, Capabilities, InvalidInput, VariantConfig
from playground.masks import masked_softmax

BLOCK = 64
"""Queries per block of the fast path (fewer when the window is smaller). A block sees
its whole chunks of keys, about BLOCK + 2w keys for 2w + 1 useful ones, so smaller blocks
waste less work but make smaller matrix products; 64 measured fastest on CPU for w = 256."""


@dataclass(frozen=True)
class LongformerConfig(VariantConfig):
    attention_window: int = 512
    """Total window (even), as in Longformer and HF: query i sees the keys j with
    |i - j| <= attention_window / 2; causal: i - attention_window / 2 <= j <= i."""
    global_tokens: tuple[int, ...] = ()
    """Positions with global attention in every sequence, e.g. (0,) for a [CLS] token;
    OR-ed with the forward argument `global_attention_mask` (B, N) bool."""

    def __post_init__(self) -> None:
        if self.attention_window < 2 or self.attention_window % 2:
            raise ValueError(
                f"attention_window must be an even integer >= 2 (the total window: "
                f"attention_window / 2 keys on each side); got {self.attention_window}"
            )
        # A position listed twice is one global token (and counted once in flops()).
        object.__setattr__(self, "global_tokens", tuple(sorted(set(self.global_tokens))))
        negative = [p for p in self.global_tokens if p < 0]
        if negative:
            raise ValueError(
                f"global_tokens are positions counted from 0 and cannot be negative; got {negative}"
            )


def global_slots(is_global: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's global positions, in order, as G = max count slots.

    is_global (B, N) bool -> positions (B, G) long (0 in unused slots), used (B, G) bool.
    """
    counts = is_global.sum(dim=1)  # (B,)
    slots = int(counts.max())
    # A stable sort puts each row's global positions first, in increasing order.
    order = torch.argsort((~is_global).to(torch.uint8), dim=1, stable=True)  # (B, N)
    used = torch.arange(slots, device=is_global.device) < counts[:, None]  # (B, G)
    return order[:, :slots].masked_fill(~used, 0), used


class LongformerAttention(AttentionVariant):
    name = "longformer"
    summary = "Sliding-window attention plus global tokens; banded O(n·w) fast path."
    paper = "Beltagy et al. 2020, Longformer: The Long-Document Transformer, §3"
    Config = LongformerConfig
    colour = "#2ca02c"  # green, in every figure
    capabilities = Capabilities(
        causal=True,
        padding_mask=True,
        cross_attention=False,
        need_weights=True,
        dtypes=(torch.float32, torch.float64, torch.bfloat16),
    )
    forward_kwargs = ("global_attention_mask",)
    check_options = {"attention_window": 4, "global_tokens": (0,)}

    @staticmethod
    def flops(n_q: int, n_k: int, d_model: int, num_heads: int, **options: object) -> float:
        window = int(options.get("attention_window", 512))
        num_global = min(len(set(options.get("global_tokens", ()))), n_q)  # type: ignore[arg-type]
        projections = 2 * (n_q + 2 * n_k + n_q) * d_model * d_model  # q, k, v, out
        if num_global:
            # q_g for the global tokens only; k_g and v_g for every position they attend to.
            projections += 2 * (num_global + 2 * n_k) * d_model * d_model
        local_pairs = (n_q - num_global) * (min(n_k, window + 1) + num_global)
        global_pairs = num_global * n_k
        scores_and_mix = 2 * 2 * (local_pairs + global_pairs) * d_model  # Q Kᵀ and P V
        return float(projections + scores_and_mix)

    def __init__(self, d_model: int = 512, num_heads: int = 8, **options: object) -> None:
        super().__init__(d_model, num_heads, **options)
        self.q_proj = nn.Linear(d_model, d_model)  # Q_s for all heads at once
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.q_global_proj = nn.Linear(d_model, d_model)  # Q_g
        self.k_global_proj = nn.Linear(d_model, d_model)
        self.v_global_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        # §3.1: the global projections start as copies of the local ones.
        self.q_global_proj.load_state_dict(self.q_proj.state_dict())
        self.k_global_proj.load_state_dict(self.k_proj.state_dict())
        self.v_global_proj.load_state_dict(self.v_proj.state_dict())

    def special_sizes(self) -> tuple[int, ...]:
        """The one-sided reach w and the fast path's query block, besides the options."""
        return (*super().special_sizes(), self.config.attention_window // 2, BLOCK)

    def global_token_arguments(self, is_global: torch.Tensor) -> dict:
        return {"global_attention_mask": is_global}

    @classmethod
    def picture_options(cls, options: dict, seq_len: int) -> dict:
        """A window narrower than the picture, and the global tokens inside it."""
        fitted = dict(options)
        fitted["attention_window"] = playground.picture_width(
            options.get("attention_window", 512), seq_len
        )
        fitted["global_tokens"] = [p for p in options.get("global_tokens", ()) if p < seq_len]
        return fitted

    def reference_parameters(self) -> dict[str, str]:
        """The global projections start as copies of the local ones (§3.1)."""
        pairs = (
            ("q_global_proj", "q_proj"),
            ("k_global_proj", "k_proj"),
            ("v_global_proj", "v_proj"),
        )
        return {
            f"{g}.{part}": f"{local}.{part}" for g, local in pairs for part in ("weight", "bias")
        }

    def _token_roles(
        self, x: torch.Tensor, attention_mask: torch.Tensor | None, global_attention_mask
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """real (B, N) bool: not padding; is_global (B, N) bool: real tokens with global
        attention (config positions OR `global_attention_mask`)."""
        batch, n, _ = x.shape
        real = attention_mask
        if real is None:
            real = torch.ones(batch, n, dtype=torch.bool, device=x.device)
        is_global = torch.zeros(batch, n, dtype=torch.bool, device=x.device)
        positions = self.config.global_tokens
        outside = sorted({p for p in positions if p >= n})
        if outside:
            raise InvalidInput(
                f"global_tokens {outside} lie outside a sequence of length {n}; use positions "
                f"below {n} or pass per-sequence positions as global_attention_mask"
            )
        is_global[:, list(positions)] = True
        if global_attention_mask is not None:
            if (
                not isinstance(global_attention_mask, torch.Tensor)
                or global_attention_mask.dtype != torch.bool
                or tuple(global_attention_mask.shape) != (batch, n)
            ):
                got = (
                    f"{tuple(global_attention_mask.shape)} {global_attention_mask.dtype}"
                    if isinstance(global_attention_mask, torch.Tensor)
                    else type(global_attention_mask).__name__
                )
                raise InvalidInput(
                    f"global_attention_mask must be a bool tensor of shape (batch, seq_len) = "
                    f"{(batch, n)}, True for tokens with global attention; got {got}. "
                    f"A 0/1 mask (HF style) converts with `mask.bool()`."
                )
            is_global = is_global | global_attention_mask.to(x.device)
        return real, is_global & real

    def _split_heads(self, projected: torch.Tensor) -> torch.Tensor:
        return rearrange(projected, "b n (h d) -> b h n d", h=self.num_heads)  # (B, H, N, d)

    def _finish(self, context: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """context (B, N, d_model) -> output (B, N, d_model), padded query rows exactly 0.

        Zeroing the context too keeps whatever those rows held out of the weight gradients.
        """
        if real.all():
            return self.out_proj(context)  # (B, N, E)
        padded = ~real[..., None]  # (B, N, 1)
        output = self.out_proj(context.masked_fill(padded, 0.0))
        return output.masked_fill(padded, 0.0)

    def forward_reference(
        self,
        query,
        key,
        value,
        attention_mask,
        is_causal,
        need_weights,
        global_attention_mask=None,
    ) -> AttentionOutput:
        real, is_global = self._token_roles(query, attention_mask, global_attention_mask)
        n = query.shape[1]
        q, k, v = (self._split_heads(p(query)) for p in (self.q_proj, self.k_proj, self.v_proj))
        q_global, k_global, v_global = (
            self._split_heads(p(query))
            for p in (self.q_global_proj, self.k_global_proj, self.v_global_proj)
        )
        position = torch.arange(n, device=query.device)
        offset = position[:, None] - position[None, :]  # (N, N): query i - key j
        window = self.config.attention_window // 2
        in_window = (offset >= 0) & (offset <= window) if is_causal else offset.abs() <= window
        seen_in_time = offset >= 0 if is_causal else torch.ones_like(in_window)  # (N, N)
        global_row = is_global[:, None, :, None]  # (B, 1, N, 1)
        allowed = (
            torch.where(global_row[:, 0], seen_in_time, in_window | is_global[:, None, :])
            & seen_in_time
            & real[:, None, :]  # padded keys
            & real[:, :, None]  # padded queries attend to nothing
        )[:, None]  # (B, 1, N, N)
        scale = 1 / math.sqrt(self.head_dim)
        scores = torch.where(
            global_row, q_global @ k_global.transpose(-2, -1), q @ k.transpose(-2, -1)
        )  # (B, H, N, N)
        weights = masked_softmax(scores * scale, allowed)  # (B, H, N, N)
        context = torch.where(global_row, weights @ v_global, weights @ v)  # (B, H, N, d)
        output = self._finish(rearrange(context, "b h n d -> b n (h d)"), real)
        return AttentionOutput(output, weights if need_weights else None)

    def forward_fast(
        self,
        query,
        key,
        value,
        attention_mask,
        is_causal,
        need_weights,
        global_attention_mask=None,
    ) -> AttentionOutput:
        if need_weights:
            # The weights are a dense (B, H, N, N) tensor anyway; the oracle computes them.
            return self.forward_reference(
                query, key, value, attention_mask, is_causal, True, global_attention_mask
            )
        real, is_global = self._token_roles(query, attention_mask, global_attention_mask)
        positions, used = global_slots(is_global)  # (B, G), (B, G)
        context = self._banded_attention(query, real, is_global, positions, used, is_causal)
        if positions.shape[1]:
            global_rows = self._global_rows(query, real, positions, used, is_causal)  # (B, G, E)
            sequence, slot = used.nonzero(as_tuple=True)  # the slots holding a global token
            where = (sequence, positions[sequence, slot])
            context = context.index_put(where, global_rows[sequence, slot])  # (B, N, E)
        return AttentionOutput(self._finish(context, real), None)

    def _banded_attention(self, x, real, is_global, positions, used, is_causal) -> torch.Tensor:
        """Every query row by the local rules -> context (B, N, d_model).

        Keys are cut into chunks of `block` and each chunk is preceded by the G global keys,
        so the keys a block of queries may see (its window's chunks; the globals of the
        first one) are one contiguous stretch of that buffer: SDPA reads them through an
        overlapping strided view, and nothing bigger than k and v is copied.
        """
        batch, n, width = x.shape
        window = self.config.attention_window // 2
        block = max(1, min(BLOCK, window, n))
        num_blocks = -(-n // block)
        # Chunks each side of a block of queries (no more than the sequence has).
        before = min(-(-window // block), num_blocks - 1)
        after = 0 if is_causal else before
        num_global = positions.shape[1]
        rows = num_global + block  # buffer rows per chunk
        span = (before + 1 + after) * rows  # buffer rows a block of queries sees

        def chunked(tensor: torch.Tensor, fill, global_part: torch.Tensor) -> torch.Tensor:
            """(B, N, C) and (B, G, C) -> (B, chunks·rows, C): [G globals, block keys] per
            chunk, `fill` past the ends. Written in place: each element is copied once."""
            buffer = tensor.new_empty(batch, before + num_blocks + after, rows, tensor.shape[-1])
            buffer[:, :, :num_global] = global_part[:, None]
            keys = buffer[:, :, num_global:]  # (B, chunks, block, C)
            full, rest = divmod(n, block)  # whole chunks of keys, keys in the last one
            keys[:, :before] = fill
            keys[:, before : before + full] = tensor[:, : full * block].unflatten(1, (full, block))
            keys[:, before + full :] = fill
            if rest:
                keys[:, before + full, :rest] = tensor[:, full * block :]
            return buffer.flatten(1, 2)

        def spans(buffer: torch.Tensor) -> torch.Tensor:
            """(B, chunks·rows, C) -> (B, blocks, span, C), a view (spans overlap)."""
            return buffer.unfold(1, span, rows).transpose(-1, -2)

        # k and v in one product, (B, N, 2E), so the buffer is built once. The global keys
        # that local queries see use the local k and v (as in HF).
        weight = torch.cat([self.k_proj.weight, self.v_proj.weight])
        keys_values = F.linear(x, weight, torch.cat([self.k_proj.bias, self.v_proj.bias]))
        index = positions[..., None].expand(-1, -1, 2 * width)  # (B, G, 2E)
        # (Rebinding the name frees the projection once it is in the buffer.)
        keys_values = spans(chunked(keys_values, 0.0, keys_values.gather(1, index)))
        keys, values = keys_values.split(width, dim=-1)  # (B, blocks, span, E) each, views
        # Keys leaving the window: padding, past the ends and the global tokens (those come
        # in through their slots); a slot is unused where a sequence has fewer globals.
        key_ok = chunked((real & ~is_global)[..., None], False, used[..., None])[..., 0]
        key_ok = spans(key_ok[..., None])[..., 0]  # (B, blocks, span)
        mask = self._band_mask(key_ok, block, before, num_global, is_causal, x.dtype)
        if is_causal and num_global:
            query_position = torch.arange(num_blocks * block, device=x.device)
            future = positions[:, None, None, :] > query_position.view(num_blocks, block, 1)
            mask[..., :num_global].masked_fill_(future, -math.inf)  # (B, blocks, block, G)

        queries = self.q_proj(x)  # (B, N, E)
        if num_blocks * block > n:
            queries = F.pad(queries, (0, 0, 0, num_blocks * block - n))  # (B, blocks·block, E)
        h = self.num_heads
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

    def _band_mask(self, key_ok, block: int, before: int, num_global: int, is_causal, dtype):
        """Additive mask of the local rows, 0 where a query sees a key and -inf elsewhere.

        key_ok (B, blocks, span) bool: which keys of each block's span may be seen at all;
        the band (the same for every block) adds which lie within each query's window, and
        keeps the global slots of the first chunk only. -> (B, blocks, block, span)
        """
        window = self.config.attention_window // 2
        rows, span = num_global + block, key_ok.shape[-1]
        query = torch.arange(block, device=key_ok.device)[:, None]  # within its block
        column = torch.arange(span, device=key_ok.device)
        chunk, slot = column // rows, column % rows  # (span,)
        offset = query - (chunk - before) * block - (slot - num_global)  # query - key
        in_band = (offset <= window) & (offset >= (0 if is_causal else -window))
        seen = torch.where(slot < num_global, chunk == 0, in_band)  # (block, span)

        def bias(allowed: torch.Tensor) -> torch.Tensor:
            return torch.zeros_like(allowed, dtype=dtype).masked_fill(~allowed, -math.inf)

        mask = bias(key_ok)[:, :, None, :] + bias(seen)  # (B, blocks, block, span)
        # Every row sees its own key, so none is empty (SDPA would give NaN): a real local
        # query sees it anyway, and the other rows (padding, global, past N) are replaced.
        own = before * rows + num_global  # the column of query 0's own key
        mask[..., own : own + block].diagonal(dim1=-2, dim2=-1).fill_(0.0)
        return mask

    def _global_rows(self, x, real, positions, used, is_causal) -> torch.Tensor:
        """The global queries' rows: full attention with the global projections ->
        (B, G, d_model), one row per slot of `positions`."""
        n = x.shape[1]
        index = positions[..., None].expand(-1, -1, x.shape[-1])  # (B, G, E)
        q_global = self._split_heads(self.q_global_proj(x.gather(1, index)))  # (B, H, G, d)
        k_global = self._split_heads(self.k_global_proj(x))  # (B, H, N, d)
        v_global = self._split_heads(self.v_global_proj(x))
        allowed = real[:, None, None, :] & used[:, None, :, None]  # (B, 1, G, N)
        if is_causal:
            key_position = torch.arange(n, device=x.device)
            allowed = allowed & (key_position <= positions[:, None, :, None])
        # An unused slot sees nothing; let it see key 0 (finite) to keep SDPA free of NaN.
        # Its row is never read, so that key gets no gradient.
        allowed[..., 0] |= ~allowed.any(dim=-1)
        rows = F.scaled_dot_product_attention(q_global, k_global, v_global, attn_mask=allowed)
        return rearrange(rows, "b h g d -> b g (h d)")


@playground.hookimpl
def register_attention(register):
    register(LongformerAttention)
