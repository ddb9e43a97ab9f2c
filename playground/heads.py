"""Shared plumbing of multi-head attention: projections, splitting and merging heads,
the output projection with queries that see nothing set to zero, the FLOPs of both, and
the key/value cache a variant with these projections decodes with.

Every variant that has the contract's standard projections (`q_proj`, `k_proj`, `v_proj`,
`out_proj`, each an `nn.Linear(d_model, d_model)`) uses these instead of its own copy, so
a plugin file holds only its paper's math.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from playground.contract import AttentionVariant
from playground.decoding import TokenCache, refuse_forward_arguments


def add_projections(module: nn.Module, d_model: int, bias: bool = True) -> None:
    """Give `module` the contract's q_proj, k_proj, v_proj and out_proj (W^Q, W^K, W^V,
    W^O for all heads at once, Vaswani et al. 2017 §3.2.2)."""
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        setattr(module, name, nn.Linear(d_model, d_model, bias=bias))


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, N, H·d) -> (B, H, N, d), a view. Plain torch rather than einops: a decoding
    step splits a few one-token tensors, where einops' per-call overhead shows."""
    # Typed here: torch leaves Tensor.unflatten unannotated.
    heads: torch.Tensor = x.unflatten(-1, (num_heads, -1))  # (B, N, H, d)
    return heads.transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, N, d) -> (B, N, H·d)."""
    return x.transpose(1, 2).flatten(2)


def project_heads(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (B, H, Nq, d), k (B, H, Nk, d), v (B, H, Nk, d) through the module's projections."""
    # torch types a module's attributes as `Tensor | Module`; these are add_projections'
    # layers and the contract's num_heads.
    h = cast(int, module.num_heads)
    return (
        split_heads(cast(nn.Module, module.q_proj)(query), h),
        split_heads(cast(nn.Module, module.k_proj)(key), h),
        split_heads(cast(nn.Module, module.v_proj)(value), h),
    )


def project_output(
    module: nn.Module, context: torch.Tensor, empty: torch.Tensor | None
) -> torch.Tensor:
    """context (B, H, Nq, d), or heads already merged (B, Nq, d_model) -> output
    (B, Nq, d_model) through out_proj.

    `empty` (B or 1, Nq, 1) bool marks queries that see no key: they output exactly zero,
    not out_proj's bias. Their context is zeroed before the projection too, so whatever a
    kernel left there (NaN) stays out of the weight gradients.
    """
    merged = merge_heads(context) if context.dim() == 4 else context  # (B, Nq, d_model)
    out_proj = cast(nn.Module, module.out_proj)  # typed `Tensor | Module` by torch
    if empty is not None:
        merged = merged.masked_fill(empty, 0.0)
    output: torch.Tensor = out_proj(merged)  # (B, Nq, d_model)
    return output if empty is None else output.masked_fill(empty, 0.0)


def prefill_key_value_cache(
    module: AttentionVariant,
    prompt: torch.Tensor,
    attention_mask: torch.Tensor | None,
    max_length: int | None,
    **extra: Any,
) -> tuple[torch.Tensor, TokenCache]:
    """`prefill_state` for a variant whose decoding state is the keys and values of its
    standard projections (`project_heads`): the prompt's causal outputs, and a key/value
    cache of it. A plugin assigns it: `prefill_state = prefill_key_value_cache`."""
    refuse_forward_arguments(module.name, extra)  # the cache holds keys and values only
    output = module(prompt, attention_mask=attention_mask, is_causal=True).output
    _, k, v = project_heads(module, prompt, prompt, prompt)  # (B, H, P, d)
    return output, TokenCache.of_prompt(prompt, attention_mask, max_length, keys=k, values=v)


def projection_flops(n_q: int, n_k: int, d_model: int) -> float:
    """FLOPs of the q, k, v and out projections (a multiply-add counts 2)."""
    return float(2 * (n_q + 2 * n_k + n_q) * d_model * d_model)


def attention_flops(pairs: float, d_model: int) -> float:
    """FLOPs of Q Kᵀ and P V over `pairs` (query, key) pairs, all heads together."""
    return float(2 * 2 * pairs * d_model)
