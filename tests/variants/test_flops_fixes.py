"""flops() of the plugins whose formula the FLOPs check (playground/testing/flops.py)
showed wrong, held to FlopCounterMode exactly: the products each claims are the products
its counted path runs, and only the elementwise work it declares is on top."""

from __future__ import annotations

import torch

import playground
from playground.testing.flops import counted_flops


def _claimed_and_counted(name, n_q, n_k, d_model=32, num_heads=4, **options):
    cls = playground.get_variant(name)
    module = cls(d_model, num_heads, impl=cls.flops_counted_path, **options)
    module = module.to(torch.float64).eval()
    claimed = module.count_flops(n_q, n_k)
    return claimed, counted_flops(module, n_q, n_k, n_q != n_k, torch.float64)


def test_differential_claims_one_p_v_as_eq_1_and_the_paper_code_compute():
    """(A₁ − λA₂) V is one P V (the fast path's A₁V and A₂V are an implementation's two);
    before the fix flops() claimed 1.5 times Q Kᵀ and P V: 1.34 times the count at n=130."""
    n, d, h = 130, 32, 4
    claimed, counted = _claimed_and_counted("differential", n, n, d, h)
    assert claimed - counted == 2 * n * n * h + 6 * n * d  # A₁ − λA₂; RMSNorm and scale


def test_nystromformer_claims_q_k_landmarks_without_a_value_product():
    """Ã = softmax(Q̃ K̃ᵀ) is multiplied by no V: flops() claimed 2·m²·d_model more. With
    the convolution skip, counted by torch's convolution formula."""
    for options in ({}, {"conv_kernel_size": 3}):
        claimed, counted = _claimed_and_counted(
            "nystromformer", 130, 130, num_landmarks=4, **options
        )
        assert claimed == counted
    claimed, counted = _claimed_and_counted("nystromformer", 9, 130, num_landmarks=4)
    assert claimed == counted


def test_linformer_claims_all_k_slots_with_fewer_keys_than_slots():
    """With n_k < k, E[:, :n_k] makes k slots and the softmax reads all k scores; flops()
    counted only n_k of them (0.85 of the count at n=2, k=8)."""
    for n in (2, 5, 16):
        claimed, counted = _claimed_and_counted("linformer", n, n, seq_len=16, k=8)
        assert claimed == counted
