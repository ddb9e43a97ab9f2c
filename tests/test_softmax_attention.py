"""`SoftmaxAttention`'s blocked CPU path with a learned additive `score_mod`: the bias
needs a gradient, so each block runs on the core's `biased_attention` (a fused backward)
instead of SDPA's unfused kernel; the suite's gradient and masking checks hold."""

from __future__ import annotations

import torch

import playground
from playground.testing import check_attention
from playground.testing.checks import (
    check_bfloat16,
    check_causality,
    check_fast_matches_reference,
    check_float64,
    check_fully_masked_rows_are_zero,
    check_gradients_reach_every_parameter,
    check_padding_invariance,
)


class KeyTableAttention(playground.SoftmaxAttention):
    """A learned bias per head and key position (mod 8): additive, not relative."""

    name, summary, paper = "key_table", "a learned bias per head and key slot", "-"
    additive_score_mod = True

    def __init__(self, d_model=512, num_heads=8, **options):
        super().__init__(d_model, num_heads, **options)
        self.table = torch.nn.Parameter(torch.randn(num_heads, 8))

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return score + self.table[h, kv_idx % 8]


class WindowedKeyTableAttention(KeyTableAttention):
    """The same bias inside a window: blocks see partial spans."""

    name = "windowed_key_table"

    def mask_mod(self, b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() < 5


CHECKS = [
    check_fast_matches_reference,
    check_causality,
    check_padding_invariance,
    check_fully_masked_rows_are_zero,
    check_gradients_reach_every_parameter,
    check_float64,
    check_bfloat16,
]


def test_a_learned_additive_bias_passes_the_gradient_and_masking_checks():
    report = check_attention(KeyTableAttention, checks=CHECKS)
    assert report.ok, report.failures


def test_a_learned_bias_inside_a_window_matches_the_reference():
    checks = [check_fast_matches_reference, check_float64]
    report = check_attention(WindowedKeyTableAttention, checks=checks)
    assert report.ok, report.failures


def test_the_fast_path_uses_the_fused_backward(monkeypatch):
    """Not SDPA's unfused kernel: the bias's gradient comes from `biased_attention`."""
    import playground.softmax_attention as module

    calls = []
    original = module.biased_attention
    monkeypatch.setattr(
        module, "biased_attention", lambda *a, **k: calls.append(1) or original(*a, **k)
    )
    attention = KeyTableAttention(d_model=16, num_heads=2, block_size=4).train()
    attention(torch.randn(2, 9, 16)).output.sum().backward()
    assert calls and attention.table.grad is not None
