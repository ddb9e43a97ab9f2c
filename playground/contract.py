"""The attention contract: what every variant is, takes and returns.

A variant subclasses `AttentionVariant`, declares its class attributes (name, summary,
paper, Config, capabilities, flops) and writes `forward_reference` (the paper's math) and,
optionally, `forward_fast`. The base class owns `forward`: it fills in defaults, checks
every input, refuses undeclared features with `UnsupportedFeature`, and then runs the
path chosen by the `impl` option. Variants therefore never re-check their inputs.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import numbers
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, NamedTuple

import torch
from torch import nn

from playground.config import VariantConfig, build_config
from playground.decoding import (
    DecodingState,
    RecomputeState,
    left_aligned,
    real_tokens,
    shifted,
)
from playground.errors import ConfigError, HookError, InvalidInput, UnsupportedFeature


class AttentionOutput(NamedTuple):
    """What every variant returns."""

    output: torch.Tensor
    """(B, Nq, d_model)"""
    weights: torch.Tensor | None
    """(B, H, Nq, Nk) attention probabilities when `need_weights=True`, else None."""


FLOAT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Capabilities:
    """What a variant can do; the core refuses everything else with UnsupportedFeature."""

    causal: bool = False
    """`is_causal=True`: query i sees keys j <= i."""
    padding_mask: bool = False
    """`attention_mask` (B, Nk) bool, True = real token."""
    cross_attention: bool = False
    """`key`/`value` different from `query` (and possibly of another length)."""
    need_weights: bool = False
    """`need_weights=True` returns the (B, H, Nq, Nk) attention probabilities."""
    weights_sum_to_one: bool = True
    """With `need_weights`: each real query's weights sum to 1. False for weights that
    are not a distribution (sigmoid attention's, differential attention's)."""
    weights_nonnegative: bool = True
    """With `need_weights`: no weight is negative. False for differential attention,
    whose weights are a difference of two softmaxes."""
    deterministic_in_training: bool = True
    """Two training-mode calls on the same input give the same output. False for a
    variant that draws random numbers in training (Performer redrawing its features):
    the contract suite then gives every training call it compares the same seed."""
    max_seq_len: int | None = None
    """Longest key sequence the variant accepts; None = no limit."""
    max_seq_len_hint: str = ""
    """What to do about a longer sequence (which option lifts the limit), for the error."""
    dtypes: tuple[torch.dtype, ...] = (torch.float32,)
    """Floating dtypes the variant computes in."""
    decoding: bool = True
    """A causal variant decodes one token at a time (`prefill`, `decode_step`); False for
    one whose outputs a later token changes, with the reason in `decoding_hint`. A variant
    that is not causal never decodes."""
    decoding_hint: str = ""

    def features(self) -> list[str]:
        """Short names of the declared features, for tables."""
        names = ["causal", "padding_mask", "cross_attention", "need_weights"]
        listed = [name for name in names if getattr(self, name)]
        if self.max_seq_len is not None:
            listed.append(f"max_seq_len={self.max_seq_len}")
        short = {
            torch.float32: "fp32",
            torch.float64: "fp64",
            torch.bfloat16: "bf16",
            torch.float16: "fp16",
        }
        listed.append("/".join(short.get(d, str(d)) for d in self.dtypes))
        return listed


class AttentionVariant(nn.Module):
    """Base class of every attention variant. See docs/design.md, "The contract"."""

    name: ClassVar[str]
    """Registry name, e.g. "vanilla"."""
    summary: ClassVar[str]
    """One line saying what the variant does."""
    paper: ClassVar[str]
    """The paper (and section) whose math `forward_reference` follows."""
    Config: ClassVar[type[VariantConfig]] = VariantConfig
    """The variant's options: a frozen dataclass deriving from VariantConfig."""
    capabilities: ClassVar[Capabilities] = Capabilities()
    forward_kwargs: ClassVar[tuple[str, ...]] = ()
    """Extra keyword-only forward arguments of this variant (all optional)."""
    encodes_positions: ClassVar[bool] = False
    """True when the variant injects position information itself (a relative bias), so a
    model built from it leaves out absolute positional encodings."""
    colour: ClassVar[str | None] = None
    """The variant's colour in every figure (a matplotlib colour such as "#1f77b4");
    None: one derived stably from its name."""
    display_name: ClassVar[str | None] = None
    """How legends, tables and the report name the variant ("T5 relative bias"); None:
    its registry name."""
    suite_options: ClassVar[dict[str, Any]] = {}
    """Options the contract suite builds the variant with, so that its small inputs
    exercise what is special about it (a window shorter than the sequence, say)."""

    @staticmethod
    def flops(n_q: int, n_k: int, d_model: int, num_heads: int, **options: Any) -> float:
        """Useful floating-point operations of one forward pass for one batch element,
        projections included (a multiply-add counts as 2)."""
        raise NotImplementedError

    # How the contract suite checks `flops()` against torch's FlopCounterMode
    # (playground/testing/flops.py): it counts the matrix products of one path.
    flops_counted_path: ClassVar[Literal["reference", "fast"]] = "reference"
    """The path whose matrix products `flops()` claims: "reference", or "fast" when the
    reference does work the algorithm does not need (it forms the (Nq, Nk) matrix of a
    linear-cost method, scores every pair and then masks most, or multiplies in a costlier
    order). A fused attention call is counted by the pairs its mask lets through."""
    flops_tolerance: ClassVar[float] = 0.05
    """How far `flops()` may lie from the count, as a share of it: room for the work it
    includes that is no matrix product (named in `flops_uncounted`). The count leaves out
    softmax, exp, sums and every elementwise operation, and so does a `flops()` that
    claims products only; 5% holds about one operation per score at the suite's
    narrowest heads (8 features: 32 FLOPs of products per score and head)."""
    flops_uncounted: ClassVar[str] = ""
    """What `flops()` includes that the counter does not see ("the bias added to every
    score"), for the suite's message; empty when it claims matrix products only."""

    def __init__(self, d_model: int = 512, num_heads: int = 8, **options: Any) -> None:
        super().__init__()
        for label, value in (("d_model", d_model), ("num_heads", num_heads)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{label} must be a positive integer; got {value!r}")
        if d_model % num_heads:
            raise ConfigError(
                f"d_model ({d_model}) must be divisible by num_heads ({num_heads}) so every "
                f"head gets d_model / num_heads features; try num_heads in "
                f"{[h for h in range(1, min(d_model, 64) + 1) if d_model % h == 0][-6:]}"
            )
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.config = build_config(self.Config, options, self.name)

    # --- the two paths a variant writes -------------------------------------------
    def forward_reference(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        is_causal: bool,
        need_weights: bool,
    ) -> AttentionOutput:
        # No **extra here: a variant that declares `forward_kwargs` takes them as named
        # keyword parameters of its own, which an override may add.
        raise NotImplementedError(f"{type(self).__name__} must define forward_reference")

    forward_fast: ClassVar[Any] = None
    fast_path_weights: ClassVar[bool] = False
    """True when `forward_fast` itself returns the weights for `need_weights=True`;
    otherwise such a call runs `forward_reference` (the weights are a dense
    (B, H, Nq, Nk) tensor anyway, and the reference forms them as the paper does)."""
    """Optional fused/blocked path with forward_reference's signature; without it,
    `impl="fast"` runs the reference."""

    # --- the one forward everybody calls --------------------------------------------
    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        *,
        attention_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
        **extra: Any,
    ) -> AttentionOutput:
        """query (B, Nq, d_model); key/value (B, Nk, d_model), defaulting to query (value
        defaults to key); attention_mask (B, Nk) bool, True = real token."""
        is_cross = key is not None and key is not query
        key = query if key is None else key
        value = key if value is None else value
        self._check_inputs(query, key, value, attention_mask, extra)
        self._check_flags(is_causal=is_causal, need_weights=need_weights)
        self._check_capabilities(query, key, attention_mask, is_causal, need_weights, is_cross)
        self._check_module_matches(query, attention_mask)
        if min(query.shape[0], query.shape[1], key.shape[1]) == 0:
            return self._empty_output(query, key.shape[1], need_weights)
        if attention_mask is not None:
            query, key, value = _clear_non_finite_padding(query, key, value, attention_mask)
        path = self.forward_fast if self.config.impl == "fast" and self.forward_fast else None
        if path is None or (need_weights and not self.fast_path_weights):
            return self.forward_reference(
                query, key, value, attention_mask, is_causal, need_weights, **extra
            )
        return path(query, key, value, attention_mask, is_causal, need_weights, **extra)

    # --- decoding: a prompt, then one token at a time (playground.decoding) ---------------
    def prefill(
        self,
        prompt: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        max_length: int | None = None,
        **extra: Any,
    ) -> tuple[torch.Tensor, DecodingState]:
        """Start decoding: prompt (B, P, d_model), padded on the left or the right
        (attention_mask (B, P) bool, True = real token). Returns the prompt's outputs
        (B, P, d_model), the causal forward's at every real token and zero at padding, and
        the state for `decode_step`. `max_length`: the most tokens the state will hold, the
        prompt's padded length included (a cache is then allocated once); None grows."""
        self._check_decoding(prompt, attention_mask)
        self._check_inputs(prompt, prompt, prompt, attention_mask, extra)
        self._check_module_matches(prompt, attention_mask)
        length = prompt.shape[1]
        limit = self.capabilities.max_seq_len
        if max_length is not None:
            if isinstance(max_length, bool) or not isinstance(max_length, int):
                raise InvalidInput(f"max_length must be an integer or None; got {max_length!r}")
            if max_length < max(length, 1):
                raise InvalidInput(
                    f"max_length ({max_length}) must be at least the prompt's length ({length}) "
                    f"and 1; it counts the prompt and every token to decode after it"
                )
        if limit is not None and max(length, max_length or 0) > limit:
            raise UnsupportedFeature(
                self.name,
                f"decoding more than {limit} tokens (asked for {max(length, max_length or 0)})",
                self.capabilities.max_seq_len_hint,
            )
        shift = left_aligned(attention_mask)  # right padding moves to the left
        if shift is not None and attention_mask is not None:  # a shift comes from a mask
            prompt = shifted(prompt, shift)
            attention_mask = shifted(attention_mask, shift)
            extra = {k: _shifted_like(v, shift, prompt) for k, v in extra.items()}
        if attention_mask is not None:
            prompt = _clear_non_finite_padding(prompt, prompt, prompt, attention_mask)[0]
        output, state = self.prefill_state(prompt, attention_mask, max_length, **extra)
        if not isinstance(state, DecodingState):
            raise _hook_error(
                self,
                "prefill_state()",
                f"returned {type(state).__name__} as its state; it must return (output, a "
                f"playground.decoding.DecodingState)",
            )
        self._check_decoded(output, prompt.shape, "prefill_state()")
        state.bind(self, prompt, max_length, length)
        # Padding, all on the left, sees no key under causal masking: its outputs are zero.
        return (output if shift is None else shifted(output, shift, -1)), state

    def decode_step(
        self, token: torch.Tensor, state: DecodingState
    ) -> tuple[torch.Tensor, DecodingState]:
        """The next token (B, 1, d_model) of every sequence: its output (B, 1, d_model),
        the causal forward's at its position, and the state, updated in place."""
        if not isinstance(state, DecodingState) or not state.owned_by(self):
            raise InvalidInput(
                f"this decoding state was not started by this {self.name!r} module "
                f"(got {type(state).__name__}); start one with `module.prefill(prompt)`, and "
                f"give each layer its own"
            )
        self._check_inputs(token, token, token, None, {})
        if token.shape[:2] != (state.batch, 1):
            raise InvalidInput(
                f"decode_step takes one token per sequence, (batch={state.batch}, 1, "
                f"d_model={self.d_model}); got {tuple(token.shape)}"
            )
        if token.dtype != state.dtype or token.device != state.device:
            raise InvalidInput(
                f"the token is {token.dtype} on {token.device} but the state was started "
                f"with {state.dtype} on {state.device}; convert the token, or start again"
            )
        self._check_module_matches(token, None)
        if state.max_length is not None and state.length >= state.max_length:
            raise InvalidInput(
                f"the state is full: it was started with max_length={state.max_length} and "
                f"holds {state.length} tokens; start it with a larger max_length"
            )
        limit = self.capabilities.max_seq_len
        if limit is not None and state.length >= limit:
            raise UnsupportedFeature(
                self.name,
                f"decoding past {limit} tokens",
                self.capabilities.max_seq_len_hint,
            )
        output = self.step_state(token, state)
        self._check_decoded(output, token.shape, "step_state()")
        state.length += 1
        return output, state

    def _check_decoding(self, prompt: torch.Tensor, attention_mask: torch.Tensor | None) -> None:
        caps = self.capabilities
        if not caps.decoding:
            raise UnsupportedFeature(self.name, "decoding one token at a time", caps.decoding_hint)
        if not caps.causal:
            raise UnsupportedFeature(
                self.name,
                "decoding one token at a time",
                "only a causal variant decodes (a later token must not change earlier outputs)",
            )
        if attention_mask is not None and not caps.padding_mask:
            raise UnsupportedFeature(
                self.name,
                "padded prompts (attention_mask) in decoding",
                "decode prompts of one length, or each on its own",
            )
        if isinstance(prompt, torch.Tensor) and prompt.dtype not in caps.dtypes:
            raise UnsupportedFeature(
                self.name,
                f"dtype {prompt.dtype}",
                f"declared dtypes: {', '.join(str(d) for d in caps.dtypes)}",
            )

    def _check_decoded(self, output: object, shape: torch.Size, hook: str) -> None:
        if not isinstance(output, torch.Tensor) or output.shape != shape:
            got = tuple(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
            raise _hook_error(
                self, hook, f"returned an output of {got}; it must be {tuple(shape)}, one per input"
            )

    def prefill_state(
        self,
        prompt: torch.Tensor,
        attention_mask: torch.Tensor | None,
        max_length: int | None,
        **extra: Any,
    ) -> tuple[torch.Tensor, DecodingState]:
        """The prompt's causal outputs (B, P, d_model) and a state holding what later tokens
        need. `prompt` is left-padded (the core moved any right padding) and its padding
        holds finite values. Override it with `step_state`, keeping the variant's own cache
        or recurrent state (playground.decoding's TokenCache and friends).

        The default keeps every input and re-runs the causal forward over all of them at
        each step: exact for every causal variant, O(n) work and memory per token."""
        if extra:
            raise UnsupportedFeature(
                self.name,
                f"decoding with forward arguments ({', '.join(sorted(extra))})",
                "the default decoding keeps only the inputs; the variant would need its own "
                "prefill_state and step_state",
            )
        state = RecomputeState(max_length)
        state.append(prompt, real_tokens(prompt, attention_mask))
        output = self(prompt, attention_mask=attention_mask, is_causal=True).output
        return output, state

    def step_state(self, token: torch.Tensor, state: Any) -> torch.Tensor:
        """Take the next token (B, 1, d_model) at position `state.length`: update `state`
        in place and return the token's output (B, 1, d_model). The default re-runs the
        causal forward over every input so far (see `prefill_state`)."""
        if not isinstance(state, RecomputeState):
            raise _hook_error(
                self,
                "step_state()",
                f"got a {type(state).__name__}, made by an overridden prefill_state; a variant "
                f"that overrides one of prefill_state and step_state must override both",
            )
        state.append(token, real_tokens(token, None))
        inputs, real = state.sequence()
        return self(inputs, attention_mask=real, is_causal=True).output[:, -1:]

    # --- attention on heads projected elsewhere (playground.hf's kernel-level bridge) -----
    def attend_heads(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        allowed: torch.Tensor | None,
        *,
        scale: float,
        q_idx: torch.Tensor,
        kv_idx: torch.Tensor,
        dropout: float = 0.0,
    ) -> torch.Tensor:
        """The variant's attention on queries, keys and values that another model projected
        (and maybe rotated): q (B, H, Nq, d), k and v (B, G, Nk, d) with G dividing H (query
        head h reads key/value head h // (H / G)); `allowed` (B or 1, 1, Nq, Nk) bool, True
        where a query may see a key (None: every key); `scale` the model's; q_idx (Nq,) and
        kv_idx (Nk,) int64 the positions of the queries and keys; `dropout` on the weights.
        Returns each head's output (B, H, Nq, d), zero for a query that sees no key.

        The default refuses: a variant whose attention is more than a function of given q,
        k and v (its own projections, feature maps or gates) cannot work at this level.
        Override it where it fits, with the variant's own mods."""
        raise UnsupportedFeature(
            self.name,
            "attention on heads projected elsewhere (transformers' AttentionInterface)",
            "its attention is not a function of given queries, keys and values alone (it "
            "owns its projections); swap the whole attention module instead: "
            f"playground.hf.swap_attention(model, {self.name!r})",
        )

    def _check_inputs(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        extra: dict[str, Any],
    ) -> None:
        for label, tensor in (("query", query), ("key", key), ("value", value)):
            if not isinstance(tensor, torch.Tensor):
                raise InvalidInput(f"{label} must be a torch.Tensor; got {type(tensor).__name__}")
            if tensor.dim() != 3 or tensor.shape[-1] != self.d_model:
                raise InvalidInput(
                    f"{label} must have shape (batch, seq_len, d_model={self.d_model}), "
                    f"batch first; got {tuple(tensor.shape)}"
                    + (" (add a batch dimension with .unsqueeze(0))" if tensor.dim() == 2 else "")
                )
            if not tensor.is_floating_point():
                raise InvalidInput(f"{label} must be a floating tensor; got {tensor.dtype}")
        if not (query.shape[0] == key.shape[0] == value.shape[0]):
            raise InvalidInput(
                f"query, key and value must have the same batch size; got "
                f"{query.shape[0]}, {key.shape[0]}, {value.shape[0]}"
            )
        if key.shape[1] != value.shape[1]:
            raise InvalidInput(
                f"key and value must have the same sequence length (one value per key); "
                f"got {key.shape[1]} and {value.shape[1]}"
            )
        if not (query.dtype == key.dtype == value.dtype):
            raise InvalidInput(
                f"query, key and value must share a dtype; got {query.dtype}, {key.dtype}, "
                f"{value.dtype}"
            )
        if attention_mask is not None:
            expected = (key.shape[0], key.shape[1])
            if (
                not isinstance(attention_mask, torch.Tensor)
                or tuple(attention_mask.shape) != expected
                or attention_mask.dtype != torch.bool
            ):
                got = (
                    f"{tuple(attention_mask.shape)} {attention_mask.dtype}"
                    if isinstance(attention_mask, torch.Tensor)
                    else type(attention_mask).__name__
                )
                raise InvalidInput(
                    f"attention_mask must be a bool tensor of shape (batch, key_len) = "
                    f"{expected}, True for real tokens and False for padding; got {got}. "
                    f"A 0/1 mask (HF style, 1 = keep) converts with `mask.bool()`."
                )
        unknown = sorted(set(extra) - set(self.forward_kwargs))
        if unknown:
            takes = ", ".join(self.forward_kwargs) or "none"
            raise UnsupportedFeature(
                self.name,
                f"forward argument {', '.join(repr(u) for u in unknown)}",
                f"its extra forward arguments are: {takes}",
            )

    @staticmethod
    def _check_flags(**flags: object) -> None:
        for label, flag in flags.items():
            if not isinstance(flag, bool):
                raise InvalidInput(
                    f"{label} must be True or False; got {flag!r} ({type(flag).__name__}). "
                    f"A string such as 'False' is truthy, so it is refused rather than guessed."
                )

    def _check_module_matches(
        self, query: torch.Tensor, attention_mask: torch.Tensor | None
    ) -> None:
        """The inputs live on the module's device and in its dtype (a raw matmul error
        otherwise names neither side)."""
        # Lazily: the first floating tensor ends the walk (a decoding step pays for it).
        tensors = itertools.chain(self.parameters(), self.buffers())
        state = next((t for t in tensors if t.is_floating_point()), None)
        if state is not None and state.dtype != query.dtype:
            raise InvalidInput(
                f"the input is {query.dtype} but the parameters of {self.name!r} are "
                f"{state.dtype}; "
                f"convert one to the other: `module.to({query.dtype})` or "
                f"`query.to({state.dtype})`"
            )
        for label, tensor in (("input", query), ("attention_mask", attention_mask)):
            if state is not None and tensor is not None and tensor.device != state.device:
                raise InvalidInput(
                    f"the {label} is on {tensor.device} but the parameters of {self.name!r} are "
                    f"on {state.device}; move one to the other: `module.to('{tensor.device}')` "
                    f"or `{label}.to('{state.device}')`"
                )

    def _empty_output(self, query: torch.Tensor, n_k: int, need_weights: bool) -> AttentionOutput:
        """No batch, no query or no key: nothing to attend, so zeros of the contract's
        shapes, the same for every path (a query with no key outputs zero)."""
        # masked_fill keeps the result in query's graph (with a zero gradient), NaN-safe.
        output = query.masked_fill(torch.ones((), dtype=torch.bool, device=query.device), 0.0)
        weights = None
        if need_weights:
            batch, n_q = query.shape[:2]
            weights = query.new_zeros(batch, self.num_heads, n_q, n_k)
        return AttentionOutput(output, weights)

    def _check_capabilities(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        attention_mask: torch.Tensor | None,
        is_causal: bool,
        need_weights: bool,
        is_cross: bool,
    ) -> None:
        caps = self.capabilities
        if is_causal and not caps.causal:
            raise UnsupportedFeature(self.name, "causal attention (is_causal=True)")
        if attention_mask is not None and not caps.padding_mask:
            raise UnsupportedFeature(self.name, "padding masks (attention_mask)")
        if is_cross and not caps.cross_attention:
            raise UnsupportedFeature(
                self.name,
                "cross-attention (key/value other than query)",
                "call it with the query alone for self-attention",
            )
        if need_weights and not caps.need_weights:
            raise UnsupportedFeature(self.name, "returning attention weights (need_weights)")
        if caps.max_seq_len is not None and key.shape[1] > caps.max_seq_len:
            raise UnsupportedFeature(
                self.name,
                f"sequences longer than {caps.max_seq_len} (got {key.shape[1]})",
                caps.max_seq_len_hint,
            )
        if query.dtype not in caps.dtypes:
            raise UnsupportedFeature(
                self.name,
                f"dtype {query.dtype}",
                f"declared dtypes: {', '.join(str(d) for d in caps.dtypes)}",
            )

    # --- extension points: what the core does differently for some variants ------------
    @classmethod
    def fit_options(cls, options: dict[str, Any], seq_len: int) -> dict[str, Any]:
        """The options to build this variant with for sequences of up to `seq_len`
        tokens, when the user left a length-sized option unset (a projection sized for
        the sequence, say). Called by the model builder; the default changes nothing."""
        return dict(options)

    def share_with_first_layer(self, first: AttentionVariant) -> tuple[str, ...]:
        """Tie this layer's state to the first layer of a stack, as the variant's paper
        does across layers (one bias table, one projection); returns the names of what
        is now shared, for the record. The default shares nothing."""
        return ()

    def global_token_arguments(self, is_global: torch.Tensor) -> dict[str, Any]:
        """Extra forward arguments that give the tokens marked in `is_global` (B, N) bool
        global attention (a [CLS] token a sequence is classified from). The default: none,
        for a variant without global tokens."""
        return {}

    @classmethod
    def picture_options(cls, options: dict[str, Any], seq_len: int) -> dict[str, Any]:
        """The options to draw this variant's attention pattern with on a picture of
        `seq_len` tokens, so that what is special about it shows (a window narrower than
        the picture, say). The default is `fit_options`."""
        return cls.fit_options(options, seq_len)

    def pattern_weights(self, query: torch.Tensor) -> tuple[torch.Tensor, str] | None:
        """For a variant that cannot return exact weights (`need_weights`): what the
        patterns figure draws instead, as (B, H, Nq, M) weights of self-attention on
        `query` and what their M columns are ("projected slot"). The default: nothing."""
        return None

    def logit_bias(self, n_q: int, n_k: int) -> torch.Tensor | None:
        """The (1, H, n_q, n_k) bias this instance adds to its attention scores by
        position alone (a relative position bias), for the bias figure; None when it
        adds none (the default)."""
        return None

    def learned_summary(self) -> dict[str, float | list[float]]:
        """This instance's learned scalars after training, named as its paper names them
        (a λ, a slope per head, a prior's widths), for the report: {name: a number, or a
        list of numbers (one per head, say)}. The default: none."""
        return {}

    def reference_parameters(self) -> dict[str, str]:
        """Parameters of this variant that start from a parameter of exact attention of
        another name, {own name: exact attention's name}, so that fidelity compares like
        with like (a second set of projections initialised from the first, say).
        Parameters named as in exact attention are copied without being listed here."""
        return {}

    def special_sizes(self) -> tuple[int, ...]:
        """Sequence lengths at which this instance's behaviour changes (a window, a block,
        a bucket boundary): the contract suite tests lengths on both sides of each.

        The default is every positive integer option; override it to add sizes the
        options imply (half a window, say) or that are fixed in code."""
        return tuple(
            value
            for value in dataclasses.asdict(self.config).values()
            if isinstance(value, int) and not isinstance(value, bool) and value > 0
        )

    def count_flops(self, n_q: int, n_k: int) -> float:
        """`flops()` of this instance's shape and options."""
        return type(self).flops(
            n_q, n_k, self.d_model, self.num_heads, **dataclasses.asdict(self.config)
        )

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}, config={self.config}"


