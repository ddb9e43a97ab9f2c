"""Vanilla equals torch.nn.MultiheadAttention (weights copied in) within 1e-5 in fp32."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import playground
from playground.decoding import TokenCache
from tests.variants.decoding import decoded_in_place, largest_allocation_of_a_step

D_MODEL, HEADS = 64, 8


def mha_with_weights_of(module: playground.AttentionVariant, bias: bool) -> nn.MultiheadAttention:
    mha = nn.MultiheadAttention(D_MODEL, HEADS, bias=bias, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.copy_(
            torch.cat([module.q_proj.weight, module.k_proj.weight, module.v_proj.weight])
        )
        mha.out_proj.weight.copy_(module.out_proj.weight)
        if bias:
            mha.in_proj_bias.copy_(
                torch.cat([module.q_proj.bias, module.k_proj.bias, module.v_proj.bias])
            )
            mha.out_proj.bias.copy_(module.out_proj.bias)
    return mha.eval()


@pytest.mark.parametrize("impl", ["fast", "reference"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("masks", ["none", "padding", "causal", "padding+causal", "cross+padding"])
def test_equals_torch_multihead_attention(impl, bias, masks):
    torch.manual_seed(0)
    module = playground.build("vanilla", D_MODEL, HEADS, impl=impl, bias=bias).eval()
    mha = mha_with_weights_of(module, bias)
    query = torch.randn(3, 12, D_MODEL)
    memory = torch.randn(3, 20, D_MODEL) if "cross" in masks else query
    n_k = memory.shape[1]
    keep = torch.ones(3, n_k, dtype=torch.bool)
    keep[1, -5:] = False
    keep[2, 2] = False
    padding = keep if "padding" in masks else None
    causal = "causal" in masks

    ours = module(
        query, memory, memory, attention_mask=padding, is_causal=causal, need_weights=True
    )
    theirs, their_weights = mha(
        query,
        memory,
        memory,
        key_padding_mask=None if padding is None else ~padding,  # MHA: True = ignore
        attn_mask=torch.ones(12, n_k, dtype=torch.bool).triu(1) if causal else None,
        need_weights=True,
        average_attn_weights=False,
    )
    assert (ours.output - theirs).abs().max().item() < 1e-5
    assert (ours.weights - their_weights).abs().max().item() < 1e-5
    # without need_weights the fast path takes fused SDPA: same answer
    plain = module(query, memory, memory, attention_mask=padding, is_causal=causal).output
    assert (plain - theirs).abs().max().item() < 1e-5


def test_fully_masked_row_is_zero_where_multihead_attention_gives_nan():
    module = playground.build("vanilla", D_MODEL, HEADS).eval()
    mha = mha_with_weights_of(module, bias=True)
    x = torch.randn(1, 6, D_MODEL)
    nothing = torch.zeros(1, 6, dtype=torch.bool)
    theirs, _ = mha(x, x, x, key_padding_mask=~nothing)
    assert torch.isnan(theirs).all()
    assert module(x, attention_mask=nothing).output.abs().max().item() == 0


def test_dropout_applies_in_training_only():
    module = playground.build("vanilla", D_MODEL, HEADS, dropout=0.5)
    x = torch.randn(2, 10, D_MODEL)
    module.train()
    assert not torch.equal(module(x).output, module(x).output)
    module.eval()
    assert torch.equal(module(x).output, module(x).output)


def test_bias_option_controls_projection_bias():
    assert playground.build("vanilla", bias=False).q_proj.bias is None
    assert playground.build("vanilla").out_proj.bias is not None


def test_defaults_are_the_papers():
    module = playground.build("vanilla")
    assert (module.d_model, module.num_heads, module.head_dim) == (512, 8, 64)
    assert [name for name, _ in module.named_children()] == [
        "q_proj",
        "k_proj",
        "v_proj",
        "out_proj",
    ]


def test_flops_counts_projections_and_both_matmuls():
    cls = playground.get_variant("vanilla")
    n, d = 100, 64
    assert cls.flops(n, n, d, 8) == 2 * 4 * n * d * d + 4 * n * n * d


# --- decoding: a key/value cache ----------------------------------------------------------
def test_the_decoding_state_is_a_key_value_cache():
    """A float32 key and value per token and head (2·B·H·L·d·4) and a real-token flag
    (B·L), allocated once for max_length = L."""
    torch.manual_seed(0)
    module = playground.build("vanilla", D_MODEL, HEADS).eval()
    state = decoded_in_place(module, batch=2, length=12)
    assert isinstance(state, TokenCache)
    assert state.nbytes == 2 * 2 * HEADS * 12 * (D_MODEL // HEADS) * 4 + 2 * 12


def test_a_step_reads_the_cache_in_place():
    """No op of a step copies the keys or values (a cache concatenated with the new token,
    a contiguous copy of a view): each would allocate half the state."""
    torch.manual_seed(0)
    largest, state_bytes = largest_allocation_of_a_step(playground.build("vanilla").eval(), 1024)
    assert largest < state_bytes / 8
