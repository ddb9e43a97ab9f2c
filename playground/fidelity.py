"""How close a variant comes to exact softmax attention with the same weights.

The exact attention is one `vanilla` instance; its q/k/v/out projection weights are copied
into the variant by parameter name (and into `*_global_proj` parameters from the matching
local ones, which is how Longformer initialises them, §3.1). Both then run on the same
inputs, self-attention without masks, in eval mode:

- random inputs: i.i.d. N(0, 1) tokens, no structure to exploit;
- local inputs: an AR(1) sequence, x_t = ρ·x_{t−1} + √(1−ρ²)·ε_t with ρ = 0.9, so nearby
  tokens are alike and exact attention concentrates near the diagonal (the regime
  sliding windows are built for).

Reported: relative Frobenius error ‖y − y*‖/‖y*‖, cosine similarity, max abs error.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from playground.contract import AttentionVariant
from playground.registry import Registry

REFERENCE = "vanilla"
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")


def local_tokens(
    shape: tuple[int, int, int], generator: torch.Generator, rho: float = 0.9
) -> torch.Tensor:
    """(B, N, D) AR(1) tokens with unit variance and correlation ρ^|i−j|."""
    noise = torch.randn(shape, generator=generator)
    tokens = torch.empty(shape)
    tokens[:, 0] = noise[:, 0]
    scale = math.sqrt(1 - rho**2)
    for t in range(1, shape[1]):
        tokens[:, t] = rho * tokens[:, t - 1] + scale * noise[:, t]
    return tokens


def copy_reference_weights(reference: AttentionVariant, variant: AttentionVariant) -> None:
    """Load the reference's projections into the variant; raises ValueError if the
    variant does not have all four standard projections (nothing comparable)."""
    source = reference.state_dict()
    target = variant.state_dict()
    missing = [p for p in PROJECTIONS if f"{p}.weight" not in target]
    if missing:
        raise ValueError(
            f"variant {variant.name!r} has no {', '.join(missing)} (nn.Linear named as in "
            f"DESIGN.md), so its weights cannot be shared with exact attention"
        )
    update = {}
    for key, value in target.items():
        local_key = key.replace("_global_proj.", "_proj.")
        if local_key in source and source[local_key].shape == value.shape:
            update[key] = source[local_key]
    variant.load_state_dict(update, strict=False)


def compare(output: torch.Tensor, exact: torch.Tensor) -> dict[str, float]:
    output, exact = output.double(), exact.double()
    difference = output - exact
    return {
        "rel_error": (difference.norm() / exact.norm()).item(),
        "cosine": torch.nn.functional.cosine_similarity(
            output.flatten(), exact.flatten(), dim=0
        ).item(),
        "max_abs_error": difference.abs().max().item(),
    }


@torch.no_grad()
def measure_fidelity(
    variant: AttentionVariant,
    registry: Registry,
    seq_len: int,
    batch_size: int,
    seed: int,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> dict[str, Any]:
    """Fidelity fields for a row: fidelity_{rel_error,cosine,max_abs_error} on random
    inputs and fidelity_local_* on local ones."""
    torch.manual_seed(seed)
    reference = (
        registry.build(REFERENCE, variant.d_model, variant.num_heads).to(device, dtype).eval()
    )
    copy_reference_weights(reference, variant)
    variant.eval()
    generator = torch.Generator().manual_seed(seed)
    shape = (batch_size, seq_len, variant.d_model)
    fields: dict[str, Any] = {}
    for prefix, tokens in (
        ("fidelity", torch.randn(shape, generator=generator)),
        ("fidelity_local", local_tokens(shape, generator)),
    ):
        tokens = tokens.to(device, dtype)
        for name, value in compare(variant(tokens).output, reference(tokens).output).items():
            fields[f"{prefix}_{name}"] = value
    return fields