def _shifted_like(value: Any, shift: torch.Tensor, prompt: torch.Tensor) -> Any:
    """A forward argument laid out by token, (B, P, ...), moved with its prompt."""
    if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[:2] == prompt.shape[:2]:
        return shifted(value, shift)
    return value


def _clear_non_finite_padding(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Padded tokens are don't-care, but a NaN or inf there would reach real outputs
    through 0 · NaN in the weighted sum, so such values become 0 before any path runs.
    Finite padded values pass through unchanged (the suite checks they never matter)."""
    padding = ~attention_mask[..., None]  # (B, Nk, 1)

    def cleared(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.masked_fill(padding & ~torch.isfinite(tensor), 0.0)

    cleared_key = cleared(key)
    cleared_value = cleared_key if value is key else cleared(value)
    # In self-attention the query is the key sequence and carries its padding too.
    cleared_query = cleared_key if query is key else query
    return cleared_query, cleared_key, cleared_value


def flops_exponent(
    variant: type[AttentionVariant], d_model: int = 512, num_heads: int = 8
) -> float:
    """Growth of the variant's FLOPs with n at long lengths (log2 of flops(2n)/flops(n) at
    n = 65536), derived from its own `flops()` with default options: ≈2 for dense
    attention, ≈1 for linear-cost variants."""
    n = 65536
    options = dataclasses.asdict(variant.Config())
    small = variant.flops(n, n, d_model, num_heads, **options)
    large = variant.flops(2 * n, 2 * n, d_model, num_heads, **options)
    return math.log2(large / small)


# --- calling a variant's hooks: a raise or a junk value names the plugin and the hook -----
MAX_SPECIAL_SIZES = 256
"""At most this many sizes are read from `special_sizes()`: the suite tests lengths on both
sides of each, so more would never finish, and an endless iterator must not hang it."""


def hook_source(variant: type[AttentionVariant] | AttentionVariant) -> str:
    """The file that defines a variant's class (its plugin), or its module's name."""
    cls = variant if isinstance(variant, type) else type(variant)
    module = sys.modules.get(cls.__module__)
    return str(getattr(module, "__file__", None) or cls.__module__)


def _hook_error(
    variant: type[AttentionVariant] | AttentionVariant, hook: str, problem: str
) -> HookError:
    cls = variant if isinstance(variant, type) else type(variant)
    name = getattr(cls, "name", cls.__name__)
    return HookError(name, hook_source(cls), hook, problem)


def call_hook(
    variant: type[AttentionVariant] | AttentionVariant, hook: str, *arguments: Any
) -> Any:
    """`variant.hook(*arguments)`, with an exception turned into a HookError naming the
    variant, its file and the hook (a raw traceback from deep inside a figure or a
    model builder names none of them)."""
    try:
        return getattr(variant, hook)(*arguments)
    except HookError:
        raise
    except Exception as error:
        raise _hook_error(
            variant, f"{hook}()", f"raised {type(error).__name__}: {error}"
        ) from error


def checked_special_sizes(module: AttentionVariant) -> tuple[int, ...]:
    """`module.special_sizes()`, refused unless it is a finite collection of positive
    integers: a float such as 32.0 would otherwise be dropped and never tested, and an
    endless iterator would hang the suite (at most MAX_SPECIAL_SIZES items are read)."""
    value = call_hook(module, "special_sizes")
    expected = "it must return a tuple of positive integers (sequence lengths), like (32, 4)"
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise _hook_error(module, "special_sizes()", f"returned {value!r}; {expected}")
    try:
        items = list(itertools.islice(iter(value), MAX_SPECIAL_SIZES + 1))
    except Exception as error:
        raise _hook_error(
            module, "special_sizes()", f"raised {type(error).__name__}: {error} while iterated"
        ) from error
    if len(items) > MAX_SPECIAL_SIZES:
        raise _hook_error(
            module,
            "special_sizes()",
            f"returned more than {MAX_SPECIAL_SIZES} sizes (an endless iterator?); {expected}",
        )
    for item in items:
        if isinstance(item, bool) or not isinstance(item, numbers.Integral) or item < 1:
            hint = f" (write {int(item)})" if isinstance(item, float) and item.is_integer() else ""
            raise _hook_error(
                module,
                "special_sizes()",
                f"returned {item!r} ({type(item).__name__}) among its sizes{hint}; {expected}",
            )
    return tuple(int(item) for item in items)


def checked_options_hook(
    variant: type[AttentionVariant], hook: str, options: dict[str, Any], seq_len: int
) -> dict[str, Any]:
    """`variant.fit_options(options, seq_len)` (or `picture_options`), refused unless it
    returns a mapping of option names."""
    value = call_hook(variant, hook, dict(options), seq_len)
    if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
        raise _hook_error(
            variant,
            f"{hook}()",
            f"returned {value!r}; it must return the options as a dict (option name -> value), "
            f"the given ones included (`return dict(options)` changes nothing)",
        )
    return dict(value)


def checked_share_with_first_layer(
    layer: AttentionVariant, first: AttentionVariant
) -> tuple[str, ...]:
    """`layer.share_with_first_layer(first)`, refused unless it returns names of the
    layer's own attributes (a string alone would be recorded as its characters)."""
    value = call_hook(layer, "share_with_first_layer", first)
    expected = (
        "it must return a tuple of the names of what is now shared (attributes of the layer), "
        "like ('bias_table',), or () for nothing"
    )
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise _hook_error(layer, "share_with_first_layer()", f"returned {value!r}; {expected}")
    names = tuple(value)
    for name in names:  # names for the record: what is shared, not necessarily attributes
        if not isinstance(name, str) or not name.strip() or "\n" in name:
            raise _hook_error(
                layer,
                "share_with_first_layer()",
                f"returned {name!r}, which is not a one-line name; {expected}",
            )
    return names


