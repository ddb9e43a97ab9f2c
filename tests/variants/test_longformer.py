"""Longformer: both paths against the rules written out by hand, and against HF's
`LongformerSelfAttention`."""

from __future__ import annotations

import math
import sys

import pytest
import torch

import playground
from playground import ConfigError, InvalidInput

D_MODEL, HEADS = 32, 4


def build(**options) -> playground.AttentionVariant:
    torch.manual_seed(0)
    module = playground.build("longformer", d_model=D_MODEL, num_heads=HEADS, **options)
    # Different global projections, so a mix-up between local and global ones shows.
    with torch.no_grad():
        for name in ("q_global_proj", "k_global_proj", "v_global_proj"):
            for parameter in getattr(module, name).parameters():
                parameter.normal_(0, 0.3)
    return module.double().eval()


def tokens(batch: int, n: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, n, D_MODEL, generator=torch.Generator().manual_seed(seed)).double()


def rules_by_hand(module, x, real, is_global, causal: bool):
    """The Longformer rules one query at a time: (output (B, N, E), weights (B, H, N, N))."""
    batch, n, _ = x.shape
    window = module.config.attention_window // 2

    def heads(linear):
        return linear(x).view(batch, n, HEADS, -1).transpose(1, 2)  # (B, H, N, d)

    q, k, v = heads(module.q_proj), heads(module.k_proj), heads(module.v_proj)
    q_g, k_g, v_g = (
        heads(module.q_global_proj),
        heads(module.k_global_proj),
        heads(module.v_global_proj),
    )
    context = torch.zeros(batch, HEADS, n, q.shape[-1], dtype=x.dtype)
    weights = torch.zeros(batch, HEADS, n, n, dtype=x.dtype)
    for b in range(batch):
        for i in range(n):
            if not real[b, i]:
                continue  # a padded query attends to nothing
            past_ok = [j for j in range(n) if real[b, j] and (j <= i or not causal)]
            if is_global[b, i]:
                seen, query, keys, values = past_ok, q_g[b, :, i], k_g[b], v_g[b]
            else:
                near = [j for j in past_ok if abs(i - j) <= window]
                seen = sorted(set(near) | {j for j in past_ok if is_global[b, j]})
                query, keys, values = q[b, :, i], k[b], v[b]
            scores = (keys[:, seen] @ query[..., None])[..., 0] / math.sqrt(q.shape[-1])
            probabilities = scores.softmax(dim=-1)  # (H, len(seen))
            weights[b, :, i, seen] = probabilities
            context[b, :, i] = (probabilities[..., None] * values[:, seen]).sum(dim=1)
    output = module.out_proj(context.transpose(1, 2).reshape(batch, n, -1))
    return output * real[..., None], weights


CASES = {
    "padding": dict(padding=True, causal=False, globals=True),
    "causal": dict(padding=False, causal=True, globals=True),
    "padding+causal": dict(padding=True, causal=True, globals=True),
    "padding, no global token": dict(padding=True, causal=False, globals=False),
}


@pytest.mark.parametrize("impl", ["fast", "reference"])
@pytest.mark.parametrize("case", CASES)
def test_both_paths_follow_the_rules(impl, case):
    # n = 13 is no multiple of the window or of a block; the window (6: 3 each side) is short.
    batch, n = 2, 13
    padding, causal, globals_ = (CASES[case][key] for key in ("padding", "causal", "globals"))
    module = build(attention_window=6, global_tokens=(1,) if globals_ else (), impl=impl)
    x = tokens(batch, n)
    real = torch.ones(batch, n, dtype=torch.bool)
    if padding:
        real[1, 9:] = False
        real[1, 4] = False
    extra_global = torch.zeros(batch, n, dtype=torch.bool)
    extra_global[0, 8] = globals_  # element 0 has two global tokens, element 1 one
    extra_global[1, 10] = globals_ and padding  # a padded token is never global
    is_global = extra_global | ((torch.arange(n) == 1) & globals_)
    expected, expected_weights = rules_by_hand(module, x, real, is_global, causal)
    kwargs = dict(
        attention_mask=real if padding else None,
        is_causal=causal,
        global_attention_mask=extra_global,
    )
    output = module(x, **kwargs).output
    assert (output - expected).abs().max().item() < 1e-12
    weights = module(x, need_weights=True, **kwargs).weights
    assert (weights - expected_weights).abs().max().item() < 1e-12


