"""Longformer: both paths against the rules written out by hand, and against HF's
`LongformerSelfAttention`."""

from __future__ import annotations

import math
import sys

import pytest
import torch

import playground
from playground import ConfigError, InvalidInput
from playground.testing.decoding_checks import decoded

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


# --- decoding: a rolling window, the global tokens kept ----------------------------------
TOLERANCES = {torch.float64: 1e-10, torch.float32: 1e-5}


@pytest.mark.parametrize("dtype", TOLERANCES, ids=str)
@pytest.mark.parametrize("impl", ["fast", "reference"])
@pytest.mark.parametrize(
    "global_tokens", [(), (0,), (1, 9, 40)], ids=["no global", "global 0", "global 1, 9, 40"]
)
def test_decoding_equals_the_causal_forward(impl, dtype, global_tokens):
    """Every decoded output equals the causal forward's, for prompts of 0, 1, half and past
    the fast path's block (so decoded tokens are global at 0, 9 or 40 too), window 6
    (w = 3)."""
    module = build(attention_window=6, global_tokens=global_tokens, impl=impl).to(dtype)
    n = 70  # past BAND_BLOCK (64), the last special size
    x = tokens(2, n).to(dtype)
    with torch.no_grad():
        expected = module(x, is_causal=True).output
    for prompt in (0, 1, 35, 66):
        got, _ = decoded(module, x, prompt)
        assert (got - expected).abs().max() < TOLERANCES[dtype], prompt


@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_a_padded_batch_with_global_prompt_tokens_decodes_exactly(impl):
    """Left-padded prompts of lengths 12, 5 and 1, each with its own global tokens (one on
    padding, which is not global), decoded past the window and the global positions, which
    count from each sequence's first real token."""
    module = build(attention_window=4, global_tokens=(2, 15), impl=impl)
    n, prompt = 30, 12
    x = tokens(3, n)
    mask = torch.arange(n)[None, :] >= (prompt - torch.tensor([12, 5, 1]))[:, None]
    is_global = torch.zeros(3, n, dtype=torch.bool)
    is_global[0, 4], is_global[1, 8], is_global[2, 3] = True, True, True
    with torch.no_grad():
        expected = module(
            x, attention_mask=mask, is_causal=True, global_attention_mask=is_global
        ).output
    got, state = decoded(
        module, x, prompt, mask[:, :prompt], global_attention_mask=is_global[:, :prompt]
    )
    assert ((got - expected) * mask[..., None]).abs().max() < 1e-10
    assert (got[~mask] == 0).all()  # padding outputs zero
    # Global: 2, 4 and 15 in sequence 0 (from 0); 8, 9 and 22 in sequence 1 (from 7); 13
    # and 26 in sequence 2 (from 11; 3 is padding).
    assert state.global_keys.kept_real().sum(dim=1).tolist() == [3, 3, 2]


def test_the_state_stops_growing_past_the_window():
    """The same bytes after 1k tokens as after 4k; K_g and V_g of every token are kept only
    until the last global position, then dropped."""
    module = build(attention_window=64, global_tokens=(0, 300)).float()
    x = tokens(2, 4096).float()
    with torch.no_grad():
        short = module.prefill(x[:, :1024])[1]
        long = module.prefill(x)[1]
        module.decode_step(x[:, :1], long)
    assert short.nbytes == long.nbytes
    assert short.local.slots == 33  # the last w + 1 positions
    assert short.global_projected is None
    sizes = [decoded(module, x[:, :n], 200)[1].nbytes for n in (300, 301)]
    _, state = decoded(module, x[:, :400], 200)
    assert sizes[0] > sizes[1] == state.nbytes  # K_g, V_g dropped after position 300
    assert state.global_projected is None and state.global_keys.kept == 2


def test_global_tokens_past_the_input_are_ignored_only_under_causal_masking():
    """A causal forward is the prefix of a longer one, whose global position comes later;
    without causality that position is refused (test_global_positions_must_fit_the_input)."""
    module = build(attention_window=4, global_tokens=(1, 12))
    x = tokens(2, 16)
    with torch.no_grad():
        longer = module(x, is_causal=True).output
        prefix = module(x[:, :10], is_causal=True).output
    assert (prefix - longer[:, :10]).abs().max() < 1e-12
    with pytest.raises(InvalidInput, match=r"global_tokens \[12\]"):
        module(x[:, :10])


def test_a_global_attention_mask_past_the_prompt_is_refused():
    """Decoded positions are global by global_tokens alone: the prefill's mask covers the
    prompt."""
    module = build(attention_window=4)
    with pytest.raises(InvalidInput, match="global_attention_mask must be a bool tensor"):
        module.prefill(tokens(1, 6), global_attention_mask=torch.ones(1, 9, dtype=torch.bool))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_global_tokens_count_from_each_sequences_first_real_token(impl, causal):
    """Left padding moves `global_tokens` with the tokens: each sequence of a left-padded
    batch gets the outputs it gets alone (its [CLS] is its first token)."""
    module = build(attention_window=4, global_tokens=(0, 3), impl=impl)
    n, lengths = 9, [9, 6, 4]
    x = tokens(3, n)
    mask = torch.arange(n)[None, :] >= (n - torch.tensor(lengths))[:, None]
    with torch.no_grad():
        padded = module(x, attention_mask=mask, is_causal=causal).output
        for b, length in enumerate(lengths):
            alone = module(x[b : b + 1, n - length :], is_causal=causal).output
            assert (padded[b, n - length :] - alone[0]).abs().max() < 1e-12, b
        # The comparison can fail: counted from position 0 of the batch, sequence 1 (from 3)
        # would have only its first token global, as with global_tokens=(0,) alone.
        first_only = build(attention_window=4, global_tokens=(0,), impl=impl)
        alone = first_only(x[1:2, 3:], is_causal=causal).output
    assert (padded[1, 3:] - alone[0]).abs().max() > 1e-3