def checked_logit_bias(module: AttentionVariant, n_q: int, n_k: int) -> torch.Tensor | None:
    """`module.logit_bias(n_q, n_k)`, refused unless None or a (1, H, n_q, n_k) tensor."""
    value = call_hook(module, "logit_bias", n_q, n_k)
    expected = (1, module.num_heads, n_q, n_k)
    if value is not None and (
        not isinstance(value, torch.Tensor) or tuple(value.shape) != expected
    ):
        got = tuple(value.shape) if isinstance(value, torch.Tensor) else repr(value)
        raise _hook_error(
            module,
            "logit_bias()",
            f"returned {got} for n_q={n_q}, n_k={n_k}; it must return a tensor of shape "
            f"(1, num_heads, n_q, n_k) = {expected}, or None",
        )
    return value


def checked_pattern_weights(
    module: AttentionVariant, query: torch.Tensor
) -> tuple[torch.Tensor, str] | None:
    """`module.pattern_weights(query)`, refused unless None or ((B, H, Nq, M), label)."""
    value = call_hook(module, "pattern_weights", query)
    if value is None:
        return None
    batch, n_q = query.shape[:2]
    good = (
        isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], torch.Tensor)
        and value[0].dim() == 4
        and tuple(value[0].shape[:3]) == (batch, module.num_heads, n_q)
        and isinstance(value[1], str)
    )
    if not good:
        shape = (
            tuple(value[0].shape)
            if isinstance(value, tuple) and value and isinstance(value[0], torch.Tensor)
            else None
        )
        raise _hook_error(
            module,
            "pattern_weights()",
            f"returned {type(value).__name__}{f' with weights {shape}' if shape else ''}; it must "
            f"return None or (weights of shape (B, H, Nq, M) = ({batch}, {module.num_heads}, "
            f"{n_q}, M), a label of the M columns)",
        )
    return value


