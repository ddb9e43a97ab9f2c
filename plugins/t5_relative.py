"""T5 relative position bias: Raffel et al. 2020, "Exploring the Limits of Transfer Learning
with a Unified Text-to-Text Transformer", §2.1 ("Model").

Each head h adds a learned scalar to its logits that depends only on the bucket of the
relative position r = j − i (key index minus query index):

    scores[h, i, j] = scale · q_i · k_j + b[bucket(j − i), h]          (§2.1)

`b` is `relative_attention_bias = nn.Embedding(num_buckets, num_heads)`. Buckets follow
T5 (and Mesh TensorFlow): bidirectionally, half the buckets are for r ≤ 0 and half, offset
by num_buckets / 2, for r > 0; with `is_causal=True` (T5's decoder) every bucket goes to
r ≤ 0 and the future shares bucket 0 (it is masked anyway). On each side the first half of
the buckets are exact distances 0, 1, …; the rest are log-spaced up to `max_distance`,
beyond which all distances share the last bucket.

This matches HF transformers' `T5Attention` (with `has_relative_attention_bias=True`;
`is_decoder` there is `is_causal` here) when built with `scale=1.0, bias=False`: T5 does
not divide the logits by √d_head but folds that factor into its initialisation. The
default here, `scale=None`, is the usual 1/√d_head. T5 computes the bias in its first
layer and reuses it in every layer; `share_relative_bias_with` gives a model builder the
same sharing.

`impl="reference"` builds the dense (1, H, Nq, Nk) bias with `logit_bias` (T5's
`compute_bias`) and runs the math above line by line. `impl="fast"` hands the bias of each
relative position to the core's `relative_bias_attention` (playground.kernels), which feeds
it to the fused `F.scaled_dot_product_attention` as a float mask, without materialising it:

- The bias is Toeplitz (constant along diagonals j − i). Reversing the keys (and values,
  which leaves attention unchanged) makes it Hankel: with j' = Nk − 1 − j the bias is a
  function of i + j', so rows i of the mask are consecutive sliding windows of one
  (H, Nq + Nk − 1) vector, an `unfold` view that costs no memory.
- Only the integer buckets of that vector are cached, per (Nq, Nk, causal, device).
  The bias values are gathered from the embedding on every forward, so a cache can never
  serve a stale bias after the table is trained and the autograd graph stays whole; the
  gather is O(Nq + Nk), negligible next to the attention.
- Causality is −inf on the diagonals with j > i, so it lives in the same vector. Queries
  are processed in blocks of `block_size`; a causal block skips the keys after its last
  query, and a padding mask is materialised for one block only, (B, H, block, Nk).
Peak memory of a forward is therefore O(n · block) (O(n) without padding), never
O(H · n²). A `need_weights=True` call runs the reference (the core's rule: the weights are
dense anyway). Training: the table needs a gradient, which SDPA does not give a mask, so
each block runs on the core's `hankel_biased_attention` (the CPU flash kernel forward and a
fused backward that sums the bias gradient along the Hankel view's anti-diagonals);
nothing of size (block, Nk) outlives its block, so training memory is O(H · block · Nk).

Decoding keeps every key and value (a key/value cache, allocated once when the length is
known); the bias is not kept: a new token at position i looks up each kept key's bucket,
bucket(j − i) with the causal buckets of T5's decoder, in the table, as HF's T5 does for
its cache positions, and one fused SDPA call takes it as a float mask (−inf at padding).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

import playground
from playground import AttentionOutput, AttentionVariant, Capabilities, VariantConfig
from playground.heads import (
    add_projections,
    attention_flops,
    prefill_key_value_cache,
    project_heads,
    project_output,
    projection_flops,
)
from playground.kernels import relative_bias_attention
from playground.masks import allowed_keys, empty_query_rows, masked_softmax, queries_without_keys


def relative_position_bucket(
    relative_position: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int
) -> torch.Tensor:
    """T5's bucket (an int64 in [0, num_buckets)) of each relative position j − i.

    The arithmetic (float32 log, truncation toward zero) is T5's, so buckets agree
    exactly with the released checkpoints, not just approximately.
    """
    if bidirectional:
        per_side = num_buckets // 2
        offset = (relative_position > 0).long() * per_side  # r > 0 uses the upper half
        distance = relative_position.abs()
    else:
        per_side = num_buckets
        offset = torch.zeros_like(relative_position)
        distance = (-relative_position).clamp(min=0)  # the future collapses onto distance 0
    max_exact = per_side // 2
    # Clamping keeps log() away from 0; those distances take the exact branch below.
    far = distance.clamp(min=max_exact).float()
    log_fraction = torch.log(far / max_exact) / math.log(max_distance / max_exact)
    log_bucket = max_exact + (log_fraction * (per_side - max_exact)).long()  # truncates
    log_bucket = log_bucket.clamp(max=per_side - 1)
    return offset + torch.where(distance < max_exact, distance, log_bucket)


@dataclass(frozen=True)
class T5RelativeConfig(VariantConfig):
    num_buckets: int = 32
    """Rows of the bias table; half per direction when bidirectional (T5: 32)."""
    max_distance: int = 128
    """Distances from here on share the last bucket of their side (T5: 128)."""
    scale: float | None = None
    """Factor on q · k; None = 1/√d_head. T5 uses 1.0 (it folds √d_head into its init)."""
    bias: bool = True
    """Add a bias to the q/k/v/out projections (T5 has none: use False to match it)."""
    dropout: float = 0.0
    """Dropout on the attention probabilities, in training mode only (T5: 0.1)."""
    block_size: int = 256
    """Queries per fused call in the fast path; bounds what a block holds to
    (B, H, block_size, Nk) (a padding mask; in training, the backward's probabilities).
    Results do not depend on it; in CPU training, smaller blocks keep that memory warm
    from block to block (see docs/design.md)."""

    def __post_init__(self) -> None:
        if self.num_buckets < 4 or self.num_buckets % 2:
            raise ValueError(
                f"num_buckets must be an even integer >= 4 (half per direction, and each half "
                f"needs exact and log-spaced buckets); got {self.num_buckets}. T5 uses 32."
            )
        if self.max_distance <= self.num_buckets // 2:
            raise ValueError(
                f"max_distance must exceed num_buckets / 2 = {self.num_buckets // 2}, where "
                f"the log-spaced buckets start; got {self.max_distance}. T5 uses 128."
            )
        if self.scale is not None and not (math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"scale must be a positive number or None; got {self.scale}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1); got {self.dropout}")
        if self.block_size < 1:
            raise ValueError(f"block_size must be a positive integer; got {self.block_size}")


class T5RelativeAttention(AttentionVariant):
    name = "t5_relative"
    summary = "Softmax attention plus T5's learned, bucketed relative position bias per head."
    paper = "Raffel et al. 2020, Exploring the Limits of Transfer Learning (T5), §2.1"
    Config = T5RelativeConfig
    colour = "#9467bd"  # purple, in every figure
    encodes_positions = True  # the bias replaces absolute positional encodings (§2.1)
    capabilities = Capabilities(
        causal=True,
        padding_mask=True,
        cross_attention=True,
        need_weights=True,
        dtypes=(torch.float32, torch.float64, torch.bfloat16),
    )
    # Blocks of 5 queries (a partial last block, causal key skipping) and buckets that
    # reach their log-spaced and clamped ranges within the suite's 16 tokens.
    suite_options = {"block_size": 5, "num_buckets": 8, "max_distance": 6}
    flops_uncounted = "the bias added to every score, 1 per score"

    @staticmethod
    def flops(n_q: int, n_k: int, d_model: int, num_heads: int, **options: object) -> float:
        bias_add = n_q * n_k * num_heads
        return projection_flops(n_q, n_k, d_model) + attention_flops(n_q * n_k, d_model) + bias_add

    def __init__(self, d_model: int = 512, num_heads: int = 8, **options: object) -> None:
        super().__init__(d_model, num_heads, **options)
        config = self.config
        self.scale = config.scale if config.scale is not None else 1 / math.sqrt(self.head_dim)
        add_projections(self, d_model, bias=config.bias)
        self.relative_attention_bias = nn.Embedding(config.num_buckets, num_heads)
        # T5's initialisation of the table, N(0, 1/d_model) (nn.Embedding's own is N(0, 1):
        # biases of ±1 per distance at the start, which training must first undo).
        nn.init.normal_(self.relative_attention_bias.weight, std=d_model**-0.5)
        # (Nq, Nk, causal, device) -> (Nq + Nk - 1,) int64 buckets of the fast path's bias
        # vector. Integers only: the values come from the embedding on every call.
        self._bucket_cache: dict[tuple, torch.Tensor] = {}

    def share_relative_bias_with(self, other: T5RelativeAttention) -> None:
        """Use `other`'s bias table (the same Parameter) from now on, as T5 shares one
        table across all the layers of a stack."""
        mine, theirs = self.config, other.config
        if (mine.num_buckets, mine.max_distance, self.num_heads) != (
            theirs.num_buckets,
            theirs.max_distance,
            other.num_heads,
        ):
            raise ValueError(
                f"can only share a relative bias table between layers with the same "
                f"num_buckets, max_distance and num_heads; got ({mine.num_buckets}, "
                f"{mine.max_distance}, {self.num_heads}) and ({theirs.num_buckets}, "
                f"{theirs.max_distance}, {other.num_heads})"
            )
        self.relative_attention_bias = other.relative_attention_bias

    def share_with_first_layer(self, first) -> tuple[str, ...]:
        """T5 computes the bias in its first layer and reuses it in every layer (§2.1)."""
        self.share_relative_bias_with(first)
        return ("relative_bias",)

    def learned_summary(self):
        """How far each head's learned bias spans across the buckets (max − min): 0 for a
        head that ignores position, large for one that prefers some distances."""
        table = self.relative_attention_bias.weight  # (num_buckets, H)
        return {"bias range over buckets, per head": table.amax(0) - table.amin(0)}

    def logit_bias(
        self,
        query_length: int,
        key_length: int,
        bidirectional: bool = True,
        device: torch.device | None = None,
    ) -> torch.Tensor:
        """(1, H, query_length, key_length) bias, as T5's `compute_bias`."""
        device = self.relative_attention_bias.weight.device if device is None else device
        query_position = torch.arange(query_length, device=device)[:, None]
        key_position = torch.arange(key_length, device=device)[None, :]
        buckets = relative_position_bucket(
            key_position - query_position,  # (Nq, Nk): j − i
            bidirectional,
            self.config.num_buckets,
            self.config.max_distance,
        )
        values = self.relative_attention_bias(buckets)  # (Nq, Nk, H)
        return rearrange(values, "q k h -> 1 h q k")

    def forward_reference(
        self, query, key, value, attention_mask, is_causal, need_weights
    ) -> AttentionOutput:
        q, k, v = project_heads(self, query, key, value)  # (B, H, N, d_head)
        n_q, n_k = q.shape[2], k.shape[2]
        position_bias = self.logit_bias(n_q, n_k, not is_causal, q.device)  # (1, H, Nq, Nk)
        scores = self.scale * q @ k.transpose(-2, -1) + position_bias.to(q.dtype)  # (B, H, Nq, Nk)
        allowed = allowed_keys(attention_mask, n_q, n_k, is_causal, q.device)
        weights = masked_softmax(scores, allowed)  # (B, H, Nq, Nk)
        mixed = F.dropout(weights, self.config.dropout, self.training) @ v  # (B, H, Nq, d_head)
        output = project_output(self, mixed, empty_query_rows(allowed))
        return AttentionOutput(output, weights if need_weights else None)

    # --- the fast path ------------------------------------------------------------------
    def _bias_per_offset(self, n_q: int, n_k: int, is_causal: bool) -> torch.Tensor:
        """(H, Nq + Nk − 1): the bias of every relative position j − i from −(Nq − 1) to
        Nk − 1, what the core's `relative_bias_attention` takes."""
        table = self.relative_attention_bias.weight  # (num_buckets, H)
        cache_key = (n_q, n_k, is_causal, table.device)
        buckets = self._bucket_cache.get(cache_key)
        if buckets is None:
            relative_position = torch.arange(-(n_q - 1), n_k, device=table.device)  # j − i
            buckets = relative_position_bucket(
                relative_position, not is_causal, self.config.num_buckets, self.config.max_distance
            )
            if len(self._bucket_cache) >= 8:  # a few shapes in flight; forget the oldest
                self._bucket_cache.pop(next(iter(self._bucket_cache)))
            self._bucket_cache[cache_key] = buckets
        return table[buckets].t()  # differentiable in the table

    def forward_fast(
        self, query, key, value, attention_mask, is_causal, need_weights
    ) -> AttentionOutput:
        q, k, v = project_heads(self, query, key, value)  # (B, H, N, d_head)
        n_q, n_k = q.shape[2], k.shape[2]
        context = relative_bias_attention(
            q,
            k,
            v,
            self._bias_per_offset(n_q, n_k, is_causal),
            attention_mask,
            is_causal,
            self.scale,
            self.config.block_size,
            self.config.dropout if self.training else 0.0,
        )  # (B, H, Nq, d_head)
        empty = queries_without_keys(attention_mask, n_q, n_k, is_causal)  # (B, Nq, 1) or None
        return AttentionOutput(project_output(self, context, empty), None)

    # --- decoding: a key/value cache, and the bias of each kept key's distance -----------
    prefill_state = prefill_key_value_cache  # the prompt's outputs; its k and v cached

    def step_state(self, token, state):
        q, k, v = project_heads(self, token, token, token)  # (B, H, 1, d_head)
        state.append(keys=k, values=v)
        kept = state.kept_entries()
        buckets = relative_position_bucket(
            state.kept_positions() - state.length,  # (L,): j − i ≤ 0, i the new token
            False,  # causal: T5's decoder buckets
            self.config.num_buckets,
            self.config.max_distance,
        )
        bias = rearrange(self.relative_attention_bias(buckets), "k h -> 1 h 1 k")  # (1, H, 1, L)
        padding = ~state.kept_real()[:, None, None, :]  # (B, 1, 1, L)
        bias = bias.to(q.dtype).masked_fill(padding, -math.inf)  # (B, H, 1, L)
        context = F.scaled_dot_product_attention(
            q, kept["keys"], kept["values"], attn_mask=bias, scale=self.scale
        )  # (B, H, 1, d_head); the token sees itself, so never a query without keys
        return project_output(self, context, None)


@playground.hookimpl
def register_attention(register):
    register(T5RelativeAttention)
