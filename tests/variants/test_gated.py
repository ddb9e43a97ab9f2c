"""Gated attention against HF Qwen3-Next's attention (its elementwise output gate), with
its query/key norms and rotary embedding made the identity so that only the gate differs
from exact attention; and its identities."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import playground

transformers = pytest.importorskip("transformers")
qwen3_next = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")

D_MODEL, HEADS = 32, 4
HEAD_DIM = D_MODEL // HEADS


def qwen3_next_attention():
    config = transformers.Qwen3NextConfig(
        hidden_size=D_MODEL,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        head_dim=HEAD_DIM,
        num_hidden_layers=1,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    attention = qwen3_next.Qwen3NextAttention(config, layer_idx=0).eval()
    attention.q_norm, attention.k_norm = nn.Identity(), nn.Identity()  # not part of the gate
    return attention


def ours_from(theirs, impl):
    module = playground.build(
        "gated", D_MODEL, HEADS, gating="elementwise", bias=False, impl=impl
    ).eval()
    # Qwen3-Next's q_proj gives [q_h | gate_h] per head.
    query_and_gate = theirs.q_proj.weight.view(HEADS, 2 * HEAD_DIM, D_MODEL)
    with torch.no_grad():
        module.q_proj.weight.copy_(query_and_gate[:, :HEAD_DIM].reshape(D_MODEL, D_MODEL))
        module.gate_proj.weight.copy_(query_and_gate[:, HEAD_DIM:].reshape(D_MODEL, D_MODEL))
        module.k_proj.weight.copy_(theirs.k_proj.weight)
        module.v_proj.weight.copy_(theirs.v_proj.weight)
        module.out_proj.weight.copy_(theirs.o_proj.weight)
    return module


@pytest.mark.parametrize("impl", ["fast", "reference"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_equals_qwen3_next_gating(impl, is_causal):
    theirs = qwen3_next_attention()
    ours = ours_from(theirs, impl)
    x = torch.randn(2, 11, D_MODEL)
    no_rotation = (torch.ones(2, 11, HEAD_DIM // 4), torch.zeros(2, 11, HEAD_DIM // 4))
    mask = None
    if is_causal:
        mask = torch.full((11, 11), torch.finfo(torch.float32).min).triu(1)[None, None]
    with torch.no_grad():
        expected, _ = theirs(x, position_embeddings=no_rotation, attention_mask=mask)
        output = ours(x, is_causal=is_causal).output
    assert (output - expected).abs().max() < 1e-5


def test_an_ungated_model_is_caught():
    """The comparison can fail: without the gate the output is another one."""
    theirs = qwen3_next_attention()
    ours = ours_from(theirs, "fast")
    with torch.no_grad():
        ours.gate_proj.weight.zero_()
        ours.gate_proj.weight.add_(100.0 * torch.eye(D_MODEL))  # σ(100 x): a gate of ~0/1
    x = torch.randn(1, 7, D_MODEL)
    no_rotation = (torch.ones(1, 7, HEAD_DIM // 4), torch.zeros(1, 7, HEAD_DIM // 4))
    with torch.no_grad():
        expected, _ = theirs(x, position_embeddings=no_rotation, attention_mask=None)
        assert (ours(x).output - expected).abs().max() > 1e-3


@pytest.mark.parametrize("gate", ["headwise", "elementwise"])
def test_an_open_gate_is_vanilla_at_half_the_output(gate):
    """σ(0) = 1/2 everywhere: half of exact attention's pre-projection output."""
    torch.manual_seed(0)
    gated = playground.build("gated", D_MODEL, HEADS, gating=gate, bias=False)
    vanilla = playground.build("vanilla", D_MODEL, HEADS, bias=False)
    vanilla.load_state_dict({k: v for k, v in gated.state_dict().items() if "gate" not in k})
    with torch.no_grad():
        gated.gate_proj.weight.zero_()
        vanilla.out_proj.weight.mul_(0.5)
    x = torch.randn(2, 13, D_MODEL)
    for case in ({}, {"is_causal": True}):
        assert (gated(x, **case).output - vanilla(x, **case).output).abs().max() < 1e-6


def test_headwise_gates_one_number_per_head():
    module = playground.build("gated", D_MODEL, HEADS)
    assert module.gate_proj.weight.shape == (HEADS, D_MODEL)
    with pytest.raises(playground.ConfigError, match="must be one of"):
        playground.build("gated", D_MODEL, HEADS, gating="channel")


def test_the_contract_holds_with_elementwise_gates():
    from playground.testing import check_attention

    report = check_attention("gated", options={"gating": "elementwise"})
    assert report.ok, report.failures
