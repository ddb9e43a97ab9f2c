"""Fidelity against exact attention: shared weights really are shared, the local inputs
really make attention local, and the error behaves as the math says."""

from __future__ import annotations

import pytest

from playground.fidelity import measure_fidelity
from playground.registry import Registry

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