def checked_learned_summary(module: AttentionVariant) -> dict[str, float | list[float]]:
    """`module.learned_summary()`, refused unless {one-line name: a finite number or a
    list of finite numbers} (a 0-d or 1-d tensor is read as one)."""
    summary = call_hook(module, "learned_summary")
    expected = (
        "it must return a dict of one-line names to a finite number or a list of finite "
        "numbers, like {'slope': [0.5, 0.25]} (flatten a matrix)"
    )
    if not isinstance(summary, Mapping):
        raise _hook_error(module, "learned_summary()", f"returned {summary!r}; {expected}")
    checked = {}
    for name, value in summary.items():
        read = _learned_numbers(value)
        if not isinstance(name, str) or not name.strip() or "\n" in name or read is None:
            raise _hook_error(
                module, "learned_summary()", f"returned {name!r}: {value!r}; {expected}"
            )
        checked[name] = read
    return checked


def _learned_numbers(value: Any) -> float | list[float] | None:
    """A finite number, or a list of them, read from a number, a sequence or a tensor;
    None for anything else (a nested list, NaN, a string)."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().tolist()  # 0-d: a number; 1-d: a list
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, list | tuple):
        items = [_learned_numbers(item) for item in value]
        numbers_only = [item for item in items if isinstance(item, float)]
        return numbers_only if len(numbers_only) == len(items) else None
    return None


def learned_summaries(model: nn.Module) -> dict[str, dict[str, float | list[float]]]:
    """{"layer 1": learned_summary(), ...}: every attention layer of `model` in order,
    those that learned nothing left out."""
    layers = [module for module in model.modules() if isinstance(module, AttentionVariant)]
    found = {f"layer {i}": checked_learned_summary(layer) for i, layer in enumerate(layers, 1)}
    return {layer: summary for layer, summary in found.items() if summary}
