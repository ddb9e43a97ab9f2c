"""The core's fast kernels against their dense references (playground.kernels.reference):
the same outputs and the same gradients, over shapes that split into several blocks,
partial last blocks, bands wider than the sequence, prefix keys, padding, causality,
overlapping key spans and blocks without keys."""

from __future__ import annotations

import pytest
import torch

from playground.kernels.banded import banded_attention
from playground.kernels.blocked import blocked_attention
from playground.kernels.reference import dense_banded, dense_blocked, dense_relative
from playground.kernels.relative import relative_bias_attention
from playground.masks import queries_without_keys

H = 2

CASES = [
    # (n, before, after, prefix, causal prefix, block)
    (13, 2, 2, 0, False, 4),
    (13, 2, 0, 0, False, 4),
    (40, 7, 7, 2, False, 8),
    (40, 7, 0, 3, True, 8),
    (9, 30, 30, 1, False, 64),  # the band covers the whole sequence
    (70, 5, 3, 0, False, 64),  # asymmetric, several blocks
]


@pytest.mark.parametrize(("n", "before", "after", "prefix", "causal_prefix", "block"), CASES)
def test_banded_attention_matches_the_dense_band(n, before, after, prefix, causal_prefix, block):
    generator = torch.Generator().manual_seed(n + before)
    batch, width = 2, 8

    def tensor(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64, requires_grad=True)

    queries, keys_values = tensor(batch, n, width), tensor(batch, n, 2 * width)
    key_ok = torch.rand(batch, n, generator=generator) > 0.3
    key_ok[1, : before + after + 2] = False  # rows that see nothing, where the band fits
    prefix_kv = tensor(batch, prefix, 2 * width) if prefix else None
    prefix_ok = (torch.rand(batch, prefix, generator=generator) > 0.3) if prefix else None
    if prefix:
        prefix_ok[1] = False
    positions = torch.randint(0, n, (batch, prefix), generator=generator) if causal_prefix else None
    context = banded_attention(
        queries, keys_values, key_ok, H, before, after, prefix_kv, prefix_ok, positions, block
    )
    expected, seen = dense_banded(
        queries, keys_values, key_ok, H, before, after, prefix_kv, prefix_ok, positions
    )
    assert seen.any() and not seen.all()  # both kinds of rows are exercised
    torch.testing.assert_close(context[seen], expected[seen])
    inputs = [t for t in (queries, keys_values, prefix_kv) if t is not None]
    weights = torch.randn(expected.shape, generator=generator, dtype=torch.float64)
    ours = torch.autograd.grad((context * weights)[seen].sum(), inputs)
    theirs = torch.autograd.grad((expected * weights)[seen].sum(), inputs)
    for mine, reference in zip(ours, theirs, strict=True):
        torch.testing.assert_close(mine, reference)


def test_banded_attention_catches_a_wrong_band():
    """The comparison can fail: one key more on each side is another answer."""
    generator = torch.Generator().manual_seed(0)
    queries = torch.randn(1, 20, 8, generator=generator, dtype=torch.float64)
    keys_values = torch.randn(1, 20, 16, generator=generator, dtype=torch.float64)
    key_ok = torch.ones(1, 20, dtype=torch.bool)
    context = banded_attention(queries, keys_values, key_ok, H, 3, 3, block=4)
    wider, _ = dense_banded(queries, keys_values, key_ok, H, 4, 4)
    assert not torch.allclose(context, wider)


@pytest.mark.parametrize("batch", [1, 2])  # the backward skews dS itself, or its batch sum
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize(("n_q", "n_k", "block"), [(11, 11, 4), (7, 13, 3), (16, 5, 16)])
def test_relative_bias_attention_matches_the_dense_toeplitz_bias(
    batch, is_causal, padded, n_q, n_k, block
):
    generator = torch.Generator().manual_seed(n_q * n_k)

    def tensor(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64, requires_grad=True)

    q, k, v = tensor(batch, H, n_q, 4), tensor(batch, H, n_k, 4), tensor(batch, H, n_k, 4)
    relative_bias = tensor(H, n_q + n_k - 1)
    mask = None
    if padded:
        mask = torch.ones(2, n_k, dtype=torch.bool)
        mask[0, n_k // 2 :] = False
        mask[1, :2] = False  # left padding: under causality the first queries see nothing
        mask = mask[:batch]
    context = relative_bias_attention(q, k, v, relative_bias, mask, is_causal, 0.5, block)
    expected = dense_relative(q, k, v, relative_bias, mask, is_causal, 0.5)
    empty = queries_without_keys(mask, n_q, n_k, is_causal)
    seen = torch.ones(batch, n_q, dtype=torch.bool) if empty is None else ~empty[..., 0]
    torch.testing.assert_close(context.transpose(1, 2)[seen], expected.transpose(1, 2)[seen])
    weights = torch.randn(expected.shape, generator=generator, dtype=torch.float64)
    select = seen[:, None, :, None]
    inputs = (q, k, v, relative_bias)
    ours = torch.autograd.grad((context * weights * select).sum(), inputs)
    theirs = torch.autograd.grad((expected.nan_to_num() * weights * select).sum(), inputs)
    for mine, reference in zip(ours, theirs, strict=True):
        torch.testing.assert_close(mine, reference)


@pytest.mark.parametrize("padded", [False, True])
def test_relative_bias_attention_in_inference_matches_the_dense_bias(padded):
    """Without autograd the queries go in one call (no padding) or in blocks (padding)."""
    generator = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, H, 10, 4, generator=generator, dtype=torch.float64) for _ in "qkv")
    relative_bias = torch.randn(H, 19, generator=generator, dtype=torch.float64)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, 7:] = False
    mask = mask if padded else None
    with torch.no_grad():
        context = relative_bias_attention(q, k, v, relative_bias, mask, True, 0.5, 4)
    expected = dense_relative(q, k, v, relative_bias, mask, True, 0.5)
    torch.testing.assert_close(context, expected)


