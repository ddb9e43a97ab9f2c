"""ALiBi against HF Bloom's `build_alibi_tensor`, and its identities."""

from __future__ import annotations

import math

import pytest
import torch

import playground
from playground.heads import project_heads
from playground.testing import check_attention
from playground.testing.checks import (
    check_bfloat16,
    check_causality,
    check_fast_matches_reference,
    check_fully_masked_rows_are_zero,
    check_gradients_reach_every_parameter,
    check_padding_invariance,
)

transformers = pytest.importorskip("transformers")
from transformers.models.bloom.modeling_bloom import build_alibi_tensor  # noqa: E402


@pytest.mark.parametrize("num_heads", [1, 2, 3, 4, 5, 6, 8, 12, 16])
def test_slopes_are_blooms_for_any_head_count(num_heads):
    module = playground.build("alibi", d_model=8 * num_heads, num_heads=num_heads)
    alibi = build_alibi_tensor(torch.ones(1, 3), num_heads, torch.float32)  # (H, 1, 3): m_h·j
    assert torch.allclose(module.slopes, alibi[:, 0, 1], rtol=0, atol=1e-7)


@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_causal_attention_equals_softmax_with_blooms_bias(impl):
    torch.manual_seed(0)
    module = playground.build("alibi", d_model=48, num_heads=6, impl=impl).eval()
    x = torch.randn(2, 11, 48)
    result = module(x, is_causal=True, need_weights=True)
    q, k, _ = project_heads(module, x, x, x)
    # Bloom adds m_h·j; ALiBi's −m_h·(i − j) differs by m_h·i, constant along a row.
    alibi = build_alibi_tensor(torch.ones(2, 11), 6, torch.float32).view(2, 6, 1, 11)
    scores = q @ k.transpose(-2, -1) / math.sqrt(8) + alibi
    scores = scores.masked_fill(torch.ones(11, 11, dtype=torch.bool).triu(1), -math.inf)
    assert (result.weights - scores.softmax(dim=-1)).abs().max() < 1e-6
    plain = module(x, is_causal=True).output
    assert (plain - result.output).abs().max() < 1e-5


def test_zero_slopes_equal_vanilla():
    torch.manual_seed(0)
    alibi = playground.build("alibi", d_model=32, num_heads=4)
    vanilla = playground.build("vanilla", d_model=32, num_heads=4)
    vanilla.load_state_dict({k: v for k, v in alibi.state_dict().items() if k != "slopes"})
    alibi.slopes.zero_()
    x = torch.randn(2, 20, 32)
    for case in ({}, {"is_causal": True}):
        assert (alibi(x, **case).output - vanilla(x, **case).output).abs().max() < 1e-5


def test_learnable_slopes_train_in_the_fast_path_as_in_the_reference():
    torch.manual_seed(0)
    fast = playground.build("alibi", d_model=32, num_heads=4, learnable_slopes=True, block_size=8)
    reference = playground.build(
        "alibi", d_model=32, num_heads=4, learnable_slopes=True, impl="reference"
    )
    reference.load_state_dict(fast.state_dict())
    x = torch.randn(2, 40, 32)
    for module in (fast, reference):
        module(x, is_causal=True).output.square().sum().backward()
    assert isinstance(fast.slopes, torch.nn.Parameter) and fast.slopes.grad.abs().min() > 0
    assert (fast.slopes.grad - reference.slopes.grad).abs().max() < 1e-4


def test_learnable_slopes_pass_the_contract_suite():
    """The suite's gradient and masking checks with the slopes a Parameter: the fused
    bias gradient of the relative fast path (kernels.relative_bias_attention) in every
    corner they visit."""
    checks = [
        check_fast_matches_reference,
        check_causality,
        check_padding_invariance,
        check_fully_masked_rows_are_zero,
        check_gradients_reach_every_parameter,
        check_bfloat16,
    ]
    report = check_attention("alibi", checks=checks, options={"learnable_slopes": True})
    assert report.ok, report.failures
