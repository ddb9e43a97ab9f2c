"""Fidelity against exact attention: shared weights really are shared, the local inputs
really make attention local, and the error behaves as the math says."""

from __future__ import annotations

import pytest

from playground.registry import Registry
from playground.run.fidelity import BIDIRECTIONAL_REFERENCE, CAUSAL_REFERENCE, measure_fidelity
from playground.softmax_attention import ExactAttention

D_MODEL, HEADS, N = 64, 4, 128


@pytest.fixture(scope="module")
def registry():
    return Registry.discover(entry_points=False)


def fidelity(registry, name, **options):
    variant = registry.build(name, D_MODEL, HEADS, **options)
    return measure_fidelity(variant, N, batch_size=2, seed=0)


def test_vanilla_against_itself_is_exact(registry):
    fields = fidelity(registry, "vanilla")
    assert fields["fidelity_rel_error"] == 0 and fields["fidelity_local_rel_error"] == 0
    assert fields["fidelity_cosine"] == pytest.approx(1)


def test_a_window_covering_the_sequence_is_exact_attention(registry):
    # Global projections are copied from the local ones, so even the global row matches.
    fields = fidelity(registry, "longformer", attention_window=2 * N, global_tokens=(0,))
    assert fields["fidelity_rel_error"] < 1e-5 and fields["fidelity_local_rel_error"] < 1e-5


def test_local_inputs_make_exact_attention_local(registry):
    fields = fidelity(registry, "vanilla")
    # uniform attention would average N/3 ≈ 43 positions away (random inputs: about that)
    assert fields["fidelity_local_attention_distance"] < N / 6


def test_a_wider_window_is_closer_on_local_inputs(registry):
    errors = [
        fidelity(registry, "longformer", attention_window=w)["fidelity_local_rel_error"]
        for w in (4, 16, 64)
    ]
    assert errors[0] > errors[1] > errors[2] > 0


def test_linformer_with_small_k_is_far_from_exact(registry):
    fields = fidelity(registry, "linformer", seq_len=N, k=8)
    assert fields["fidelity_rel_error"] > 0.1 and fields["fidelity_cosine"] < 0.99


class CausalByItself(ExactAttention):
    """Exact attention whose own mask_mod hides later keys: causal without is_causal."""

    name = "causal_by_itself"

    def mask_mod(self, b, h, q_idx, kv_idx):
        return q_idx >= kv_idx


def test_a_causal_variant_is_compared_with_causal_exact_attention():
    fields = measure_fidelity(CausalByItself(D_MODEL, HEADS), N, batch_size=2, seed=0)
    assert fields["fidelity_reference"] == CAUSAL_REFERENCE
    # Its mask is exact attention's causal mask: nothing left to measure but rounding.
    assert fields["fidelity_rel_error"] < 1e-5 and fields["fidelity_local_rel_error"] < 1e-5


def test_a_causal_call_gets_the_causal_reference(registry):
    variant = registry.build("vanilla", D_MODEL, HEADS)
    fields = measure_fidelity(variant, N, batch_size=2, seed=0, is_causal=True)
    assert fields["fidelity_reference"] == CAUSAL_REFERENCE and fields["fidelity_rel_error"] == 0


def test_a_bidirectional_variant_keeps_the_bidirectional_reference(registry):
    fields = fidelity(registry, "longformer", attention_window=16)
    assert fields["fidelity_reference"] == BIDIRECTIONAL_REFERENCE
    assert fields["fidelity_rel_error"] > 0
