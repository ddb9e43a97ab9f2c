"""The kernel-level bridge: a variant's attention as a transformers attention function.

`register(name, **options)` registers `playground:NAME` with transformers'
`AttentionInterface` (the function every model that dispatches through
`ALL_ATTENTION_FUNCTIONS` calls with its projected, and in Llama rotated, queries, keys and
values) and with `AttentionMaskInterface`, so that the model builds a full boolean mask for
it. Without the mask function recent transformers leaves the mask None for an unknown
implementation, and causality is lost silently (transformers issue #46132).

The function calls the variant's `attend_heads` with the model's q, k and v, its mask (in
any of the forms `masks.allowed_pairs` reads), its scaling and dropout, and the positions
of the keys in the model's cache (0 … Nk − 1; the queries the last Nq of a growing
cache, or, in one allocated ahead, up to the latest slot the last query sees), which is
what relative mods and rotations read. The model's projections are used; the variant's own
are dropped, so it adds no parameter: a variant that learns anything beyond its
projections (ALiBi with learned slopes, a gate) has nowhere to keep it at this level and
is refused, as is one whose attention is not a function of q, k and v alone (its own
projections or feature maps): both are pointed to `swap_attention`.
"""

from __future__ import annotations

from typing import Any

import torch

from playground.contract import AttentionVariant
from playground.errors import UnsupportedFeature
from playground.hf.library import require
from playground.hf.masks import allowed_pairs
from playground.registry import default_registry

PREFIX = "playground:"
"""What an implementation name registered here starts with: `playground:alibi`."""
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")
"""The contract's projections, which the model's own replace at kernel level."""


def learned_beyond_projections(module: AttentionVariant) -> list[str]:
    """The names of `module`'s trainable parameters outside its four projections."""
    return [
        name
        for name, parameter in module.named_parameters()
        if parameter.requires_grad and name.split(".")[0] not in PROJECTIONS
    ]


def check_kernel_level(cls: type[AttentionVariant], options: dict[str, Any]) -> None:
    """Raise UnsupportedFeature, with what to do, when `cls` with `options` cannot work
    at kernel level: built small and asked to attend, it refuses, or it learns parameters
    of its own."""
    probe = cls(32, 2, **options)
    q = torch.zeros(1, 2, 2, 16)
    positions = torch.arange(2)
    probe.attend_heads(q, q, q, None, scale=0.25, q_idx=positions, kv_idx=positions)
    learned = learned_beyond_projections(probe)
    if learned:
        raise UnsupportedFeature(
            cls.name,
            "the kernel-level transformers bridge",
            f"it learns {', '.join(learned)} besides its projections, which a transformers "
            "attention function has nowhere to keep; swap the whole attention module "
            f"instead: playground.hf.swap_attention(model, {cls.name!r})",
        )


class BridgedAttention:
    """A transformers attention function (module, query, key, value, attention_mask,
    dropout, scaling, is_causal, **kwargs) -> (output (B, Nq, H, d), None) over a variant's
    `attend_heads`. One variant instance per head count, width and device serves every
    layer: it holds no trained parameter."""

    def __init__(self, cls: type[AttentionVariant], options: dict[str, Any]) -> None:
        self.cls = cls
        self.options = options
        self.instances: dict[tuple[int, int, torch.device], AttentionVariant] = {}

    def variant_for(self, heads: int, width: int, device: torch.device) -> AttentionVariant:
        key = (heads, width, device)
        if key not in self.instances:
            variant = self.cls(heads * width, heads, **self.options)
            for name in PROJECTIONS:  # the model's are used: drop the variant's
                if isinstance(getattr(variant, name, None), torch.nn.Module):
                    setattr(variant, name, None)
            self.instances[key] = variant.to(device)
        return self.instances[key]

    def __call__(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        dropout: float = 0.0,
        scaling: float | None = None,
        is_causal: bool | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        heads, n_q, width = query.shape[1:]
        n_k = key.shape[2]
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        allowed = allowed_pairs(attention_mask, n_q, n_k, bool(causal), query.device)
        kv_idx = torch.arange(n_k, device=query.device)
        first = query_slot(allowed, n_q, n_k) if causal else n_k - n_q
        context = self.variant_for(heads, width, query.device).attend_heads(
            query,
            key,
            value,
            allowed,
            scale=width**-0.5 if scaling is None else scaling,
            q_idx=kv_idx[first : first + n_q],
            kv_idx=kv_idx,
            dropout=dropout if module.training else 0.0,
        )  # (B, H, Nq, d)
        return context.transpose(1, 2).contiguous(), None


def query_slot(allowed: torch.Tensor | None, n_q: int, n_k: int) -> int:
    """The cache slot of the first of Nq causal queries over Nk key slots: the last Nq of
    them in a cache that grows (DynamicCache), or, in one allocated ahead (StaticCache,
    its unwritten slots masked), read from the mask. Query i, at slot first + i, sees no
    key after its own slot, and its own when it is a real token: so first is the largest
    (latest key seen by query i) − i over every query and sequence, reached by any real
    query (padding on the right included, where the last query is padding). A call with
    no real query anywhere has no output that counts: the last Nq slots then."""
    if allowed is None or n_q >= n_k:
        return n_k - n_q
    slots = torch.arange(n_k, device=allowed.device)
    latest = torch.where(allowed, slots, -1).amax(dim=-1)  # (B, H, Nq): -1 where none seen
    queries = torch.arange(n_q, device=allowed.device)
    first = torch.where(latest >= 0, latest - queries, -1).amax()
    return int(first) if int(first) >= 0 else n_k - n_q


def mask_without_shortcuts(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """transformers' `sdpa_mask`, told never to return None for a plain causal or
    bidirectional mask: the bridged function gets every pattern as a boolean mask."""
    from transformers.masking_utils import sdpa_mask

    kwargs.update(allow_is_causal_skip=False, allow_is_bidirectional_skip=False)
    return sdpa_mask(*args, **kwargs)


def variant_class(variant: str | type[AttentionVariant]) -> type[AttentionVariant]:
    """A registered variant's class by name, or the class given (a user's own, or one from
    another registry)."""
    if isinstance(variant, type) and issubclass(variant, AttentionVariant):
        return variant
    return default_registry().get(str(variant))


def register(name: str | type[AttentionVariant], **options: Any) -> str:
    """Register variant `name` (or a variant class), built with `options`, as the transformers attention
    implementation `playground:NAME` (an attention function and its mask function), and
    return that name: `AutoModel...from_config(config, attn_implementation=...)` or
    `model.set_attn_implementation(...)` then uses it. Registering a name again replaces
    the function, with the new options, for every model that uses it."""
    transformers = require()
    cls = variant_class(name)
    check_kernel_level(cls, options)
    implementation = PREFIX + cls.name
    transformers.AttentionInterface.register(implementation, BridgedAttention(cls, options))
    transformers.masking_utils.AttentionMaskInterface.register(
        implementation, mask_without_shortcuts
    )
    return implementation
