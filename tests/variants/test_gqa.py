"""Grouped-query attention against HF Llama's `repeat_kv` followed by exact attention,
and its identities: G = H is multi-head attention; the cache shrinks by H / G."""

from __future__ import annotations

import math

import pytest
import torch

import playground
from playground.decoding import TokenCache
from playground.heads import split_heads
from playground.masks import allowed_keys, masked_softmax
from tests.variants.decoding import decoded_in_place, largest_allocation_of_a_step

transformers = pytest.importorskip("transformers")
from transformers.models.llama.modeling_llama import repeat_kv  # noqa: E402

D_MODEL, HEADS = 64, 8


def repeated_kv_attention(module, x, mask, is_causal):
    q = split_heads(module.q_proj(x), HEADS)
    k = repeat_kv(split_heads(module.k_proj(x), module.num_kv_heads), HEADS // module.num_kv_heads)
    v = repeat_kv(split_heads(module.v_proj(x), module.num_kv_heads), HEADS // module.num_kv_heads)
    scores = q @ k.transpose(-2, -1) / math.sqrt(D_MODEL // HEADS)
    allowed = allowed_keys(mask, x.shape[1], x.shape[1], is_causal, x.device)
    weights = masked_softmax(scores, allowed)
    return module.out_proj((weights @ v).transpose(1, 2).flatten(2))


@pytest.mark.parametrize("impl", ["fast", "reference"])
@pytest.mark.parametrize("groups", [1, 2, 4])
@pytest.mark.parametrize("is_causal", [False, True])
def test_equals_repeat_kv_then_exact_attention(impl, groups, is_causal):
    torch.manual_seed(0)
    module = playground.build("gqa", D_MODEL, HEADS, num_kv_heads=groups, impl=impl).eval()
    x = torch.randn(2, 19, D_MODEL)
    mask = torch.ones(2, 19, dtype=torch.bool)
    mask[1, 15:] = False
    expected = repeated_kv_attention(module, x, mask, is_causal)
    with torch.no_grad():
        output = module(x, attention_mask=mask, is_causal=is_causal).output
    assert (output[mask] - expected[mask]).abs().max() < 1e-5


def test_a_wrong_grouping_is_caught():
    """The comparison can fail: head h served by group h mod G is another model."""
    torch.manual_seed(0)
    module = playground.build("gqa", D_MODEL, HEADS, num_kv_heads=2).eval()
    x = torch.randn(1, 9, D_MODEL)
    q = split_heads(module.q_proj(x), HEADS)
    k = split_heads(module.k_proj(x), 2).repeat(1, HEADS // 2, 1, 1)  # tiled, not interleaved
    v = split_heads(module.v_proj(x), 2).repeat(1, HEADS // 2, 1, 1)
    tiled = module.out_proj(
        ((q @ k.transpose(-2, -1) / math.sqrt(8)).softmax(-1) @ v).transpose(1, 2).flatten(2)
    )
    with torch.no_grad():
        assert (module(x).output - tiled).abs().max() > 1e-3


def test_as_many_groups_as_heads_is_vanilla():
    torch.manual_seed(0)
    gqa = playground.build("gqa", D_MODEL, HEADS, num_kv_heads=HEADS)
    vanilla = playground.build("vanilla", D_MODEL, HEADS)
    vanilla.load_state_dict(gqa.state_dict())
    x = torch.randn(2, 20, D_MODEL)
    for case in ({}, {"is_causal": True}):
        assert (gqa(x, **case).output - vanilla(x, **case).output).abs().max() < 1e-6


def test_the_cache_shrinks_by_heads_over_groups():
    """The state's own bytes: G key/value heads keep G / H of exact attention's cache."""
    from playground.run.decode_cost import prefilled

    vanilla = prefilled(playground.build("vanilla", 64, 8), 256).nbytes
    for groups in (1, 2, 4, 8):
        cached = prefilled(playground.build("gqa", 64, 8, num_kv_heads=groups), 256).nbytes
        mask = 256  # the cache's (1, 256) bool real-token mask
        assert (cached - mask) * 8 // groups == vanilla - mask


def test_groups_that_do_not_divide_the_heads_are_refused():
    with pytest.raises(playground.ConfigError, match="must divide num_heads"):
        playground.build("gqa", 48, 6, num_kv_heads=4)
    with pytest.raises(playground.ConfigError, match="num_kv_heads"):
        playground.build("gqa", 48, 6, num_kv_heads=0)


def test_the_contract_holds_for_multi_query_attention():
    from playground.testing import check_attention

    report = check_attention("gqa", options={"num_kv_heads": 1})
    assert report.ok, report.failures


# --- decoding: a cache of the G key/value heads -------------------------------------------
def test_the_decoding_state_is_a_cache_of_the_key_value_heads():
    """A float32 key and value per token and key/value head (2·B·G·L·d·4) and a real-token
    flag (B·L), allocated once for max_length = L."""
    torch.manual_seed(0)
    module = playground.build("gqa", D_MODEL, HEADS, num_kv_heads=2).eval()
    state = decoded_in_place(module, batch=2, length=12)
    assert isinstance(state, TokenCache)
    assert state.nbytes == 2 * 2 * 2 * 12 * (D_MODEL // HEADS) * 4 + 2 * 12


@pytest.mark.parametrize("groups", [1, 2])
def test_a_step_reads_the_grouped_heads_in_place(groups):
    """The H queries read the G cached heads as they are: no repeat_interleave (or
    repeat_kv) of the cache, nor any other copy of it, which would allocate at least half
    the state."""
    torch.manual_seed(0)
    module = playground.build("gqa", num_kv_heads=groups).eval()
    largest, state_bytes = largest_allocation_of_a_step(module, 1024)
    assert largest < state_bytes / 8
