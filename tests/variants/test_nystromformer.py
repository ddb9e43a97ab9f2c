"""Nyströmformer against HF's `NystromformerSelfAttention` with its weights copied, the
same landmarks and iterations (one sequence: HF scales the pseudo-inverse's start by a
maximum over the whole batch); and its identities."""

from __future__ import annotations

import pytest
import torch

import playground

transformers = pytest.importorskip("transformers")
from transformers.models.nystromformer.modeling_nystromformer import (  # noqa: E402
    NystromformerSelfAttention,
)

D_MODEL, HEADS, N, LANDMARKS = 32, 4, 24, 6


def hf_attention(conv_kernel_size):
    config = transformers.NystromformerConfig(
        hidden_size=D_MODEL,
        num_attention_heads=HEADS,
        num_landmarks=LANDMARKS,
        segment_means_seq_len=N,
        attention_probs_dropout_prob=0.0,
    )
    # HF's config types the width as int; None (no convolution) is set past its check.
    object.__setattr__(config, "conv_kernel_size", conv_kernel_size)
    torch.manual_seed(0)
    return NystromformerSelfAttention(config).eval()


def ours_from(theirs, impl, conv_kernel_size):
    module = playground.build(
        "nystromformer",
        D_MODEL,
        HEADS,
        num_landmarks=LANDMARKS,
        conv_kernel_size=conv_kernel_size or 0,
        impl=impl,
    ).eval()
    with torch.no_grad():
        for ours, hf in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value")):
            getattr(module, ours).load_state_dict(getattr(theirs, hf).state_dict())
        module.out_proj.weight.copy_(torch.eye(D_MODEL))  # HF's self-attention has none
        module.out_proj.bias.zero_()
        if conv_kernel_size:
            module.conv.weight.copy_(theirs.conv.weight)
    return module


@pytest.mark.parametrize("impl", ["fast", "reference"])
@pytest.mark.parametrize("conv_kernel_size", [None, 3])
def test_equals_hf_nystromformer(impl, conv_kernel_size):
    theirs = hf_attention(conv_kernel_size)
    ours = ours_from(theirs, impl, conv_kernel_size)
    x = torch.randn(1, N, D_MODEL)
    with torch.no_grad():
        (expected,) = theirs(x)
        output = ours(x).output
    assert (output - expected).abs().max() < 1e-5


def test_fewer_iterations_are_caught():
    """The comparison can fail: 5 iterations of the pseudo-inverse are another answer."""
    theirs = hf_attention(None)
    ours = playground.build(
        "nystromformer", D_MODEL, HEADS, num_landmarks=LANDMARKS, pinv_iterations=5
    ).eval()
    ours.load_state_dict(ours_from(theirs, "fast", None).state_dict())
    x = torch.randn(1, N, D_MODEL)
    with torch.no_grad():
        (expected,) = theirs(x)
        assert (ours(x).output - expected).abs().max() > 1e-4


def test_as_many_landmarks_as_tokens_is_nearly_exact():
    """m = n: F̃ = Ã = B̃ = A and F̃ Ã⁺ B̃ = A once the pseudo-inverse has converged; six
    iterations come close, and fewer landmarks are further away."""
    torch.manual_seed(0)
    vanilla = playground.build("vanilla", D_MODEL, HEADS)
    x = torch.randn(2, N, D_MODEL)

    def error(**options):
        nystrom = playground.build("nystromformer", D_MODEL, HEADS, **options)
        nystrom.load_state_dict(vanilla.state_dict())
        with torch.no_grad():
            return (nystrom(x).output - vanilla(x).output).abs().max().item()

    converged = error(num_landmarks=N, pinv_iterations=20)
    six = error(num_landmarks=N)
    assert converged < 1e-4 and six < 2e-2
    assert error(num_landmarks=N // 4) > 5 * six


def test_segments_need_not_divide_the_length():
    from playground.registry import default_registry

    module = default_registry().get("nystromformer")
    means = __import__(module.__module__, fromlist=["segment_means"]).segment_means
    x = torch.arange(7.0).view(1, 1, 7, 1)
    assert means(x, 3).flatten().tolist() == [1.0, 3.5, 5.5]  # segments of 3, 2, 2


def test_an_even_convolution_is_refused():
    with pytest.raises(playground.ConfigError, match="odd"):
        playground.build("nystromformer", D_MODEL, HEADS, conv_kernel_size=4)


def test_the_contract_holds_with_the_convolution():
    """The skip mixes values by position, so the instance declares no cross-attention."""
    from playground.testing import check_attention

    report = check_attention("nystromformer", options={"conv_kernel_size": 3})
    assert report.ok, report.failures
    assert report.verdict_of("check_cross_attention") == "skipped"
