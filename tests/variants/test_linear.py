"""Linear attention against the paper's equations written out (eq. 5 and the recurrence
of §3.4, eqs. 10–12), as fast-transformers computes them: the recurrent form equals the
parallel one, and both paths agree with it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import playground
from playground.heads import project_heads
from playground.testing.decoding_checks import decoded

D_MODEL, HEADS = 32, 4
EPS = 1e-6  # fast-transformers' LinearAttention / CausalLinearAttention eps


def recurrent(module, x):
    """eqs. 10–12, one token at a time: s_i = s_{i−1} + φ(k_i) v_iᵀ, z_i = z_{i−1} + φ(k_i),
    y_i = φ(q_i)ᵀ s_i / (φ(q_i)ᵀ z_i + ε)."""
    q, k, v = project_heads(module, x, x, x)
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    s = torch.zeros(x.shape[0], HEADS, q.shape[-1], v.shape[-1], dtype=x.dtype)
    z = torch.zeros(x.shape[0], HEADS, q.shape[-1], dtype=x.dtype)
    outputs = []
    for i in range(x.shape[1]):
        s = s + phi_k[:, :, i, :, None] * v[:, :, i, None, :]
        z = z + phi_k[:, :, i]
        numerator = torch.einsum("bhd,bhde->bhe", phi_q[:, :, i], s)
        denominator = torch.einsum("bhd,bhd->bh", phi_q[:, :, i], z)[..., None] + EPS
        outputs.append(numerator / denominator)
    context = torch.stack(outputs, dim=2)  # (B, H, N, d)
    return module.out_proj(context.transpose(1, 2).flatten(2))


def parallel(module, x, mask=None):
    """eq. 5 without causality: sums over every (real) key."""
    q, k, v = project_heads(module, x, x, x)
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    if mask is not None:
        phi_k = phi_k * mask[:, None, :, None]
    numerator = phi_q @ (phi_k.transpose(-2, -1) @ v)
    denominator = phi_q @ phi_k.sum(dim=2)[..., None] + EPS
    return module.out_proj((numerator / denominator).transpose(1, 2).flatten(2))


@pytest.mark.parametrize("impl", ["fast", "reference"])
@pytest.mark.parametrize("chunk_size", [1, 4, 64])
def test_causal_equals_the_recurrent_form(impl, chunk_size):
    torch.manual_seed(0)
    module = playground.build("linear", D_MODEL, HEADS, impl=impl, chunk_size=chunk_size).double()
    x = torch.randn(2, 23, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        output = module(x, is_causal=True).output
    assert (output - recurrent(module, x)).abs().max() < 1e-10


@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_bidirectional_equals_the_parallel_form_with_padding(impl):
    torch.manual_seed(0)
    module = playground.build("linear", D_MODEL, HEADS, impl=impl).double()
    x = torch.randn(2, 17, D_MODEL, dtype=torch.float64)
    mask = torch.ones(2, 17, dtype=torch.bool)
    mask[0, 12:] = False
    with torch.no_grad():
        output = module(x, attention_mask=mask).output
    assert (output[mask] - parallel(module, x, mask)[mask]).abs().max() < 1e-10


def test_the_recurrence_is_not_the_bidirectional_sum():
    """The comparison can fail: causal and bidirectional outputs differ."""
    torch.manual_seed(0)
    module = playground.build("linear", D_MODEL, HEADS).double()
    x = torch.randn(1, 10, D_MODEL, dtype=torch.float64)
    with torch.no_grad():
        assert (recurrent(module, x) - module(x).output).abs().max() > 1e-3


def test_weights_are_the_normalised_kernel_and_it_caches_a_fixed_state():
    torch.manual_seed(0)
    module = playground.build("linear", D_MODEL, HEADS)
    x = torch.randn(1, 9, D_MODEL)
    weights = module(x, is_causal=True, need_weights=True).weights
    assert weights.min() >= 0 and (weights.sum(-1) - 1).abs().max() < 1e-5
    assert weights.triu(1).abs().max() == 0


# --- decoding: the recurrent state of §3.4 -------------------------------------------------
TOLERANCES = {torch.float64: 1e-10, torch.float32: 1e-5}


@pytest.mark.parametrize("dtype", TOLERANCES, ids=str)
@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_decoding_equals_the_causal_forward(impl, dtype):
    """Every decoded output equals the causal forward's, for prompts of 0, 1, a chunk and
    a half, and past two chunks, and for a batch of left-padded prompts of different
    lengths (padding only in the prompt)."""
    torch.manual_seed(0)
    module = playground.build("linear", D_MODEL, HEADS, impl=impl, chunk_size=4).to(dtype).eval()
    x = torch.randn(3, 19, D_MODEL, dtype=dtype)
    with torch.no_grad():
        expected = module(x, is_causal=True).output
    for prompt in (0, 1, 6, 9, 18):
        got, state = decoded(module, x, prompt)
        assert (got - expected).abs().max() < TOLERANCES[dtype], prompt
    assert type(state).__name__ == "LinearState"
    prompt, lengths = 10, torch.tensor([10, 4, 1])
    mask = torch.arange(19)[None, :] >= (prompt - lengths)[:, None]  # left padding
    with torch.no_grad():
        expected = module(x, attention_mask=mask, is_causal=True).output
    got, _ = decoded(module, x, prompt, mask[:, :prompt])
    assert ((got - expected) * mask[..., None]).abs().max() < TOLERANCES[dtype]
    assert (got[~mask] == 0).all()  # padding outputs zero


def test_the_state_is_kv_and_the_normaliser_whatever_the_length():
    """Exactly S = Σ φ(k) vᵀ (B, H, d, dv) and z = Σ φ(k) (B, H, d): as many bytes after 1k
    tokens as after 4k, and after more decoding steps."""
    torch.manual_seed(0)
    module = playground.build("linear", D_MODEL, HEADS).eval()
    x = torch.randn(2, 4096, D_MODEL)
    with torch.no_grad():
        short = module.prefill(x[:, :1024])[1]
        long = module.prefill(x)[1]
        module.decode_step(x[:, :1], long)
    head_dim = D_MODEL // HEADS
    assert short.kv.shape == (2, HEADS, head_dim, head_dim)
    assert short.normaliser.shape == (2, HEADS, head_dim)
    assert {id(t) for t in short.tensors()} == {id(short.kv), id(short.normaliser)}
    assert short.nbytes == long.nbytes == 4 * (2 * HEADS * head_dim * (head_dim + 1))


def test_padded_prompt_keys_add_nothing_to_the_state():
    """A left-padded prompt gives the state of its real tokens alone, whatever the padding
    holds."""
    torch.manual_seed(0)
    module = playground.build("linear", D_MODEL, HEADS).double().eval()
    x = torch.randn(1, 6, D_MODEL, dtype=torch.float64)
    padded = torch.cat([1e3 * torch.randn(1, 3, D_MODEL, dtype=torch.float64), x], dim=1)
    mask = torch.arange(9)[None, :] >= 3
    with torch.no_grad():
        alone = module.prefill(x)[1]
        with_padding = module.prefill(padded, attention_mask=mask)[1]
    assert (alone.kv - with_padding.kv).abs().max() < 1e-12
    assert (alone.normaliser - with_padding.normaliser).abs().max() < 1e-12
    assert alone.normaliser.min() > 0  # the comparison can fail: the sums are not empty
