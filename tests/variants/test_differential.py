"""Differential attention against the paper's equations (eqs. 1–5) written out, as the
public reference (microsoft/unilm multihead_diffattn.py, not on PyPI) computes them; and
its identities."""

from __future__ import annotations

import math

import pytest
import torch

import playground
from playground.decoding import TokenCache
from tests.variants.decoding import decoded_in_place

D_MODEL, HEADS = 32, 2
HALF = D_MODEL // HEADS // 2


def equations(module, x, is_causal):
    """eqs. 1–5 for self-attention: two maps per head, λ, RMSNorm over 2d, (1 − λ_init)."""
    batch, n, _ = x.shape
    q = module.q_proj(x).view(batch, n, HEADS, 2, HALF)
    k = module.k_proj(x).view(batch, n, HEADS, 2, HALF)
    v = module.v_proj(x).view(batch, n, HEADS, 2 * HALF).transpose(1, 2)
    hidden = torch.triu(torch.full((n, n), -math.inf), 1) if is_causal else torch.zeros(n, n)
    maps = []
    for half in (0, 1):
        scores = torch.einsum("bihd,bjhd->bhij", q[..., half, :], k[..., half, :]) / math.sqrt(HALF)
        maps.append((scores + hidden).softmax(dim=-1))
    lam = (
        torch.exp((module.lambda_q1 * module.lambda_k1).sum())
        - torch.exp((module.lambda_q2 * module.lambda_k2).sum())
        + (0.8 - 0.6 * math.exp(-0.3 * module.config.layer_depth))
    )
    heads = (maps[0] - lam * maps[1]) @ v  # (B, H, N, 2d)
    rms = heads.pow(2).mean(dim=-1, keepdim=True).add(1e-5).rsqrt()
    heads = heads * rms * module.subln.weight * (1 - module.lambda_init)
    return module.out_proj(heads.transpose(1, 2).flatten(2)), maps[0] - lam * maps[1]


@pytest.mark.parametrize("impl", ["fast", "reference"])
@pytest.mark.parametrize("depth", [0, 3])
@pytest.mark.parametrize("is_causal", [False, True])
def test_equals_the_papers_equations(impl, depth, is_causal):
    torch.manual_seed(0)
    module = playground.build("differential", D_MODEL, HEADS, layer_depth=depth, impl=impl).double()
    with torch.no_grad():
        module.subln.weight.uniform_(0.5, 1.5)  # a learned weight, not its initial ones
    x = torch.randn(2, 13, D_MODEL, dtype=torch.float64)
    expected, weights = equations(module, x, is_causal)
    with torch.no_grad():
        result = module(x, is_causal=is_causal, need_weights=True)
        plain = module(x, is_causal=is_causal).output
    # λ is computed in float32, as in the reference: agreement to float32's precision
    assert (result.weights - weights).abs().max() < 1e-6
    assert (result.output - expected).abs().max() < 1e-6
    assert (plain - expected).abs().max() < 1e-6


def test_lambda_init_follows_depth():
    assert playground.build("differential", D_MODEL, HEADS).lambda_init == pytest.approx(0.2)
    deep = playground.build("differential", D_MODEL, HEADS, layer_depth=3)
    assert deep.lambda_init == pytest.approx(0.8 - 0.6 * math.exp(-0.9))


def test_a_sum_instead_of_a_difference_is_caught():
    """The comparison can fail: A₁ + λA₂ is another attention."""
    torch.manual_seed(0)
    module = playground.build("differential", D_MODEL, HEADS).double()
    x = torch.randn(1, 9, D_MODEL, dtype=torch.float64)
    _, weights = equations(module, x, False)
    with torch.no_grad():
        module.lambda_init = -module.lambda_init  # changes λ's sign term
        assert (module(x, need_weights=True).weights - weights).abs().max() > 1e-3


def test_weights_sum_to_one_minus_lambda_and_go_negative():
    torch.manual_seed(0)
    module = playground.build("differential", D_MODEL, HEADS)
    with torch.no_grad():
        module.lambda_q1.fill_(0.5)
        module.lambda_k1.fill_(0.5)  # λ = e^(d/4) − e^(small) + 0.2: above 1
    weights = module(torch.randn(1, 9, D_MODEL), need_weights=True).weights
    lam = module.differential_lambda().item()
    assert (weights.sum(-1) - (1 - lam)).abs().max() < 1e-4
    assert weights.min() < 0


def test_odd_head_width_is_refused():
    with pytest.raises(playground.ConfigError, match="must be even"):
        playground.build("differential", 12, 4)


# --- decoding: both key halves and the values, cached -------------------------------------
def test_the_decoding_state_is_both_key_halves_and_the_values():
    """K₁, K₂ (d each) and V (2d) per token and head in float32, 2·B·L·d_model·4, and a
    real-token flag (B·L), allocated once for max_length = L."""
    torch.manual_seed(0)
    module = playground.build("differential", D_MODEL, HEADS, layer_depth=2).eval()
    state = decoded_in_place(module, batch=2, length=12)
    assert isinstance(state, TokenCache)
    assert state.nbytes == 2 * 2 * 12 * D_MODEL * 4 + 2 * 12
