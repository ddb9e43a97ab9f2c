"""Sigmoid attention against the paper's equation written out (σ(QKᵀ/√d + b)V with
b = −log n, masked weights 0), as apple/ml-sigmoid-attention's pure-torch simulator
computes it (its kernels are CUDA-only, not on PyPI); and its identities."""

from __future__ import annotations

import math

import pytest
import torch

import playground
from playground.decoding import TokenCache
from playground.heads import project_heads
from tests.variants.decoding import decoded_in_place

D_MODEL, HEADS = 32, 4


def equation(module, x, mask, is_causal, n_train):
    q, k, v = project_heads(module, x, x, x)
    weights = torch.sigmoid(
        q @ k.transpose(-2, -1) / math.sqrt(D_MODEL // HEADS) - math.log(n_train)
    )
    n = x.shape[1]
    allowed = mask[:, None, None, :].expand(-1, 1, n, -1)
    if is_causal:
        allowed = allowed & torch.ones(n, n, dtype=torch.bool).tril()
    weights = weights * allowed
    return module.out_proj((weights @ v).transpose(1, 2).flatten(2)), weights


@pytest.mark.parametrize("impl", ["fast", "reference"])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("block_size", [4, 256])
def test_equals_the_equation(impl, is_causal, block_size):
    torch.manual_seed(0)
    module = playground.build(
        "sigmoid", D_MODEL, HEADS, bias_length=512, block_size=block_size, impl=impl
    ).double()
    x = torch.randn(2, 15, D_MODEL, dtype=torch.float64)
    mask = torch.ones(2, 15, dtype=torch.bool)
    mask[1, 11:] = False
    expected, weights = equation(module, x, mask, is_causal, 512)
    with torch.no_grad():
        result = module(x, attention_mask=mask, is_causal=is_causal, need_weights=True)
        plain = module(x, attention_mask=mask, is_causal=is_causal).output
    assert (result.weights - weights).abs().max() < 1e-12
    real = mask  # padded queries output 0 by the contract; the equation gives them a value
    assert (result.output[real] - expected[real]).abs().max() < 1e-12
    assert (plain[real] - expected[real]).abs().max() < 1e-12


def test_the_bias_is_a_constant_of_the_layer():
    """b = −log n for the training length n, not the call's: a causal query must not see
    how many tokens follow it (the contract's causality check relies on it too)."""
    torch.manual_seed(0)
    module = playground.build("sigmoid", D_MODEL, HEADS, bias_length=64)
    x = torch.randn(1, 20, D_MODEL)
    with torch.no_grad():
        short = module(x[:, :10], is_causal=True).output
        long = module(x, is_causal=True).output[:, :10]
    assert (short - long).abs().max() < 1e-6


def test_a_softmax_is_caught():
    """The comparison can fail: normalising the rows gives another attention."""
    torch.manual_seed(0)
    module = playground.build("sigmoid", D_MODEL, HEADS).double()
    x = torch.randn(1, 9, D_MODEL, dtype=torch.float64)
    _, weights = equation(module, x, torch.ones(1, 9, dtype=torch.bool), False, 1024)
    normalised = weights / weights.sum(-1, keepdim=True)
    with torch.no_grad():
        assert (module(x, need_weights=True).weights - normalised).abs().max() > 1e-3


def test_a_model_takes_its_bias_from_the_tasks_length():
    cls = playground.get_variant("sigmoid")
    assert cls.fit_options({}, 32) == {"bias_length": 32}
    assert cls.fit_options({"bias_length": 7}, 32) == {"bias_length": 7}


# --- decoding: a key/value cache ----------------------------------------------------------
def test_the_decoding_state_is_a_key_value_cache():
    """A float32 key and value per token and head (2·B·H·L·d·4) and a real-token flag
    (B·L), allocated once for max_length = L."""
    torch.manual_seed(0)
    module = playground.build("sigmoid", D_MODEL, HEADS, bias_length=9, block_size=5).eval()
    state = decoded_in_place(module, batch=2, length=12)
    assert isinstance(state, TokenCache)
    assert state.nbytes == 2 * 2 * HEADS * 12 * (D_MODEL // HEADS) * 4 + 2 * 12