@pytest.mark.parametrize(
    "n, window",
    [(300, 260), (130, 64), (10, 512)],
    ids=["3 chunks each side", "1 chunk each side", "window longer than the input"],
)
def test_fast_path_matches_the_reference_at_other_block_shapes(n, window):
    fast = build(attention_window=window, global_tokens=(0,))
    reference = build(attention_window=window, global_tokens=(0,), impl="reference")
    reference.load_state_dict(fast.state_dict())
    real = torch.ones(2, n, dtype=torch.bool)
    real[1, n // 3] = False
    real[1, n - n // 4 :] = False
    extra_global = torch.zeros(2, n, dtype=torch.bool)
    extra_global[1, n // 2] = True
    x = tokens(2, n)
    for causal in (False, True):
        outputs = [
            module(x, attention_mask=real, is_causal=causal, global_attention_mask=extra_global)
            for module in (fast, reference)
        ]
        assert (outputs[0].output - outputs[1].output).abs().max().item() < 1e-12


@pytest.mark.parametrize(
    "global_tokens, folded",
    [((0, 5), True), (tuple(range(0, 16, 2)), False)],
    ids=["K_g and V_g folded into 2 global queries", "8 global queries: K_g, V_g projected"],
)
@pytest.mark.parametrize("causal", [True, False])
def test_fast_path_gradients_match_the_reference(global_tokens, folded, causal):
    fast = build(attention_window=4, global_tokens=global_tokens)
    reference = build(attention_window=4, global_tokens=global_tokens, impl="reference")
    reference.load_state_dict(fast.state_dict())
    plugin = sys.modules[type(fast).__module__]
    assert plugin.folds_global_keys(len(global_tokens), HEADS, D_MODEL) == folded
    n = 20
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, 13:] = False
    upstream = tokens(2, n, seed=3)
    for module in (fast, reference):
        output = module(tokens(2, n), attention_mask=mask, is_causal=causal).output
        (output * upstream).sum().backward()
    for (name, a), b in zip(fast.named_parameters(), reference.parameters(), strict=True):
        assert a.grad.abs().max() > 0, name
        assert (a.grad - b.grad).abs().max().item() < 1e-12, name


def test_matches_hf_longformer_self_attention():
    modeling = pytest.importorskip("transformers.models.longformer.modeling_longformer")
    from transformers import LongformerConfig as HFConfig

    batch, n, window = 2, 16, 4  # HF needs n to be a multiple of the window
    hf = modeling.LongformerSelfAttention(
        HFConfig(
            hidden_size=D_MODEL,
            num_attention_heads=HEADS,
            attention_window=[window],
            attention_probs_dropout_prob=0.0,
        ),
        layer_id=0,
    ).eval()
    fast = build(attention_window=window, global_tokens=(0,)).float()
    reference = build(attention_window=window, global_tokens=(0,), impl="reference").float()
    names = {"query": "q", "key": "k", "value": "v"}
    with torch.no_grad():
        for hf_name, short in names.items():
            getattr(hf, hf_name).load_state_dict(getattr(fast, f"{short}_proj").state_dict())
            getattr(hf, f"{hf_name}_global").load_state_dict(
                getattr(fast, f"{short}_global_proj").state_dict()
            )
        # HF stops before the output projection; make ours the identity to compare.
        fast.out_proj.weight.copy_(torch.eye(D_MODEL))
        fast.out_proj.bias.zero_()
    reference.load_state_dict(fast.state_dict())
    x = tokens(batch, n).float()
    real = torch.ones(batch, n, dtype=torch.bool)
    real[1, 11:] = False
    real[1, 5] = False
    is_global = torch.zeros(batch, n, dtype=torch.bool)
    is_global[0, 9] = True
    # LongformerModel's per-token mask: negative = padding, 0 = local, positive = global.
    hf_mask = torch.zeros(batch, n)
    hf_mask[~real] = -10000.0
    hf_mask[(is_global | (torch.arange(n) == 0)) & real] = 10000.0
    with torch.no_grad():
        expected = hf(
            x,
            attention_mask=hf_mask,
            is_index_masked=hf_mask < 0,
            is_index_global_attn=hf_mask > 0,
            is_global_attn=True,
        )[0]
        for module in (fast, reference):
            output = module(x, attention_mask=real, global_attention_mask=is_global).output
            error = (output - expected).abs().max().item()
            print(f"HF parity ({module.config.impl}): max abs error {error:.3g}")
            assert error < 1e-5


def test_global_projections_start_as_copies_of_the_local_ones():
    module = playground.build("longformer", d_model=D_MODEL, num_heads=HEADS)
    for short in ("q", "k", "v"):
        local, global_ = getattr(module, f"{short}_proj"), getattr(module, f"{short}_global_proj")
        assert torch.equal(local.weight, global_.weight) and torch.equal(local.bias, global_.bias)
        assert local.weight.data_ptr() != global_.weight.data_ptr()  # copies, not shared


@pytest.mark.parametrize("window", [0, 3, -2])
def test_window_must_be_even_and_at_least_two(window):
    with pytest.raises(ConfigError, match="attention_window must be an even integer"):
        playground.build("longformer", attention_window=window)


def test_global_positions_must_fit_the_input():
    with pytest.raises(ConfigError, match="cannot be negative"):
        playground.build("longformer", global_tokens=(-1,))
    module = playground.build("longformer", d_model=D_MODEL, num_heads=HEADS, global_tokens=(3, 20))
    with pytest.raises(InvalidInput, match=r"global_tokens \[20\]"):
        module(tokens(1, 8).float())
    with pytest.raises(InvalidInput, match="global_attention_mask must be a bool tensor"):
        module(tokens(1, 24).float(), global_attention_mask=torch.ones(1, 24))


def test_flops_clip_the_window_and_grow_linearly():
    flops = playground.get_variant("longformer").flops
    short = flops(8, 8, 64, 4, attention_window=512)
    assert short == 2 * 4 * 8 * 64 * 64 + 4 * 8 * 8 * 64  # every query sees all 8 keys
    with_global = flops(8, 8, 64, 4, attention_window=4, global_tokens=(0,))
    local_pairs = 7 * (5 + 1)
    # One global query, 4 heads: K_g and V_g folded into it (G·H < d_model), so no
    # projection of every token, and its 4 heads' scores and mix at width d_model + 1.
    projections = 2 * (4 * 8 + 1) * 64 * 64 + 2 * 2 * 64 * 65
    assert with_global == projections + 4 * local_pairs * 64 + 4 * 4 * 8 * 65
    # Two global queries of 4 heads at d_model 8: K_g and V_g projected for every token.
    projected = flops(8, 8, 8, 4, attention_window=4, global_tokens=(0, 1))
    local_pairs, global_pairs = 6 * (5 + 2), 2 * 8
    projections = 2 * (4 * 8 + 2 + 2 * 8) * 8 * 8
    assert projected == projections + 4 * (local_pairs + global_pairs) * 8
    n, options = 1 << 16, dict(global_tokens=(0,))
    growth = flops(2 * n, 2 * n, 512, 8, **options) / flops(n, n, 512, 8, **options)
    assert growth == pytest.approx(2, rel=1e-3)
