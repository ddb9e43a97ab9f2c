"""The attention contract: what every variant is, takes and returns.

A variant subclasses `AttentionVariant`, declares its class attributes (name, summary,
paper, Config, capabilities, flops) and writes `forward_reference` (the paper's math) and,
optionally, `forward_fast`. The base class owns `forward`: it fills in defaults, checks
every input, refuses undeclared features with `UnsupportedFeature`, and then runs the
path chosen by the `impl` option. Variants therefore never re-check their inputs.
The checks themselves live in `playground.validation`; the calls of a variant's optional
hooks, checked, in `playground.hook_calls`; `Capabilities` in `playground.capabilities`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Literal, NamedTuple

import torch
from torch import nn

from playground.capabilities import Capabilities as Capabilities
from playground.config import VariantConfig, build_config
from playground.decoding import DecodingState, RecomputeState, left_aligned, real_tokens, shifted
from playground.errors import UnsupportedFeature
from playground.validation import (
    check_capabilities,
    check_decodable,
    check_decoded,
    check_flags,
    check_max_length,
    check_module_matches,
    check_sizes,
    check_step,
    check_tensors,
    clear_non_finite_padding,
    hook_error,
    shifted_like,
)


class AttentionOutput(NamedTuple):
    """What every variant returns."""

    output: torch.Tensor
    """(B, Nq, d_model)"""
    weights: torch.Tensor | None
    """(B, H, Nq, Nk) attention probabilities when `need_weights=True`, else None."""


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
    """What the variant can do at its default options. An option that changes it goes in
    `capabilities_for`, which is what every reader asks."""
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
        check_sizes(d_model, num_heads)
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.config = build_config(self.Config, options, self.name)

    @classmethod
    def capabilities_for(cls, config: VariantConfig) -> Capabilities:
        """What the variant can do when built with `config`, the one way every reader asks
        (`module.capabilities_for(module.config)`). The default is the declared
        `capabilities`; a variant whose options change one (a length limit an option
        sizes, a feature an option turns off) overrides this."""
        return cls.capabilities

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "capabilities":  # a class that reads the class would see a stale one
            raise hook_error(
                self,
                "capabilities",
                "assigned on an instance; declare them on the class, and compute what an "
                "option changes in `capabilities_for(cls, config)`",
            )
        super().__setattr__(name, value)

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
        self.check_call(query, key, value, attention_mask, extra, is_causal, need_weights, is_cross)
        if min(query.shape[0], query.shape[1], key.shape[1]) == 0:
            return self._empty_output(query, key.shape[1], need_weights)
        if attention_mask is not None:
            query, key, value = clear_non_finite_padding(query, key, value, attention_mask)
        path = self.forward_fast if self.config.impl == "fast" and self.forward_fast else None
        if path is None or (need_weights and not self.fast_path_weights):
            return self.forward_reference(
                query, key, value, attention_mask, is_causal, need_weights, **extra
            )
        output: AttentionOutput = path(
            query, key, value, attention_mask, is_causal, need_weights, **extra
        )
        return output

    def check_call(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        extra: dict[str, Any],
        is_causal: bool = False,
        need_weights: bool = False,
        is_cross: bool = False,
    ) -> None:
        """Every check `forward` makes of a call (`playground.validation`), for a variant's
        own entry point that takes the contract's inputs: the tensors and the mask, the
        flags, the capabilities at this instance's options, the module's dtype and device."""
        check_tensors(
            self.name, self.d_model, self.forward_kwargs, query, key, value, attention_mask, extra
        )
        check_flags(is_causal=is_causal, need_weights=need_weights)
        caps = self.capabilities_for(self.config)
        check_capabilities(
            self.name, caps, query, key, attention_mask, is_causal, need_weights, is_cross
        )
        check_module_matches(self, self.name, query, attention_mask)

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
        caps = self.capabilities_for(self.config)
        check_decodable(self.name, caps, prompt, attention_mask)
        check_tensors(
            self.name,
            self.d_model,
            self.forward_kwargs,
            prompt,
            prompt,
            prompt,
            attention_mask,
            extra,
        )
        check_module_matches(self, self.name, prompt, attention_mask)
        length = prompt.shape[1]
        check_max_length(self.name, caps, length, max_length)
        shift = left_aligned(attention_mask)  # right padding moves to the left
        if shift is not None and attention_mask is not None:  # a shift comes from a mask
            prompt = shifted(prompt, shift)
            attention_mask = shifted(attention_mask, shift)
            extra = {k: shifted_like(v, shift, prompt) for k, v in extra.items()}
        if attention_mask is not None:
            prompt = clear_non_finite_padding(prompt, prompt, prompt, attention_mask)[0]
        output, state = self.prefill_state(prompt, attention_mask, max_length, **extra)
        if not isinstance(state, DecodingState):
            raise hook_error(
                self,
                "prefill_state()",
                f"returned {type(state).__name__} as its state; it must return (output, a "
                f"playground.decoding.DecodingState)",
            )
        check_decoded(self, output, prompt.shape, "prefill_state()")
        state.bind(self, prompt, max_length, length)
        # Padding, all on the left, sees no key under causal masking: its outputs are zero.
        return (output if shift is None else shifted(output, shift, -1)), state

    def decode_step(
        self, token: torch.Tensor, state: DecodingState
    ) -> tuple[torch.Tensor, DecodingState]:
        """The next token (B, 1, d_model) of every sequence: its output (B, 1, d_model),
        the causal forward's at its position, and the state, updated in place."""
        check_tensors(self.name, self.d_model, (), token, token, token, None, {})
        check_step(self, self.name, self.d_model, self.capabilities_for(self.config), token, state)
        check_module_matches(self, self.name, token, None)
        output = self.step_state(token, state)
        check_decoded(self, output, token.shape, "step_state()")
        state.length += 1
        return output, state

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
            raise hook_error(
                self,
                "step_state()",
                f"got a {type(state).__name__}, made by an overridden prefill_state; a variant "
                f"that overrides one of prefill_state and step_state must override both",
            )
        state.append(token, real_tokens(token, None))
        inputs, real = state.sequence()
        recomputed: AttentionOutput = self(inputs, attention_mask=real, is_causal=True)
        return recomputed.output[:, -1:]

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