def test_relative_bias_attention_catches_a_mirrored_bias():
    """The comparison can fail: the bias of j − i is not the bias of i − j."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, H, 9, 4, generator=generator, dtype=torch.float64) for _ in "qkv")
    relative_bias = torch.randn(H, 17, generator=generator, dtype=torch.float64)
    context = relative_bias_attention(q, k, v, relative_bias, None, False, 0.5, 4)
    mirrored = dense_relative(q, k, v, relative_bias.flip(-1), None, False, 0.5)
    assert not torch.allclose(context, mirrored)


@pytest.mark.parametrize("is_causal", [False, True])
def test_queries_without_keys_match_the_dense_rule(is_causal):
    mask = torch.tensor([[True, False, True, False], [False, False, True, True], [False] * 4])
    n_q = 5
    allowed = mask[:, None, :].expand(-1, n_q, -1)
    if is_causal:
        allowed = allowed & (torch.arange(4)[None, :] <= torch.arange(n_q)[:, None])
    expected = ~allowed.any(dim=-1)
    assert torch.equal(queries_without_keys(mask, n_q, 4, is_causal)[..., 0], expected)
    assert queries_without_keys(None, n_q, 4, is_causal) is None


def blocked_case(dtype, seed: int = 0, batch: int = 2, n: int = 23, d: int = 4):
    """Inputs of blocked_attention with every kind of block: overlapping spans, a bool
    mask per batch element, an additive float mask per head, no mask, a block without
    keys, and queries in no block."""
    generator = torch.Generator().manual_seed(seed)

    def tensor(*shape):
        return torch.randn(*shape, generator=generator, dtype=dtype, requires_grad=True)

    q, k, v = tensor(batch, H, n, d), tensor(batch, H, n, d), tensor(batch, H, n, d)
    blocks = [(0, 5, 0, 9), (5, 10, 2, 15), (10, 16, 8, 23), (16, 19, 0, 0), (21, 23, 20, 23)]
    bool_mask = torch.rand(batch, 1, 5, 13, generator=generator) > 0.3
    bool_mask[..., 0] = True  # every query sees a key
    bias = torch.randn(1, H, 6, 15, generator=generator, dtype=dtype)
    return (q, k, v), blocks, [None, bool_mask, bias, None, None]


def test_blocked_attention_matches_the_dense_answer():
    """Outputs and the gradients of q, k and v, in float64 (the flash backward per block)."""
    (q, k, v), blocks, masks = blocked_case(torch.float64)
    context = blocked_attention(q, k, v, blocks, masks, 0.4)
    expected = dense_blocked(q, k, v, blocks, masks, 0.4)
    torch.testing.assert_close(context, expected)
    assert not context[:, :, 16:21].any()  # no keys, and no block
    weights = torch.randn(expected.shape, dtype=torch.float64)
    ours = torch.autograd.grad((context * weights).sum(), (q, k, v))
    theirs = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    for mine, reference in zip(ours, theirs, strict=True):
        torch.testing.assert_close(mine, reference)


def test_blocked_attention_catches_a_wrong_span():
    """The comparison can fail: one key more in a block's span is another answer."""
    (q, k, v), blocks, masks = blocked_case(torch.float64)
    context = blocked_attention(q, k, v, blocks, masks, 0.4)
    assert blocks[0] == (0, 5, 0, 9) and masks[0] is None
    wider = [(0, 5, 0, 10), *blocks[1:]]
    assert not torch.allclose(context, dense_blocked(q, k, v, wider, masks, 0.4))


def test_blocked_attention_refuses_a_mask_that_needs_a_gradient():
    (q, k, v), blocks, masks = blocked_case(torch.float64)
    masks[2] = masks[2].clone().requires_grad_(True)
    with pytest.raises(ValueError, match="biased_attention"):
        blocked_attention(q, k, v, blocks, masks, 0.4)
