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
The `global_tokens` option counts from each sequence's first real token, so that padding on
the left moves them with the tokens (a sequence's [CLS] is its first token however padded).

Causal mode (not in the paper) keeps every rule and removes the future: the window looks
back only (i - w <= j <= i), a global query i sees the keys j <= i, and a global key j is seen
only by queries i >= j. A global position past the input then changes nothing in it, so
`global_tokens` past the input are ignored under causal masking (refused without it).

`impl="reference"` builds the full (N, N) mask of these rules and does a masked softmax:
O(N²), the oracle. `impl="fast"` is banded, O(N·(w + G)) in time and memory: the local rows
are the core's `banded_attention` (playground.kernels) with the global tokens as prefix
keys, and the global rows are one more SDPA call over (B, H, G, N), with K_g and V_g folded
into the G global queries when that is cheaper than projecting every token. Backward: the
banded kernel's own (fused, in place over the key buffer) and SDPA's for the global rows.
SDPA cannot return probabilities, so `need_weights=True` runs the reference (the
dense (B, H, N, N) weights are O(N²) anyway).

Decoding follows the causal rules with a key/value cache (`LongformerState`): the local k
and v of the last w + 1 positions in a rolling buffer, those of the global tokens kept for
good (left out of the buffer, so a global key inside the window is counted once), and,
while a position of `global_tokens` is still to come in some sequence, K_g and V_g of every
token, which its global query reads (then dropped). The state stops growing past
max(w + 1, the last global position + 1) tokens. A decoded token is global by
`global_tokens` alone (the prefill's `global_attention_mask` covers the prompt), and then
exactly: it reads K_g and V_g of every token before it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import playground
from playground import AttentionOutput, AttentionVariant, Capabilities, InvalidInput, VariantConfig
from playground.decoding import (
    DecodingState,
    TokenCache,
    cached_attention,
    refuse_forward_arguments,
)
from playground.heads import merge_heads, project_output, split_heads
from playground.kernels import BAND_BLOCK, banded_attention
from playground.masks import masked_softmax


@dataclass(frozen=True)
class LongformerConfig(VariantConfig):
    attention_window: int = 512
    """Total window (even), as in Longformer and HF: query i sees the keys j with
    |i - j| <= attention_window / 2; causal: i - attention_window / 2 <= j <= i."""
    global_tokens: tuple[int, ...] = ()
    """Positions with global attention in every sequence, counted from its first real token,
    e.g. (0,) for a [CLS] token; OR-ed with the forward argument `global_attention_mask`
    (B, N) bool. Under causal masking, positions past the input are ignored (only later
    tokens would see them)."""

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
    suite_options = {"attention_window": 4, "global_tokens": (0,)}
    # The reference scores every pair, twice (local and global projections), and masks;
    # flops() is the band's and the global rows' pairs, which the fast path attends to.
    flops_counted_path = "fast"

    @staticmethod
    def flops(n_q: int, n_k: int, d_model: int, num_heads: int, **options: Any) -> float:
        window = int(options.get("attention_window", 512))
        num_global = min(len(set(options.get("global_tokens", ()))), n_q)
        projections = 2 * (n_q + 2 * n_k + n_q) * d_model * d_model  # q, k, v, out
        local_pairs = (n_q - num_global) * (min(n_k, window + 1) + num_global)
        scores_and_mix = 2 * 2 * local_pairs * d_model  # Q Kᵀ and P V
        if num_global and folds_global_keys(num_global, num_heads, d_model):
            # q_g for the global tokens; K_g and V_g folded into them (_global_rows).
            width = d_model + 1
            projections += 2 * num_global * d_model * d_model + 2 * 2 * num_global * d_model * width
            scores_and_mix += 2 * 2 * num_global * num_heads * n_k * width
        elif num_global:
            # q_g for the global tokens only; k_g and v_g for every position they attend to.
            projections += 2 * (num_global + 2 * n_k) * d_model * d_model
            scores_and_mix += 2 * 2 * num_global * n_k * d_model
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
        return (*super().special_sizes(), self.config.attention_window // 2, BAND_BLOCK)

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
        self,
        x: torch.Tensor,
        attention_mask: torch.Tensor | None,
        global_attention_mask,
        is_causal: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """real (B, N) bool: not padding; is_global (B, N) bool: real tokens with global
        attention (config positions OR `global_attention_mask`)."""
        batch, n, _ = x.shape
        real = attention_mask
        if real is None:
            real = torch.ones(batch, n, dtype=torch.bool, device=x.device)
        outside = [p for p in self.config.global_tokens if p >= n]
        if outside and not is_causal:
            raise InvalidInput(
                f"global_tokens {outside} lie outside a sequence of length {n}; use positions "
                f"below {n} or pass per-sequence positions as global_attention_mask"
            )
        index = first_real(real)[:, None] + self._global_offsets(x.device)  # (B, G)
        rows = torch.arange(batch, device=x.device)[:, None].expand_as(index)
        inside = index < n
        is_global = torch.zeros(batch, n, dtype=torch.bool, device=x.device)
        is_global[rows[inside], index[inside]] = True
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
        real, is_global = self._token_roles(query, attention_mask, global_attention_mask, is_causal)
        n = query.shape[1]
        q, k, v = self._head_projections(query, self.q_proj, self.k_proj, self.v_proj)
        q_global, k_global, v_global = self._head_projections(
            query, self.q_global_proj, self.k_global_proj, self.v_global_proj
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
        output = project_output(self, context, _padded(real))
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
        real, is_global = self._token_roles(query, attention_mask, global_attention_mask, is_causal)
        positions, used = global_slots(is_global)  # (B, G), (B, G)
        context = self._banded_attention(query, real, is_global, positions, used, is_causal)
        if positions.shape[1]:
            global_rows = self._global_rows(query, real, positions, used, is_causal)  # (B, G, E)
            sequence, slot = used.nonzero(as_tuple=True)  # the slots holding a global token
            where = (sequence, positions[sequence, slot])
            context = context.index_put(where, global_rows[sequence, slot])  # (B, N, E)
        return AttentionOutput(project_output(self, context, _padded(real)), None)

    def _banded_attention(self, x, real, is_global, positions, used, is_causal) -> torch.Tensor:
        """Every query row by the local rules -> context (B, N, d_model): the core's banded
        kernel, with the global tokens as prefix keys every local query sees."""
        window = self.config.attention_window // 2
        # k and v in one product, (B, N, 2E), as the kernel takes them. The global keys
        # that local queries see use the local k and v (as in HF).
        weight = torch.cat([self.k_proj.weight, self.v_proj.weight])
        keys_values = F.linear(x, weight, torch.cat([self.k_proj.bias, self.v_proj.bias]))
        index = positions[..., None].expand(-1, -1, keys_values.shape[-1])  # (B, G, 2E)
        has_global = positions.shape[1] > 0
        return banded_attention(
            self.q_proj(x),
            keys_values,
            real & ~is_global,  # global keys come in as prefix keys (their slots)
            self.num_heads,
            before=window,
            after=0 if is_causal else window,
            prefix_keys_values=keys_values.gather(1, index) if has_global else None,
            prefix_ok=used if has_global else None,  # a slot is unused where fewer globals
            prefix_positions=positions if is_causal and has_global else None,
        )

    def _global_rows(self, x, real, positions, used, is_causal) -> torch.Tensor:
        """The global queries' rows: full attention with the global projections ->
        (B, G, d_model), one row per slot of `positions`.

        Only the G global queries read K_g and V_g, so with few of them (G·H < d_model)
        those projections of every token are folded into the queries instead of computed:
        per head h, with x̂ = [x, 1] and Ŵ = [W | b],
            scores = q_h (x W_k,hᵀ + b_k,h)ᵀ = (q_h Ŵ_k,h) x̂ᵀ
            rows   = P (x W_v,hᵀ + b_v,h)    = (P x̂) Ŵ_v,hᵀ,
        O(G·H·N·d_model) instead of O(N·d_model²); the same numbers to rounding."""
        batch, n, width = x.shape
        heads, slots = self.num_heads, positions.shape[1]
        index = positions[..., None].expand(-1, -1, width)  # (B, G, E)
        q_global = split_heads(self.q_global_proj(x.gather(1, index)), heads)  # (B, H, G, d)
        allowed = real[:, None, None, :] & used[:, None, :, None]  # (B, 1, G, N)
        if is_causal:
            key_position = torch.arange(n, device=x.device)
            allowed = allowed & (key_position <= positions[:, None, :, None])
        # An unused slot sees nothing; let it see key 0 (finite) to keep SDPA free of NaN.
        # Its row is never read, so that key gets no gradient.
        allowed[..., 0] |= ~allowed.any(dim=-1)
        if not folds_global_keys(slots, heads, width):
            k_global = split_heads(self.k_global_proj(x), heads)  # (B, H, N, d)
            v_global = split_heads(self.v_global_proj(x), heads)
            rows = F.scaled_dot_product_attention(q_global, k_global, v_global, attn_mask=allowed)
            return merge_heads(rows)  # (B, G, E)

        def augmented(projection: nn.Linear) -> torch.Tensor:  # Ŵ per head: (H, d, E + 1)
            return torch.cat([projection.weight, projection.bias[:, None]], 1).view(
                heads, -1, width + 1
            )

        tokens = torch.cat([x, x.new_ones(batch, n, 1)], dim=-1)[:, None]  # x̂: (B, 1, N, E + 1)
        queries = q_global @ augmented(self.k_global_proj)  # (B, H, G, E + 1)
        # Every head's queries against the one x̂: (B, 1, H·G, E + 1), no copy of x̂ per head.
        mixed = F.scaled_dot_product_attention(
            queries.flatten(1, 2)[:, None],
            tokens,
            tokens,
            attn_mask=allowed.expand(-1, heads, -1, -1).flatten(1, 2)[:, None],
            scale=1 / math.sqrt(self.head_dim),
        )  # P x̂: (B, 1, H·G, E + 1)
        rows = mixed.reshape(batch, heads, slots, width + 1) @ augmented(self.v_global_proj).mT
        return merge_heads(rows)  # (B, G, E)

    # --- decoding: a rolling window of local keys, the global tokens' kept for good -------
    def prefill_state(
        self, prompt, attention_mask, max_length, global_attention_mask=None, **extra
    ):
        refuse_forward_arguments(self.name, extra)  # global_attention_mask is its only one
        output = self(
            prompt,
            attention_mask=attention_mask,
            is_causal=True,
            global_attention_mask=global_attention_mask,
        ).output
        real, is_global = self._token_roles(prompt, attention_mask, global_attention_mask, True)
        k, v = self._head_projections(prompt, self.k_proj, self.v_proj)  # (B, H, P, d) each
        window = self.config.attention_window // 2 + 1  # i - w <= j <= i
        state = LongformerState(
            TokenCache(window=window, max_length=max_length), TokenCache(), first_real(real)
        )
        state.local.append(real & ~is_global, k=k, v=v)
        columns = is_global.any(dim=0)  # positions global in some sequence
        state.global_keys.append(is_global[:, columns], k=k[:, :, columns], v=v[:, :, columns])
        last_global = self._last_global_position(state)
        if last_global >= prompt.shape[1]:  # a global query is still to come
            state.global_projected = TokenCache(max_length=last_global + 1)
            k_global, v_global = self._head_projections(
                prompt, self.k_global_proj, self.v_global_proj
            )
            state.global_projected.append(real, k=k_global, v=v_global)
        return output, state

    def step_state(self, token, state):
        position = state.length
        offset = position - state.first_real  # (B,): the position in each sequence
        is_global = torch.isin(offset, self._global_offsets(offset.device))[:, None]  # (B, 1)
        q, k, v = self._head_projections(
            token, self.q_proj, self.k_proj, self.v_proj
        )  # (B, H, 1, d)
        # A global token's local key and value are kept for good, and out of the window.
        state.local.append(~is_global, k=k, v=v)
        if is_global.any():
            state.global_keys.append(is_global, k=k, v=v)
        projected = state.global_projected
        if projected is not None:
            k_global, v_global = self._head_projections(
                token, self.k_global_proj, self.v_global_proj
            )
            projected.append(k=k_global, v=v_global)
        scale = 1 / math.sqrt(self.head_dim)
        # Local: the global keys, then the window, with the local q, k and v.
        caches = (state.global_keys, state.local)
        kept = [cache.kept_entries() for cache in caches]
        keys, values = (torch.cat([entries[name] for entries in kept], dim=2) for name in "kv")
        allowed = torch.cat([cache.kept_real() for cache in caches], dim=1)[:, None, None, :]
        context, empty = cached_attention(q, keys, values, allowed, scale)
        if projected is not None and bool(is_global.any()):  # every token so far: Q_g, K_g, V_g
            (q_global,) = self._head_projections(token, self.q_global_proj)
            entries, allowed = projected.kept_entries(), projected.kept_real()[:, None, None, :]
            rows, seen = cached_attention(q_global, entries["k"], entries["v"], allowed, scale)
            context = torch.where(is_global[:, :, None, None], rows, context)  # (B, H, 1, d)
            empty = torch.where(is_global[:, :, None], seen, empty)
        if projected is not None and position >= self._last_global_position(state):
            state.global_projected = None  # no global query is left to read K_g and V_g
        return project_output(self, context, empty)

    def _last_global_position(self, state: LongformerState) -> int:
        """The last position at which some sequence has a global token; −1 for none."""
        if not self.config.global_tokens:
            return -1
        return int(state.first_real.max()) + max(self.config.global_tokens)

    def _global_offsets(self, device: torch.device) -> torch.Tensor:
        """`global_tokens` (G,) int64: positions after each sequence's first real token."""
        return torch.tensor(self.config.global_tokens, dtype=torch.long, device=device)

    def _head_projections(self, x: torch.Tensor, *projections: nn.Linear) -> list[torch.Tensor]:
        """x (B, N, E) through each projection, split into heads: (B, H, N, d) each."""
        return [split_heads(projection(x), self.num_heads) for projection in projections]


class LongformerState(DecodingState):
    """The local k and v of the last w + 1 positions (`local`, a rolling buffer whose global
    tokens are marked not real) and of every global token (`global_keys`), (B, H, slots, d)
    each; K_g, V_g of every token (`global_projected`) while a global query is to come; and
    where each sequence starts (`first_real` (B,) int64), which `global_tokens` count from."""

    def __init__(self, local: TokenCache, global_keys: TokenCache, first_real: torch.Tensor):
        super().__init__()
        self.local = local
        self.global_keys = global_keys
        self.global_projected: TokenCache | None = None
        self.first_real = first_real


def first_real(real: torch.Tensor) -> torch.Tensor:
    """(B,) int64: the position of each sequence's first real token in real (B, N) bool, N
    for a sequence with none (its first token is still to come)."""
    return (~real).long().cumprod(dim=1).sum(dim=1)  # the padding before it


def folds_global_keys(num_global: int, num_heads: int, d_model: int) -> bool:
    """Whether `_global_rows` folds K_g and V_g into the global queries: when that costs
    less than projecting every token (G·H < d_model)."""
    return num_global * num_heads < d_model


def _padded(real: torch.Tensor) -> torch.Tensor | None:
    """(B, N, 1) bool: padded query positions, whose output is exactly 0; None if none."""
    return None if real.all() else ~real[..., None]


@playground.hookimpl
def register_attention(register):
    register(LongformerAttention)
