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


def test_a_dense_mask_is_recomputed_and_a_window_is_kept():
    """Training keeps every block's mask only when all of them together are no larger
    than q, k and v: a window's are, a dense causal mask_mod's are not (its memory would
    be quadratic)."""
    from playground.measure import peak_memory_bytes
    from playground.runner import workload

    class DenseCausal(playground.SoftmaxAttention):
        name, summary, paper = "dense_causal", "causal by mask_mod", "test"

        def mask_mod(self, b, h, q_idx, kv_idx):
            return q_idx >= kv_idx

    def peak(n: int) -> int:
        module = DenseCausal(d_model=64, num_heads=8, block_size=64)
        return peak_memory_bytes(workload(module, torch.randn(1, n, 64), "forward_backward"))

    assert peak(2048) < 2.3 * peak(1024)  # linear (1.9); keeping every mask gave 2.8
    window = playground.build("sliding_window", 64, 8, window=64, block_size=64)
    spans = window._key_spans(1, 8, 1024, 1024, False, torch.device("cpu"))
    kept = window._mask_bytes(spans, 1, 8, None, torch.device("cpu"))
    assert kept <= 3 * 1024 * 64 * 4  # no larger than q, k and v: kept, not recomputed
