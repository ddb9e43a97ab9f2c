"""`SoftmaxAttention`: softmax attention whose scores or mask a variant changes, written
as FlexAttention's `score_mod` and `mask_mod` (torch.nn.attention.flex_attention):

    score_mod(score, b, h, q_idx, kv_idx) -> score     the scaled score q·k/√d, changed
    mask_mod(b, h, q_idx, kv_idx) -> bool               True where query q_idx may see kv_idx

A variant subclasses it, sets name/summary/paper, and overrides one or both methods; the
same methods can be handed to `flex_attention`. The base owns the projections, heads, the
call's padding mask and `is_causal` (AND-ed with `mask_mod`), queries that see nothing
(zero output, as in FlexAttention: a query with no finite score, masked out or given −inf
by `score_mod`, gets a zero context, and in every head a zero output), FLOPs, and three
paths. What the mods and `project`/`context_mod` return is checked (a HookError names
the hook), so a wrong layout fails with a message instead of deep inside a kernel:

- reference: dense (B, H, Nq, Nk) scores; the mods are evaluated on broadcast index
  tensors (b (B,1,1,1), h (1,H,1,1), q_idx (1,1,Nq,1), kv_idx (1,1,1,Nk)), so a mod written
  with torch operations (`score - slope[h] * (q_idx - kv_idx).abs()`) works unchanged; then
  a masked softmax. The oracle.
- CPU fast path. With no mods and no padding, one SDPA call. A `relative_score_mod`
  (score + g(h, kv − q)) without a `mask_mod` is evaluated once per relative position and
  run by `kernels.relative_bias_attention` (a Toeplitz view; a fused backward for g),
  unless g is −inf somewhere (a query may then see no key: the blocked path finds it).
  Otherwise blocked over queries: on every call, as FlexAttention builds its block mask,
  `mask_mod` (with causality) is evaluated into a map of the key span each block of
  queries can see (a mod may read state that changes between calls: document ids, a
  scheduled window), and keys outside it are never touched, so a window of w costs
  O(n·(w + block)) attention time and memory, plus O(n²) cheap evaluations of the rule
  itself. Within a span, an additive `score_mod` (`additive_score_mod = True`: score +
  f(b, h, q, kv)) is turned into a bias for fused SDPA; any other is applied to explicit
  block scores. In training each block is recomputed in backward (activation
  checkpointing), so memory stays O(n · block) and parameters used in `score_mod` get
  their gradients; without a `score_mod`, when all blocks' masks together take no more
  than q, k and v (a window's do; a dense causal mask's do not), the masks are kept
  instead and every block goes to one `kernels.blocked_attention` call, whose fused
  backward adds each span's key gradients in place. FlexAttention has no CPU backward,
  which is why this path exists.
- CUDA: `flex_attention` with `create_block_mask`, compiled, with the same methods.

`need_weights=True` runs the reference (the weights are dense anyway).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from playground.config import VariantConfig
from playground.contract import AttentionOutput, AttentionVariant, Capabilities, _hook_error
from playground.errors import HookError
from playground.heads import (
    add_projections,
    attention_flops,
    project_heads,
    project_output,
    projection_flops,
)
from playground.kernels import (
    biased_attention,
    blocked_attention,
    relative_bias_attention,
    transforms_active,
)
from playground.masks import masked_softmax, queries_without_keys

MOD_CHUNK_ELEMENTS = 2**19
"""How many (b, h, q, kv) entries the CPU fast path evaluates a mod on per call."""
SPAN_CHUNK_ELEMENTS = 2**16
"""How many (q, kv) entries `mask_mod` is evaluated on per call while finding each block's
key span: the whole (Nq, Nk) grid is visited on every call, and at this size a mod's
integer intermediates stay in cache."""


@dataclass(frozen=True)
class SoftmaxConfig(VariantConfig):
    bias: bool = True
    """Add a bias to the q/k/v/out projections."""
    block_size: int = 256
    """Queries per block of the CPU fast path: bounds its working memory to
    (B, H, block_size, span). Results do not depend on it."""

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be a positive integer; got {self.block_size}")


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


def _broadcasts(shape: torch.Size, target: torch.Size | tuple[int, ...]) -> bool:
    """Whether a tensor of `shape` broadcasts to `target` without growing it."""
    try:
        return torch.broadcast_shapes(shape, target) == torch.Size(target)
    except RuntimeError:  # sizes that do not broadcast
        return False


def _described(value: object) -> str:
    """A hook's result, for an error message: its kind, and a tensor's dtype and shape."""
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        return f"a tensor of dtype {dtype} and shape {tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}: " + ", ".join(map(_described, value))
    return f"{type(value).__name__} {value!r}"


class SoftmaxAttention(AttentionVariant):
    """Softmax attention with FlexAttention-style `score_mod` / `mask_mod` (module
    docstring). Subclass it, set `name`, `summary`, `paper`, and override a mod."""

    Config = SoftmaxConfig
    capabilities = Capabilities(
        causal=True,
        padding_mask=True,
        cross_attention=True,
        need_weights=True,
        dtypes=(torch.float32, torch.float64, torch.bfloat16),
    )
    suite_options: ClassVar[dict[str, Any]] = {"block_size": 32}  # partial and several blocks
    additive_score_mod: ClassVar[bool] = False
    """True when `score_mod(score, …)` is `score + f(b, h, q_idx, kv_idx)`: the CPU fast
    path then hands f to fused SDPA as a bias instead of forming the scores itself. The
    contract suite's fast-versus-reference check catches a wrong declaration."""
    relative_score_mod: ClassVar[bool] = False
    """True when `score_mod(score, b, h, q_idx, kv_idx)` is `score + g(h, kv_idx − q_idx)`:
    additive, the same for every batch element, and a function of the relative position
    only. The CPU fast path then evaluates g once per relative position, O(H · (Nq + Nk)),
    and reads it as a Toeplitz bias (`kernels.relative_bias_attention`), never forming a
    (blk, Nk) bias per block. Checked like `additive_score_mod`."""

    @staticmethod
    def flops(n_q: int, n_k: int, d_model: int, num_heads: int, **options: object) -> float:
        return projection_flops(n_q, n_k, d_model) + attention_flops(n_q * n_k, d_model)

    def __init__(self, d_model: int = 512, num_heads: int = 8, **options: object) -> None:
        super().__init__(d_model, num_heads, **options)
        add_projections(self, d_model, bias=self.config.bias)
        self.scale = 1 / math.sqrt(self.head_dim)

    # --- what a variant overrides ----------------------------------------------------
    def score_mod(
        self,
        score: torch.Tensor,
        b: torch.Tensor,
        h: torch.Tensor,
        q_idx: torch.Tensor,
        kv_idx: torch.Tensor,
    ) -> torch.Tensor:
        """The scaled score q·k/√d of query q_idx and key kv_idx in head h of batch
        element b, changed; the default leaves it as it is."""
        return score

    def mask_mod(
        self, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> torch.Tensor:
        """True where query q_idx may attend to key kv_idx; the default allows all."""
        return torch.ones_like(q_idx >= kv_idx)

    def project(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, H, Nq, d), k and v (B, H, Nk, d) from the inputs: the contract's
        projections, split into heads. Override to change queries and keys before they
        meet (rotate them by position, normalise them), calling this first; every path
        uses it."""
        return project_heads(self, query, key, value)

    def context_mod(self, context: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """Each head's output (B, H, Nq, d) before the output projection, changed by a
        function of the query input (B, Nq, d_model) (an output gate, say); the default
        leaves it as it is. Every path uses it."""
        return context

    def logit_bias(self, n_q: int, n_k: int) -> torch.Tensor | None:
        """An additive `score_mod`'s f(b, h, q_idx, kv_idx) for batch element 0: the
        bias figure draws it. None for a score_mod that is not additive, or none."""
        if not (self._has_score_mod and self._additive):
            return None
        device = next(self.parameters()).device
        b, h, q_idx, kv_idx = index_grid(
            1, self.num_heads, torch.arange(n_q, device=device), torch.arange(n_k, device=device)
        )
        zero = torch.zeros((), device=device)
        return self._scores(zero, b, h, q_idx, kv_idx).broadcast_to(1, self.num_heads, n_q, n_k)

    @property
    def _has_score_mod(self) -> bool:
        return type(self).score_mod is not SoftmaxAttention.score_mod

    @property
    def _additive(self) -> bool:
        return self.additive_score_mod or self.relative_score_mod

    @property
    def _has_mask_mod(self) -> bool:
        return type(self).mask_mod is not SoftmaxAttention.mask_mod

    def _output(
        self, context: torch.Tensor, query: torch.Tensor, empty: torch.Tensor | None
    ) -> torch.Tensor:
        """context (B, H, Nq, d) -> output (B, Nq, d_model): `context_mod`, then the output
        projection (queries that see nothing output zero)."""
        changed = self.context_mod(context, query)
        if not isinstance(changed, torch.Tensor) or changed.shape != context.shape:
            raise self._hook_problem(
                "context_mod(context, query)",
                f"returned {_described(changed)}; it must return each head's output "
                f"(B, H, Nq, d) = {tuple(context.shape)}, the shape of the context it is "
                "given (the query input is (B, Nq, d_model): apply a gate to the context, "
                "do not return it)",
            )
        return project_output(self, changed, empty)

    # --- calling the hooks: a result of the wrong kind is refused, naming the hook -------
    def _hook_problem(self, hook: str, problem: str) -> HookError:
        return _hook_error(self, f"{type(self).__name__}.{hook}", problem)

    def _projected(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`project`'s q, k, v, checked against the layout every path reads: q (B, H, Nq,
        d), k and v (B, H, Nk, ·), q and k of one width. A wrong layout would otherwise
        fail deep inside a kernel, or broadcast into wrong outputs."""
        projected = self.project(query, key, value)
        batch, n_q, n_k, heads = query.shape[0], query.shape[1], key.shape[1], self.num_heads
        expected = (
            f"q (B, H, Nq, d) = ({batch}, {heads}, {n_q}, d), k and v (B, H, Nk, d) = "
            f"({batch}, {heads}, {n_k}, d), q and k of one width d (split the heads with "
            "playground.heads.split_heads, (B, N, H·d) -> (B, H, N, d))"
        )
        if not (
            isinstance(projected, (tuple, list))
            and len(projected) == 3
            and all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in projected)
        ):
            raise self._hook_problem(
                "project(query, key, value)",
                f"returned {_described(projected)}; it must return three tensors: {expected}",
            )
        q_k_v = q, k, v = projected
        if not (
            q.shape[:3] == (batch, heads, n_q)
            and k.shape[:3] == v.shape[:3] == (batch, heads, n_k)
            and q.shape[-1] == k.shape[-1]
        ):
            shapes = ", ".join(
                f"{name} {tuple(t.shape)}" for name, t in zip("qkv", q_k_v, strict=True)
            )
            raise self._hook_problem(
                "project(query, key, value)", f"returned {shapes}; expected {expected}"
            )
        return q, k, v

    def _scores(
        self,
        score: torch.Tensor,
        b: torch.Tensor,
        h: torch.Tensor,
        q_idx: torch.Tensor,
        kv_idx: torch.Tensor,
    ) -> torch.Tensor:
        """`score_mod(score, b, h, q_idx, kv_idx)`, checked: a floating tensor that
        broadcasts to the shape of its arguments together (a constant, 0-dimensional, is
        one score for every pair, as in FlexAttention). Returned as it is; callers
        broadcast it."""
        result = self.score_mod(score, b, h, q_idx, kv_idx)
        shape = torch.broadcast_shapes(score.shape, b.shape, h.shape, q_idx.shape, kv_idx.shape)
        fits = isinstance(result, torch.Tensor) and result.is_floating_point()
        if fits and _broadcasts(result.shape, shape):
            return result
        raise self._hook_problem(
            "score_mod(score, b, h, q_idx, kv_idx)",
            f"returned {_described(result)}; it must return a floating-point tensor that "
            f"broadcasts to its arguments' shape {tuple(shape)}: the score changed by torch "
            "operations on it and on the index tensors (b (B,1,1,1), h (1,H,1,1), q_idx "
            "(1,1,Nq,1), kv_idx (1,1,1,Nk))",
        )

    def _mask(
        self, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> torch.Tensor:
        """`mask_mod(b, h, q_idx, kv_idx)` as a bool tensor (B or 1, H or 1, Nq, Nk). A
        rule that ignores kv_idx or q_idx (a per-query or per-head rule) gives size-1
        dimensions there, which every caller needs at full size; the batch and head
        dimensions stay 1 where the rule does not depend on them, so no copy is made per
        batch element or head. Anything else, an int tensor or a Python bool, is refused."""
        allowed = self.mask_mod(b, h, q_idx, kv_idx)
        shape = (b.shape[0], h.shape[1], q_idx.shape[2], kv_idx.shape[3])
        is_mask = isinstance(allowed, torch.Tensor) and allowed.dtype == torch.bool
        if is_mask and _broadcasts(allowed.shape, shape):
            lead = (1,) * (4 - allowed.dim()) + tuple(allowed.shape)  # (B?, H?, ·, ·)
            return allowed.broadcast_to((lead[0], lead[1], shape[2], shape[3]))
        raise self._hook_problem(
            "mask_mod(b, h, q_idx, kv_idx)",
            f"returned {_described(allowed)}; it must return a bool tensor that broadcasts "
            f"to the index tensors' shape (B, H, queries, keys), {shape} in this call, True "
            "where query q_idx may see key kv_idx: a "
            "comparison of the index tensors (b (B,1,1,1), h (1,H,1,1), q_idx (1,1,Nq,1), "
            "kv_idx (1,1,1,Nk)) such as `(q_idx - kv_idx).abs() < w` (`!= 0` makes an int "
            "tensor bool; `torch.ones_like(q_idx >= kv_idx)` allows every key)",
        )

    # --- reference ---------------------------------------------------------------------
    def _allowed(self, b, h, q_idx, kv_idx, keep, is_causal) -> torch.Tensor | None:
        """mask_mod ∧ causality ∧ padding, (B or 1, H or 1, Nq, Nk); None = all."""
        allowed = self._mask(b, h, q_idx, kv_idx) if self._has_mask_mod else None
        if is_causal:
            causal = q_idx >= kv_idx
            allowed = causal if allowed is None else allowed & causal
        if keep is not None:
            padding = keep[:, None, None, :]  # (B, 1, 1, Nk)
            allowed = padding if allowed is None else allowed & padding
        return allowed

    def forward_reference(
        self, query, key, value, attention_mask, is_causal, need_weights
    ) -> AttentionOutput:
        q, k, v = self._projected(query, key, value)  # (B, H, N, d)
        batch, heads, n_q, n_k = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        b, h, q_idx, kv_idx = index_grid(
            batch, heads, torch.arange(n_q, device=q.device), torch.arange(n_k, device=q.device)
        )
        scores = q @ k.transpose(-2, -1) * self.scale  # (B, H, Nq, Nk)
        # A mod's float32 constants must not promote bf16 scores.
        scores = self._scores(scores, b, h, q_idx, kv_idx).to(q.dtype).broadcast_to(scores.shape)
        allowed = self._allowed(b, h, q_idx, kv_idx, attention_mask, is_causal)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, -math.inf)
        weights = masked_softmax(scores, None)  # (B, H, Nq, Nk); 0 on rows with no score
        # A query with no finite score in any head outputs exactly zero, as FlexAttention's
        # path does (a −inf log-sum-exp in every head): masked out, or −inf from score_mod.
        empty = torch.isneginf(scores.amax(dim=-1)).all(dim=1)[..., None]  # (B, Nq, 1)
        output = self._output(weights @ v, query, empty)
        return AttentionOutput(
            output, weights.expand(batch, heads, n_q, n_k) if need_weights else None
        )

    # --- fast paths --------------------------------------------------------------------
    def forward_fast(
        self, query, key, value, attention_mask, is_causal, need_weights
    ) -> AttentionOutput:
        if query.is_cuda:
            return self._forward_flex(query, key, value, attention_mask, is_causal)
        if self._has_score_mod and self.relative_score_mod and not self._has_mask_mod:
            relative_bias = self._score_mod_per_offset(query.shape[1], key.shape[1], query)
            # A −inf in g hides keys and may leave a query none, which the Toeplitz kernel
            # cannot tell (its output must be zero); the blocked path finds such queries.
            if not bool(torch.isneginf(relative_bias).any()):
                return self._forward_relative(
                    query, key, value, attention_mask, is_causal, relative_bias
                )
        return self._forward_blocked(query, key, value, attention_mask, is_causal)

    def _score_mod_per_offset(self, n_q: int, n_k: int, like: torch.Tensor) -> torch.Tensor:
        """(H, Nq + Nk − 1): g(h, r) of a relative score_mod for r = kv_idx − q_idx from
        −(Nq − 1) to Nk − 1, evaluated at in-range index pairs (q, kv) = (−r, 0) for r < 0
        and (0, r) otherwise, so a mod that looks indices up in a table stays in it."""
        offsets = torch.arange(-(n_q - 1), n_k, device=like.device)
        zero = torch.zeros((), dtype=like.dtype, device=like.device)
        b, h, q_idx, kv_idx = index_grid(1, self.num_heads, (-offsets).clamp(min=0), offsets)
        bias = self._scores(zero, b, h, q_idx.view(1, 1, 1, -1), kv_idx.clamp(min=0))
        return bias.to(like.dtype).broadcast_to(1, self.num_heads, 1, len(offsets))[0, :, 0]

    def _forward_relative(
        self, query, key, value, attention_mask, is_causal, relative_bias: torch.Tensor
    ) -> AttentionOutput:
        """The relative path, given g per relative position (`_score_mod_per_offset`)."""
        q, k, v = self._projected(query, key, value)  # (B, H, N, d)
        n_q, n_k = q.shape[2], k.shape[2]
        context = relative_bias_attention(
            q,
            k,
            v,
            relative_bias,
            attention_mask,
            is_causal,
            self.scale,
            self.config.block_size,
        )
        empty = queries_without_keys(attention_mask, n_q, n_k, is_causal)  # (B, Nq, 1) or None
        return AttentionOutput(self._output(context, query, empty), None)

    def _key_spans(
        self, batch: int, heads: int, n_q: int, n_k: int, is_causal: bool, device
    ) -> list[tuple[int, int, int, int]]:
        """Per block of queries: (start, stop, key_start, key_stop), the keys from the
        first to the last any of its queries may see under mask_mod and causality (the
        padding mask is applied within the spans).

        Derived again on every call, as FlexAttention's block mask is: a mask_mod may read
        state that changes between calls of one shape (document ids set per batch, a
        window a schedule widens), and spans kept from an earlier call would silently
        drop the keys it now allows."""
        spans, block = [], self.config.block_size
        keys = torch.arange(n_k, device=device)
        # Rows per evaluation of the mod, so that its intermediates stay small.
        rows = max(1, min(block, SPAN_CHUNK_ELEMENTS // n_k))
        for start in range(0, n_q, block):
            stop = min(start + block, n_q)
            if not self._has_mask_mod:  # causality at most: query i sees keys 0 … i
                spans.append((start, stop, 0, min(stop, n_k) if is_causal else n_k))
                continue
            seen = torch.zeros(n_k, dtype=torch.uint8, device=device)  # keys anyone here sees
            for first in range(start, stop, rows):
                queries = torch.arange(first, min(first + rows, stop), device=device)
                b, h, q_idx, kv_idx = index_grid(batch, heads, queries, keys)
                allowed = self._mask(b, h, q_idx, kv_idx)
                if is_causal:
                    allowed = allowed & (q_idx >= kv_idx)
                # (B?, H?, rows, Nk) -> (Nk,); a max over bytes is vectorised, bool any is not.
                seen = seen.maximum(allowed.view(torch.uint8).amax(dim=(0, 1, 2)))
            where = seen.nonzero()
            key_start, key_stop = (int(where[0]), int(where[-1]) + 1) if len(where) else (0, 0)
            spans.append((start, stop, key_start, key_stop))
        return spans

    def _span_mask(
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
        rows = rows if self._has_score_mod else block
        zero = torch.zeros((), dtype=like.dtype, device=like.device)
        masks, sees = [], []
        for first in range(start, start + block, rows):
            queries = torch.arange(first, min(first + rows, start + block), device=keys.device)
            b, h, q_idx, kv_idx = index_grid(batch, heads, queries, keys)
            mask = None
            if self._has_score_mod:  # f(b, h, q, kv), broadcast to this chunk's rows
                bias = self._scores(zero, b, h, q_idx, kv_idx).to(like.dtype)
                mask = bias.broadcast_to(
                    torch.broadcast_shapes(bias.shape, (1, 1, len(queries), span))
                )
            allowed = self._allowed(b, h, q_idx, kv_idx, keep, is_causal)  # None: all seen
            if allowed is not None:
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
            masks.append(mask)
        if masks[0] is None:
            return None, None
        shape = (*masks[0].shape[:-2], block, span)
        out = None
        if scratch is not None:
            size = math.prod(shape) * masks[0].element_size()
            out = scratch[:size].view(masks[0].dtype).view(shape)
        seen = torch.cat(sees, dim=-1) if sees else None
        if seen is not None and bool(seen.all()):
            seen = None  # every query sees a key: nothing to zero
        return torch.cat(masks, dim=-2, out=out), seen

    def _attend_span(
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
        `scratch`: memory for the block's mask (`_span_mask`)."""
        batch, heads, block, span = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        if self._has_score_mod and not self._additive:
            b, h, q_idx, kv_idx = index_grid(
                batch,
                heads,
                torch.arange(start, start + block, device=q.device),
                torch.arange(key_start, key_start + span, device=q.device),
            )
            scores = q @ k.transpose(-2, -1) * self.scale  # (B, H, blk, span)
            scores = self._scores(scores, b, h, q_idx, kv_idx).to(q.dtype)
            scores = scores.broadcast_to(batch, heads, block, span)
            allowed = self._allowed(b, h, q_idx, kv_idx, keep, is_causal)  # None: all seen
            if allowed is not None:
                scores = scores.masked_fill(~allowed, -math.inf)
            # A query sees a key when it may and its score there is finite (B, H, blk).
            sees = ~torch.isneginf(scores.amax(dim=-1))
            context = masked_softmax(scores, None) @ v
        else:
            mask, sees = self._span_mask(
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

    def _mask_bytes(self, spans, batch, heads, attention_mask, device) -> int:
        """Bytes that every block's mask, kept for backward as SDPA keeps it (float, one
        per batch element and head it differs by), would take together."""
        b, h, q_idx, kv_idx = index_grid(
            batch,
            heads,
            torch.zeros(1, dtype=torch.long, device=device),
            torch.zeros(1, dtype=torch.long, device=device),
        )
        probe = self._mask(b, h, q_idx, kv_idx) if self._has_mask_mod else q_idx >= 0
        copies = (batch if attention_mask is not None else probe.shape[0]) * probe.shape[1]
        entries = sum(
            (stop - start) * (key_stop - key_start) for start, stop, key_start, key_stop in spans
        )
        return 4 * copies * entries

    def _forward_blocked(self, query, key, value, attention_mask, is_causal) -> AttentionOutput:
        q, k, v = self._projected(query, key, value)  # (B, H, N, d)
        if not (self._has_score_mod or self._has_mask_mod) and attention_mask is None:
            # Nothing to mask but causality, which SDPA does itself: no blocks needed.
            context = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=self.scale)
            return AttentionOutput(self._output(context, query, None), None)
        batch, heads, n_q, n_k = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        spans = self._key_spans(batch, heads, n_q, n_k, is_causal, q.device)
        # Training: recompute each block in backward, so only one block's scores live;
        # unless the blocks keep only a mask for backward (no score_mod), and all of
        # their masks together are no larger than q, k and v (a window, not a dense
        # causal mask): then keeping them costs less than running each block twice.
        # (torch.func transforms have no saved-tensor hooks, which checkpointing needs.)
        recompute = torch.is_grad_enabled() and len(spans) > 1 and not transforms_active()
        if recompute and not self._has_score_mod:
            recompute = self._mask_bytes(spans, batch, heads, attention_mask, q.device) > (
                3 * q.numel() * q.element_size()
            )
        if torch.is_grad_enabled() and not q.is_cuda and not recompute:
            fused = self._forward_fused(q, k, v, spans, attention_mask, is_causal)
            if fused is not None:
                context, empty = fused
                return AttentionOutput(self._output(context, query, empty), None)
        scratch = None
        if not torch.is_grad_enabled() and (self._additive or not self._has_score_mod):
            # Inference: every block's mask in one buffer, whose pages are then touched
            # once per call; a fresh large allocation per block costs as much in page
            # faults as evaluating the mod.
            widest = max(
                (stop - start) * (key_stop - key_start)
                for start, stop, key_start, key_stop in spans
            )
            # A bias (B, H, blk, span) in q's dtype, or a bool mask, which has a head
            # dimension when mask_mod depends on the head.
            per_entry = heads * (q.element_size() if self._has_score_mod else 1)
            scratch = q.new_empty(batch * widest * per_entry, dtype=torch.uint8)
        contexts, empties = [], []
        for start, stop, key_start, key_stop in spans:
            if key_stop <= key_start:  # this block sees no key at all
                contexts.append(q.new_zeros(batch, heads, stop - start, q.shape[-1]))
                empties.append(torch.ones(batch, stop - start, dtype=torch.bool, device=q.device))
                continue
            attend = functools.partial(
                self._attend_span, start, key_start, is_causal, scratch=scratch
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
        return AttentionOutput(self._output(context, query, empty if empty.any() else None), None)

    def _forward_fused(
        self, q, k, v, spans, attention_mask, is_causal
    ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """Training on CPU when every block's mask is kept: one `blocked_attention` call
        over all blocks, whose backward adds each span's key gradients in place (autograd
        through per-block slices would give every block a zero tensor the size of all
        the keys). -> (context (B, H, Nq, d), empty (B, Nq, 1) or None), or None when this
        path does not apply: a score_mod that is not additive, or a bias that needs a
        gradient (the per-block path gives it one)."""
        if self._has_score_mod and not self._additive:
            return None
        batch, heads = q.shape[0], q.shape[1]
        masks, seen = [], []
        for start, stop, key_start, key_stop in spans:
            if key_stop <= key_start:
                masks.append(None)
                seen.append(torch.zeros(batch, 1, stop - start, dtype=torch.bool, device=q.device))
                continue
            keep = None if attention_mask is None else attention_mask[:, key_start:key_stop]
            shape = (batch, heads, stop - start, key_stop - key_start)
            mask, sees = self._span_mask(start, key_start, shape, keep, is_causal, q)
            if mask is not None and mask.requires_grad:
                return None
            masks.append(mask)
            seen.append(
                torch.ones(batch, 1, stop - start, dtype=torch.bool, device=q.device)
                if sees is None
                else sees
            )
        context = blocked_attention(q, k, v, spans, masks, self.scale)
        seen = torch.cat([rows.expand(batch, heads, -1) for rows in seen], dim=-1)  # (B, H, Nq)
        if bool(seen.all()):
            return context, None
        context = context.masked_fill(~seen[..., None], 0.0)
        return context, ~seen.any(dim=1)[..., None]

    def _forward_flex(self, query, key, value, attention_mask, is_causal) -> AttentionOutput:
        from torch.nn.attention.flex_attention import create_block_mask

        q, k, v = self._projected(query, key, value)  # (B, H, N, d)
        batch, heads, n_q, n_k = q.shape[0], q.shape[1], q.shape[2], k.shape[2]

        def mask_mod(b, h, q_idx, kv_idx):
            allowed = self.mask_mod(b, h, q_idx, kv_idx) if self._has_mask_mod else q_idx >= 0
            if is_causal:
                allowed = allowed & (q_idx >= kv_idx)
            if attention_mask is not None:
                allowed = allowed & attention_mask[b, kv_idx]
            return allowed

        block_mask = create_block_mask(mask_mod, batch, heads, n_q, n_k, device=q.device)
        context, log_sum_exp = _compiled_flex_attention()(
            q,
            k,
            v,
            score_mod=self.score_mod if self._has_score_mod else None,
            block_mask=block_mask,
            scale=self.scale,
            return_lse=True,
        )  # (B, H, Nq, d), (B, H, Nq); a query that sees nothing gets 0 and lse −inf
        empty = torch.isneginf(log_sum_exp).all(dim=1)[..., None]  # (B, Nq, 1)
        return AttentionOutput(self._output(context, query, empty), None)


class ExactAttention(SoftmaxAttention):
    """Softmax attention with nothing changed: what fidelity and the patterns figure
    compare every variant against. Part of the core, not a registered variant, so that
    the comparison does not depend on which plugins are installed."""

    name = "exact"
    summary = "exact multi-head softmax attention"
    paper = "Vaswani et al. 2017, Attention Is All You Need, §3.2"


@functools.cache
def _compiled_flex_attention():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)
