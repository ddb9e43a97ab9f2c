"""Linformer: Wang et al. 2020, "Linformer: Self-Attention with Linear Complexity", §4.

Keys and values are projected along the *sequence* to k ≪ n slots before attention:

    head_i = softmax(Q W_i^Q (E_i K W_i^K)ᵀ / √d_k) · F_i V W_i^V          (§4, eq. 7)

with E_i, F_i of shape (k × n). Every query attends to k projected slots instead of n keys,
so time and memory are O(n·k): linear in n for a fixed k.

Sharing (§4, "Parameter sharing"), the `sharing` option:
    "headwise"   one E and one F per layer, shared by all heads (the default);
    "kv"         also E = F within the layer ("key-value sharing");
    "none"       every head has its own E_i, F_i, stored as (H, k, n);
    "layerwise"  one projection for all heads, keys and values (E = F, as "kv") that a
                 model builder shares across layers: build each layer with
                 sharing="layerwise" and call `layer.share_projections_with(first_layer)`,
                 after which the layers hold one and the same Parameter.
In "kv" and "layerwise", `E` and `F` are the same Parameter (the state dict lists it under
both names).

Lengths. E and F are sized for `seq_len` keys; a shorter input of n keys uses their first n
columns, E[:, :n] (as fairseq does), and a longer one raises UnsupportedFeature naming
`seq_len`, the option that lifts the limit. The default, 4096, is the long-document regime
Linformer is for: its attention FLOPs (8·n·k·d) drop below vanilla's (4·n²·d) once
n > 2k = 512 and are 1/8 of them at 4096 (0.3 of the total, projections included), while E
and F cost k·n = 1M parameters each (4 MiB in fp32).

Padding. Padded keys and values are zeroed after the k/v projections and before E and F,
so they add nothing to any projected slot and cannot leak. Unlike vanilla attention,
padding does not leave the softmax: the k slots mix real keys only, but each zero key still
lowers the scale of the slots it would have fed (E·K sums over positions). A batch element
whose keys are all padding outputs exactly zero.

What Linformer cannot do, so the variant declares it unsupported:
    causal   each projected slot E·K mixes keys from every position, future ones included,
             so no mask over the k slots can hide the future from query i (the paper, §4,
             uses Linformer as a bidirectional encoder only);
    weights  the contract's weights are probabilities over the Nk original keys; Linformer's
             are over the k projected slots, which are not keys, so there is nothing
             faithful to return.
    decoding for the same reason as causal: a token decoded later would change the slots,
             and so the outputs, of every token before it (`decoding=False`).

Initialisation: E and F follow fairseq's Linformer (examples/linformer), which initialises
its compression layer, nn.Linear(max_seq_len, k), with xavier_uniform and a gain of 1/√2:
uniform(±√(6 / (n + k)) / √2), per head for "none". The paper does not state one. The
q/k/v/out projections keep nn.Linear's default, like vanilla, so both variants start alike.

`impl="reference"` is eq. 7 spelt out: heads split, E and F applied per head with an
einsum, an explicit softmax. `impl="fast"` applies E and F to the projected (B, n, d_model)
keys and values in one matmul each, before the heads are split, then runs
`torch.nn.functional.scaled_dot_product_attention` over the k slots.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

import einops
import torch
import torch.nn.functional as F
from torch import nn

import playground
from playground import (
    AttentionOutput,
    AttentionVariant,
    Capabilities,
    ConfigError,
    VariantConfig,
)
from playground.config import build_config
from playground.heads import (
    add_projections,
    attention_flops,
    project_output,
    projection_flops,
    split_heads,
)
from playground.masks import queries_without_keys

Sharing = Literal["headwise", "kv", "none", "layerwise"]


@dataclass(frozen=True)
class LinformerConfig(VariantConfig):
    seq_len: int = 4096
    """Longest key sequence n; E and F are (k × n) and shorter inputs use their first n columns."""
    k: int = 256
    """Projected length: the slots keys and values are compressed to (the paper's 128 or 256)."""
    sharing: Sharing = "headwise"
    """"headwise" (one E, F for all heads), "kv" (E = F), "none" (per head), "layerwise"."""
    bias: bool = True
    """Add a bias to the q/k/v/out projections (as vanilla, so weights can be shared)."""
    dropout: float = 0.0
    """Dropout on the attention probabilities over the k slots, in training mode only."""

    def __post_init__(self) -> None:
        if self.seq_len < 1:
            raise ValueError(f"seq_len must be a positive integer; got {self.seq_len}")
        if not 1 <= self.k <= self.seq_len:
            raise ValueError(
                f"k must be between 1 and seq_len ({self.seq_len}); got {self.k}. "
                f"k is the number of slots the keys are compressed to: more slots than "
                f"keys only adds cost (the paper uses k = 128 or 256)"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1); got {self.dropout}")


class LinformerAttention(AttentionVariant):
    name = "linformer"
    summary = "Low-rank attention: keys and values projected along the sequence to k slots."
    paper = "Wang et al. 2020, Linformer: Self-Attention with Linear Complexity, §4"
    Config = LinformerConfig
    colour = "#d62728"  # red, in every figure
    capabilities = Capabilities(
        causal=False,  # projected slots mix every position (module docstring)
        padding_mask=True,
        cross_attention=True,
        need_weights=False,  # probabilities are over k slots, not the Nk keys
        max_seq_len=LinformerConfig.seq_len,  # per instance: the seq_len option
        dtypes=(torch.float32, torch.float64, torch.bfloat16),
        decoding=False,
        decoding_hint=(
            "every projected slot E·K mixes all seq_len positions, so each new token would "
            "change the outputs of the tokens before it: Linformer has no causal form to "
            "decode from. Generate with a causal variant (linear, performer, sliding_window)"
        ),
    )
    suite_options = {"seq_len": 130, "k": 8}  # the suite's long length, 130, fits
    # Made by add_projections in __init__; declared so that their calls are type-checked.
    q_proj: nn.Linear
    k_proj: nn.Linear
    v_proj: nn.Linear
    out_proj: nn.Linear

    @staticmethod
    def flops(n_q: int, n_k: int, d_model: int, num_heads: int, **options: Any) -> float:
        # With fewer keys than k, E[:, :n_k] still makes k slots: of rank <= n_k, but the
        # softmax over them needs every one of their k scores.
        k = int(options.get("k", LinformerConfig.k))
        sequence_projections = 2 * 2 * k * n_k * d_model  # E·K and F·V
        return (
            projection_flops(n_q, n_k, d_model)
            + sequence_projections
            + attention_flops(n_q * k, d_model)  # Q K'ᵀ and P V' over k slots
        )

    @classmethod
    def capabilities_for(cls, config: VariantConfig) -> Capabilities:
        """The length limit is the seq_len option: E and F are sized for it."""
        assert isinstance(config, LinformerConfig), "built from its own Config"
        return dataclasses.replace(
            cls.capabilities,
            max_seq_len=config.seq_len,
            max_seq_len_hint=(
                f"its E and F projections are sized for seq_len={config.seq_len} keys; build it "
                f"with seq_len >= the key length, e.g. playground.build('linformer', "
                f"seq_len=...), or split the input into chunks of at most {config.seq_len}"
            ),
        )

    def __init__(self, d_model: int = 512, num_heads: int = 8, **options: object) -> None:
        super().__init__(d_model, num_heads, **options)
        config = self.config
        add_projections(self, d_model, bias=config.bias)
        shape: tuple[int, ...] = (config.k, config.seq_len)
        if config.sharing == "none":
            shape = (num_heads, *shape)  # (H, k, n): one E_i, F_i per head
        self.E = nn.Parameter(self._xavier_uniform(shape))  # projects keys
        if config.sharing in ("kv", "layerwise"):
            self.F = self.E  # one Parameter under both names
        else:
            self.F = nn.Parameter(self._xavier_uniform(shape))  # projects values

    @staticmethod
    def _xavier_uniform(shape: tuple[int, ...]) -> torch.Tensor:
        """fairseq's init of its (k × n) compression layer: xavier_uniform, gain 1/√2."""
        k, n = shape[-2:]
        bound = math.sqrt(6.0 / (n + k)) / math.sqrt(2.0)
        return torch.empty(shape).uniform_(-bound, bound)

    def share_projections_with(self, other: LinformerAttention) -> None:
        """Use `other`'s E and F Parameters from now on (§4, "layerwise sharing").

        Build every layer with sharing="layerwise" and call this on each layer with the
        first one: all layers then train one (k × n) projection for keys and values. It
        works for the other sharing modes too (the layers then share their E and F).
        """
        if not isinstance(other, LinformerAttention):
            raise ConfigError(
                f"share_projections_with takes another linformer layer; got {type(other).__name__}"
            )
        if other.config.sharing != self.config.sharing or other.E.shape != self.E.shape:
            raise ConfigError(
                f"layers can share projections only with the same sharing, k, seq_len (and "
                f"num_heads for sharing='none'); this layer has sharing="
                f"{self.config.sharing!r} and E of shape {tuple(self.E.shape)}, the other "
                f"sharing={other.config.sharing!r} and {tuple(other.E.shape)}"
            )
        self.E = other.E
        self.F = other.F

    @classmethod
    def fit_options(cls, options: dict, seq_len: int) -> dict:
        """E and F sized for the task's length when seq_len is unset; where that length
        is invalid with the other options (the default k = 256 slots for 64 tokens), the
        default seq_len stays, which fits any shorter input."""
        if "seq_len" in options:
            return dict(options)
        try:
            build_config(cls.Config, {**options, "seq_len": seq_len}, cls.name)
        except ConfigError:
            return dict(options)
        return {**options, "seq_len": seq_len}

    @classmethod
    def picture_options(cls, options: dict, seq_len: int) -> dict:
        """E and F sized for the picture, with k a quarter of it so the slots show."""
        return {
            **options,
            "seq_len": seq_len,
            "k": playground.picture_width(options.get("k", 256), seq_len),
        }

    def pattern_weights(self, query: torch.Tensor) -> tuple[torch.Tensor, str]:
        return self.slot_weights(query), "projected slot (of k)"

    def share_with_first_layer(self, first) -> tuple[str, ...]:
        """§4 "layerwise sharing": one projection for every layer of the stack."""
        if self.config.sharing != "layerwise":
            return ()
        self.share_projections_with(first)
        return ("projections",)

    def forward_reference(
        self, query, key, value, attention_mask, is_causal, need_weights
    ) -> AttentionOutput:
        h, n_k = self.num_heads, key.shape[1]
        q = split_heads(self.q_proj(query), h)  # (B, H, Nq, d_k)
        k, v = self.k_proj(key), self.v_proj(value)  # (B, Nk, d_model)
        if attention_mask is not None:
            padding = ~attention_mask[..., None]  # (B, Nk, 1)
            k, v = k.masked_fill(padding, 0.0), v.masked_fill(padding, 0.0)
        k = split_heads(k, h)  # (B, H, Nk, d_k)
        v = split_heads(v, h)  # (B, H, Nk, d_v)
        # First n_k columns; shared projections are the same matrix for every head.
        E = self.E[..., :n_k].expand(h, -1, -1)  # (H, k, Nk)
        F_ = self.F[..., :n_k].expand(h, -1, -1)  # (H, k, Nk)
        k = einops.einsum(E, k, "h s n, b h n d -> b h s d")  # K' = E K: (B, H, k, d_k)
        v = einops.einsum(F_, v, "h s n, b h n d -> b h s d")  # V' = F V: (B, H, k, d_v)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, Nq, k)
        weights = scores.softmax(dim=-1)  # over the k slots; none is masked
        mixed = F.dropout(weights, self.config.dropout, self.training) @ v  # (B, H, Nq, d_v)
        empty = queries_without_keys(attention_mask, query.shape[1], n_k, False)
        return AttentionOutput(project_output(self, mixed, empty), None)  # (B, Nq, d_model)

    def slot_weights(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The attention probabilities over the k projected slots: (B, H, Nq, k).

        These are eq. 7's softmax(Q (E K)ᵀ / √d_k), as `forward_reference` computes them
        (before dropout): the contract's `weights` cannot hold them (they are over slots,
        not keys), so they are offered here, for inspection and plots. Each row sums to 1.
        `key` defaults to `query`; `attention_mask` (B, Nk) zeroes padded keys before E,
        as in forward.
        """
        key = query if key is None else key
        self.check_call(query, key, key, attention_mask, {}, is_cross=key is not query)
        h, n_k = self.num_heads, key.shape[1]
        q = split_heads(self.q_proj(query), h)  # (B, H, Nq, d_k)
        k = self.k_proj(key)  # (B, Nk, d_model)
        if attention_mask is not None:
            k = k.masked_fill(~attention_mask[..., None], 0.0)
        k = split_heads(k, h)  # (B, H, Nk, d_k)
        E = self.E[..., :n_k].expand(h, -1, -1)  # (H, k, Nk)
        k = einops.einsum(E, k, "h s n, b h n d -> b h s d")  # K' = E K: (B, H, k, d_k)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, Nq, k)
        return scores.softmax(dim=-1)

    def _compress(
        self,
        projection: nn.Linear,
        tokens: torch.Tensor,
        sequence_projection: torch.Tensor,
        attention_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """E · (tokens W) for the fast path: (B, Nk, d_model) → (B, H, k, d_k).

        Called for keys, then values, so only one full-length projection is alive at once.
        """
        projected = projection(tokens)  # (B, Nk, d_model)
        if attention_mask is not None:
            projected = projected * attention_mask[..., None].to(projected.dtype)
        if sequence_projection.dim() == 2:
            # One matmul on the unsplit tokens: (k, Nk) @ (B, Nk, d_model) → (B, k, d_model).
            return split_heads(sequence_projection @ projected, self.num_heads)
        per_head = projected.unflatten(-1, (self.num_heads, -1))  # (B, Nk, H, d_k): a view
        return einops.einsum(sequence_projection, per_head, "h s n, b n h d -> b h s d")

    def forward_fast(
        self, query, key, value, attention_mask, is_causal, need_weights
    ) -> AttentionOutput:
        n_k = key.shape[1]
        k = self._compress(self.k_proj, key, self.E[..., :n_k], attention_mask)  # (B, H, k, d_k)
        v = self._compress(self.v_proj, value, self.F[..., :n_k], attention_mask)  # (B, H, k, d_v)
        dropout = self.config.dropout if self.training else 0.0
        # q lives only inside this call, so inference frees it before out_proj allocates.
        mixed = F.scaled_dot_product_attention(
            split_heads(self.q_proj(query), self.num_heads),
            k,
            v,
            dropout_p=dropout,
        )  # (B, H, Nq, d_v)
        # SDPA lays its output out as (B, Nq, H, d_v), so merging the heads is a view.
        empty = queries_without_keys(attention_mask, query.shape[1], n_k, False)
        return AttentionOutput(project_output(self, mixed, empty), None)  # (B, Nq, d_model)


@playground.hookimpl
def register_attention(register):
    register(LinformerAttention)
