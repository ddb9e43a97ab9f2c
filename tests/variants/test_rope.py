"""RoPE against HF Llama's `LlamaRotaryEmbedding` and `apply_rotary_pos_emb`, and its
identities: the scores depend on the offset only, and base → ∞ is exact attention."""

from __future__ import annotations

import math

import pytest
import torch

import playground
from playground.heads import project_heads
from playground.masks import masked_softmax

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.models.llama.modeling_llama import (  # noqa: E402
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
)

D_MODEL, HEADS = 64, 4


def llama_attention(module, x, base, is_causal):
    """Llama's rotary embedding on our projections, then exact softmax attention."""
    config = LlamaConfig(
        hidden_size=D_MODEL,
        num_attention_heads=HEADS,
        head_dim=D_MODEL // HEADS,
        max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": base},
    )
    rotary = LlamaRotaryEmbedding(config)
    q, k, v = project_heads(module, x, x, x)
    positions = torch.arange(x.shape[1])[None].expand(x.shape[0], -1)
    cos, sin = rotary(x, positions)
    q, k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(D_MODEL // HEADS)
    n = x.shape[1]
    allowed = torch.ones(n, n, dtype=torch.bool).tril() if is_causal else None
    weights = masked_softmax(scores, allowed)
    return module.out_proj((weights @ v).transpose(1, 2).flatten(2)), weights


@pytest.mark.parametrize("impl", ["fast", "reference"])
@pytest.mark.parametrize("base", [10000.0, 500.0])
@pytest.mark.parametrize("is_causal", [False, True])
def test_equals_llamas_rotary_embedding(impl, base, is_causal):
    torch.manual_seed(0)
    module = playground.build("rope", D_MODEL, HEADS, rope_base=base, impl=impl).eval()
    x = torch.randn(2, 37, D_MODEL)
    expected, weights = llama_attention(module, x, base, is_causal)
    with torch.no_grad():
        result = module(x, is_causal=is_causal, need_weights=True)
        plain = module(x, is_causal=is_causal).output
    assert (result.weights - weights).abs().max() < 1e-6
    assert (result.output - expected).abs().max() < 1e-5
    assert (plain - expected).abs().max() < 1e-5


def test_a_mirrored_rotation_is_caught():
    """The comparison can fail: rotating by −m θ is another embedding."""
    torch.manual_seed(0)
    module = playground.build("rope", D_MODEL, HEADS).eval()
    x = torch.randn(1, 12, D_MODEL)
    expected, _ = llama_attention(module, x, 10000.0, False)
    frequencies = module.frequencies
    module.frequencies = lambda dtype, device: -frequencies(dtype, device)
    with torch.no_grad():
        assert (module(x).output - expected).abs().max() > 1e-3


def test_scores_depend_on_the_offset_only():
    """(R_m q)ᵀ (R_n k) = qᵀ R_(n − m) k (eq. 16): with the same token at every position,
    the rotated scores are constant along every diagonal n − m."""
    torch.manual_seed(0)
    module = playground.build("rope", D_MODEL, HEADS)
    x = torch.randn(1, 1, D_MODEL).expand(1, 30, D_MODEL)
    with torch.no_grad():
        q, k, _ = module._projected(x, x, x)  # (1, H, 30, d), rotated by position_mod
    scores = q @ k.transpose(-2, -1)
    for offset in (-7, 0, 3):
        diagonal = scores[0].diagonal(offset, dim1=-2, dim2=-1)  # (H, ·): n − m = offset
        assert (diagonal - diagonal[:, :1]).abs().max() < 1e-4
    assert (scores[0, :, 0, 1] - scores[0, :, 0, 2]).abs().max() > 1e-3  # offsets differ


def test_infinite_base_is_exact_attention():
    """θ = 0 for every pair when base is huge: no rotation, exact attention."""
    torch.manual_seed(0)
    rope = playground.build("rope", D_MODEL, HEADS, rope_base=1e30)
    vanilla = playground.build("vanilla", D_MODEL, HEADS)
    vanilla.load_state_dict(rope.state_dict())
    frequencies = rope.frequencies
    rope.frequencies = lambda dtype, device: frequencies(dtype, device) * 0  # θ_1 = 1 too
    x = torch.randn(2, 20, D_MODEL)
    for case in ({}, {"is_causal": True}):
        assert (rope(x, **case).output - vanilla(x, **case).output).abs().max() < 1e-5


def test_bfloat16_rotates_by_float32_angles():
    """A module cast to bfloat16 forms its angles from float32 frequencies (as Llama
    does): cos(m θ) off by no more than bfloat16's own rounding, at any position."""
    module = playground.build("rope", D_MODEL, HEADS)
    exact, _ = module.rotary_cos_sin(torch.arange(4096), torch.zeros(1))
    low, _ = module.to(torch.bfloat16).rotary_cos_sin(
        torch.arange(4096), torch.zeros(1, dtype=torch.bfloat16)
    )
    assert (low.float() - exact).abs().max() < 1e-2


def test_odd_head_dimension_is_refused():
    with pytest.raises(playground.ConfigError, match="must be even"):
        playground.build("rope", 12, 4)
    with pytest.raises(playground.ConfigError, match="rope_base must be"):
        playground.build("rope", 16, 4, rope_base=1.0)
    with pytest.raises(playground.ConfigError, match="finite"):
        playground.build("rope", 16, 4, rope_base=float("inf"))
