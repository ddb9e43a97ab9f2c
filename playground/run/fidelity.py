"""How close a variant comes to exact softmax attention with the same weights.

The exact attention is one `ExactAttention` instance (the core's softmax attention, no
mods); its q/k/v/out projection weights are copied into the variant by parameter name,
and into the parameters the variant maps to them (`AttentionVariant.reference_parameters`:
a second set of projections that starts as a copy of the first, say). Both then run on the same
inputs, self-attention without masks, in eval mode:

- random: i.i.d. N(0, 1) tokens with the vanilla instance's weights as initialised. Random
  weights make exact attention nearly uniform over all keys: nothing for a sparse or
  low-rank variant to exploit.
- local: the regime sliding windows are built for. Tokens are an AR(1) sequence,
  x_t = ρ·x_{t−1} + √(1−ρ²)·ε_t with ρ = 0.9, times 2, so nearby tokens are alike; and the
  key projection is tied to the query projection (W_k = W_q), so a score is a similarity
  and exact attention concentrates on nearby tokens. How local it really is gets measured
  and reported: `fidelity_local_attention_distance`, the mean |i − j| under the exact
  attention's weights (over up to 256 query rows). (With untied random weights, AR(1)
  inputs make attention no more local than random ones.)

Reported: relative Frobenius error ‖y − y*‖/‖y*‖, cosine similarity, max abs error.

The reference sees the same mask as the variant's call: exact attention with
`is_causal=True` for a causal call, bidirectional otherwise. A variant that is causal by
itself (its own mask_mod, say) although the call is not is recognised by what it does:
when changing the later half of the tokens leaves the outputs of the first half exactly
as they were, it sees no later tokens, and it is compared with causal exact attention.
Otherwise its relative error would mostly measure the mask, not the approximation. Every
row says which reference it used (`fidelity_reference`).
"""

from __future__ import annotations

import math

import torch

from playground.contract import AttentionVariant
from playground.run.row_schema import FidelityFields
from playground.softmax_attention import ExactAttention

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj")


LOCAL_SCALE = 2.0
"""Input scale of the local case: at 1 the logits are too flat for any locality (mean
attention distance ≈ n/3 at n = 1024); at 2 it is about 20 tokens; at 3 attention is
nearly the identity."""


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
            f"variant {variant.name!r} has no {', '.join(missing)} (nn.Linear named as in the "
            f"contract, docs/design.md), so its weights cannot be shared with exact attention"
        )
    names = {key: key for key in target} | variant.reference_parameters()
    update = {
        key: source[names[key]]
        for key, value in target.items()
        if names.get(key) in source and source[names[key]].shape == value.shape
    }
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


def tie_keys_to_queries(reference: ExactAttention) -> None:
    """W_k = W_q (and the biases), so scores are similarities between tokens."""
    reference.k_proj.load_state_dict(reference.q_proj.state_dict())


CAUSAL_REFERENCE = "exact attention, causal"
BIDIRECTIONAL_REFERENCE = "exact attention, bidirectional"


def acts_causally(variant: AttentionVariant, tokens: torch.Tensor) -> bool:
    """Whether the variant's outputs at the first half of the positions ignore the later
    half of the tokens (changed to fresh noise): then it is causal by itself. Exact
    equality: any leak, however small, means it sees later tokens."""
    n = tokens.shape[1]
    if n < 2:
        return False
    half = n // 2
    changed = tokens.clone()
    generator = torch.Generator().manual_seed(0)
    noise = torch.randn(changed[:, half:].shape, generator=generator)
    changed[:, half:] = noise.to(tokens.device, tokens.dtype)
    before = variant(tokens).output[:, :half]
    after = variant(changed).output[:, :half]
    return bool(torch.equal(before, after))


def mean_attention_distance(
    reference: ExactAttention, tokens: torch.Tensor, rows: int = 256, is_causal: bool = False
) -> float:
    """Mean |i − j| under exact attention's weights (causal ones when `is_causal`), over
    `rows` evenly spaced queries."""
    n = tokens.shape[1]
    positions = torch.linspace(0, n - 1, min(rows, n), device=tokens.device).long()
    heads = reference.num_heads
    q = reference.q_proj(tokens[:, positions]).unflatten(-1, (heads, -1)).transpose(1, 2)
    k = reference.k_proj(tokens).unflatten(-1, (heads, -1)).transpose(1, 2)
    scores = q @ k.transpose(-2, -1) / math.sqrt(reference.head_dim)
    if is_causal:
        later = torch.arange(n, device=tokens.device)[None, :] > positions[:, None]
        scores = scores.masked_fill(later, float("-inf"))
    weights = scores.softmax(dim=-1)
    distance = (torch.arange(n, device=tokens.device)[None, :] - positions[:, None]).abs()
    return (weights * distance).sum(dim=-1).mean().item()  # (B, H, rows) averaged


@torch.no_grad()
def measure_fidelity(
    variant: AttentionVariant,
    seq_len: int,
    batch_size: int,
    seed: int,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    is_causal: bool = False,
) -> FidelityFields:
    """Fidelity fields for a row: fidelity_{rel_error,cosine,max_abs_error} on random
    inputs, fidelity_local_* on local ones (see the module docstring), and
    `fidelity_reference`: which exact attention they are against. `is_causal` is the
    call's own; a variant causal by itself gets the causal reference too."""
    torch.manual_seed(seed)
    reference = ExactAttention(variant.d_model, variant.num_heads).to(device, dtype).eval()
    variant.eval()
    generator = torch.Generator().manual_seed(seed)
    shape = (batch_size, seq_len, variant.d_model)
    tokens = torch.randn(shape, generator=generator).to(device, dtype)
    copy_reference_weights(reference, variant)
    causal = is_causal or acts_causally(variant, tokens)
    output = variant(tokens, is_causal=is_causal).output
    random = compare(output, reference(tokens, is_causal=causal).output)
    # Local inputs second: they tie the reference's key projection to its queries.
    tie_keys_to_queries(reference)
    tokens = (LOCAL_SCALE * local_tokens(shape, generator)).to(device, dtype)
    copy_reference_weights(reference, variant)
    distance = mean_attention_distance(reference, tokens, is_causal=causal)
    output = variant(tokens, is_causal=is_causal).output
    local = compare(output, reference(tokens, is_causal=causal).output)
    return {
        "fidelity_reference": CAUSAL_REFERENCE if causal else BIDIRECTIONAL_REFERENCE,
        "fidelity_rel_error": random["rel_error"],
        "fidelity_cosine": random["cosine"],
        "fidelity_max_abs_error": random["max_abs_error"],
        "fidelity_local_attention_distance": distance,
        "fidelity_local_rel_error": local["rel_error"],
        "fidelity_local_cosine": local["cosine"],
        "fidelity_local_max_abs_error": local["max_abs_error"],
    }
