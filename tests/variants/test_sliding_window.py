"""Sliding-window attention against HF's sliding-window mask functions."""

from __future__ import annotations

import pytest
import torch

import playground

masking_utils = pytest.importorskip("transformers.masking_utils")


def _mask_from(function, n):
    index = torch.arange(n)
    return torch.tensor(
        [[bool(function(0, 0, index[i], index[j])) for j in range(n)] for i in range(n)]
    )


@pytest.mark.parametrize("impl", ["fast", "reference"])
@pytest.mark.parametrize("window", [1, 3, 8])
def test_causal_window_is_hfs(window, impl):
    n = 20
    module = playground.build(
        "sliding_window", d_model=16, num_heads=2, window=window, block_size=4, impl=impl
    )
    expected = _mask_from(masking_utils.sliding_window_causal_mask_function(window), n)
    weights = playground.build(
        "sliding_window", d_model=16, num_heads=2, window=window, impl="reference"
    )(torch.randn(1, n, 16), is_causal=True, need_weights=True).weights
    assert torch.equal(weights[0, 0] > 0, expected)
    assert expected.sum(dim=-1).max() == window  # W keys, HF's convention
    # The fast path sees exactly those keys: changing any other key changes nothing.
    x = torch.randn(1, n, 16)
    before = module(x, is_causal=True).output
    for i in range(n):
        changed = x.clone()
        changed[:, ~expected[i]] += 10.0
        after = module(changed, is_causal=True).output
        assert (after[0, i] - before[0, i]).abs().max() < 1e-5 or not (~expected[i]).any()


def test_bidirectional_window_is_symmetric_and_w_wide():
    n, window = 20, 4
    weights = playground.build(
        "sliding_window", d_model=16, num_heads=2, window=window, impl="reference"
    )(torch.randn(1, n, 16), need_weights=True).weights[0, 0]
    index = torch.arange(n)
    assert torch.equal(weights > 0, (index[:, None] - index[None, :]).abs() < window)


@pytest.mark.parametrize(
    ("n_q", "n_k", "window"), [(16, 16, 4), (100, 100, 7), (30, 10, 4), (5, 40, 9)]
)
def test_flops_count_only_the_keys_each_query_sees(n_q, n_k, window):
    index_q, index_k = torch.arange(n_q)[:, None], torch.arange(n_k)[None, :]
    pairs = int(((index_q - index_k).abs() < window).sum())
    cls = playground.get_variant("sliding_window")
    dense = playground.get_variant("vanilla").flops(n_q, n_k, 32, 4)
    expected = dense - 4 * (n_q * n_k - pairs) * 32
    assert cls.flops(n_q, n_k, 32, 4, window=window) == expected
