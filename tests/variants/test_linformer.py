"""Linformer (plugins/linformer.py): identity parity with vanilla, sequence projection,
length limit, padding, sharing modes, options, FLOPs and initialisation."""

from __future__ import annotations

import math

import pytest
import torch

import playground
from playground import ConfigError, UnsupportedFeature
from playground.contract import flops_exponent
from playground.testing import check_attention
from playground.testing.checks import (
    check_fast_matches_reference,
    check_fully_masked_rows_are_zero,
    check_gradients_reach_every_parameter,
    check_padding_invariance,
)

D_MODEL, HEADS = 32, 4
SHARINGS = ("headwise", "kv", "none", "layerwise")
IMPLS = ("fast", "reference")


def tokens(batch: int, n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, n, D_MODEL, generator=torch.Generator().manual_seed(seed))


def build(**options) -> playground.AttentionVariant:
    torch.manual_seed(0)
    return playground.build("linformer", d_model=D_MODEL, num_heads=HEADS, **options).eval()


def padding_mask(batch: int, n: int) -> torch.Tensor:
    """Element 0 all real; the others lose the last 3 keys and one in the middle."""
    mask = torch.ones(batch, n, dtype=torch.bool)
    mask[1:, -3:] = False
    mask[1:, n // 3] = False
    return mask


def with_identity_projections(n: int, impl: str, bias: bool = True):
    """A (vanilla, linformer) pair with the same q/k/v/out weights and E = F = I (k = n)."""
    torch.manual_seed(0)
    vanilla = playground.build("vanilla", d_model=D_MODEL, num_heads=HEADS, bias=bias).eval()
    linformer = build(seq_len=n, k=n, impl=impl, bias=bias)
    missing, unexpected = linformer.load_state_dict(vanilla.state_dict(), strict=False)
    assert sorted(missing) == ["E", "F"] and not unexpected  # loaded by name
    with torch.no_grad():
        linformer.E.copy_(torch.eye(n))
        linformer.F.copy_(torch.eye(n))
    return vanilla, linformer


# --- parity with vanilla -----------------------------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("n_q", [16, 7])  # self-attention, and cross-attention onto 16 keys
def test_identity_projection_equals_vanilla(impl, n_q):
    vanilla, linformer = with_identity_projections(16, impl)
    query, memory = tokens(2, n_q, seed=1), tokens(2, 16, seed=2)
    if n_q == 16:
        memory = query
    expected = vanilla(query, memory, memory).output
    difference = (linformer(query, memory, memory).output - expected).abs().max().item()
    assert difference <= 1e-5


@pytest.mark.parametrize("impl", IMPLS)
def test_padded_keys_act_as_zero_keys_with_zero_values(impl):
    # Linformer zeroes padded keys and values instead of leaving them out of the softmax:
    # each still scores q·0 = 0 and takes a share of the probability mass, adding
    # nothing. Without biases that is vanilla fed zero rows for the padded tokens.
    vanilla, linformer = with_identity_projections(16, impl, bias=False)
    x, mask = tokens(3, 16, seed=1), padding_mask(3, 16)
    zeroed = x * mask[..., None]
    output = linformer(x, attention_mask=mask).output
    expected = vanilla(x, zeroed, zeroed).output
    assert (output - expected).abs().max().item() <= 1e-5
    # ...which is not vanilla with the keys masked out: the padded elements differ.
    masked_out = vanilla(x, attention_mask=mask).output
    assert torch.allclose(output[0], masked_out[0], atol=1e-5)  # element 0 has no padding
    assert (output[1:] - masked_out[1:]).abs().max().item() > 1e-3


# --- sequence projection and its length ----------------------------------------------
def by_hand(module, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """Eq. 7 head by head, with E[:, :n] and F[:, :n] for n keys (sharing="headwise")."""
    n, d = key.shape[1], module.head_dim
    q, k, v = module.q_proj(query), module.k_proj(key), module.v_proj(key)
    heads = []
    for head in range(module.num_heads):
        columns = slice(head * d, (head + 1) * d)
        k_short = module.E[:, :n] @ k[..., columns]  # (B, k, d)
        v_short = module.F[:, :n] @ v[..., columns]
        scores = q[..., columns] @ k_short.transpose(1, 2) / math.sqrt(d)
        heads.append(scores.softmax(dim=-1) @ v_short)
    return module.out_proj(torch.cat(heads, dim=-1))


@pytest.mark.parametrize("impl", IMPLS)
def test_short_input_uses_first_columns_of_E_and_F(impl):
    module = build(seq_len=32, k=8, impl=impl)
    x = tokens(2, 10, seed=1)
    expected = by_hand(module, x, x)
    assert (module(x).output - expected).abs().max().item() <= 1e-5
    # The same as a layer sized for 10 keys holding those first 10 columns.
    exact_size = build(seq_len=10, k=8, impl=impl)
    state = {**module.state_dict(), "E": module.E[:, :10], "F": module.F[:, :10]}
    exact_size.load_state_dict(state)
    assert (exact_size(x).output - module(x).output).abs().max().item() <= 1e-6
    # Columns past the input length are never read.
    with torch.no_grad():
        module.E[:, 10:] = float("nan")
        module.F[:, 10:] = float("nan")
    assert torch.isfinite(module(x).output).all()


@pytest.mark.parametrize("impl", IMPLS)
def test_keys_longer_than_seq_len_raise_naming_seq_len(impl):
    module = build(seq_len=32, k=8, impl=impl)
    assert module.capabilities_for(module.config).max_seq_len == 32
    with pytest.raises(UnsupportedFeature, match=r"longer than 32 \(got 33\).*seq_len=32"):
        module(tokens(1, 33))
    with pytest.raises(UnsupportedFeature, match=r"\(got 40\).*seq_len >= the key length"):
        module(tokens(1, 5), tokens(1, 40), tokens(1, 40))
    # The limit is on keys: any number of queries may attend to 32 keys.
    assert module(tokens(1, 50), tokens(1, 32), tokens(1, 32)).output.shape == (1, 50, D_MODEL)


def test_causal_and_weights_are_refused():
    module, x = build(seq_len=32, k=8), tokens(1, 16)
    with pytest.raises(UnsupportedFeature, match="causal"):
        module(x, is_causal=True)
    with pytest.raises(UnsupportedFeature, match="need_weights"):
        module(x, need_weights=True)


def test_decoding_is_refused_with_the_reason():
    """Declared decoding=False: prefill says why (the slots mix every position) and what
    to use instead, before any work."""
    with pytest.raises(UnsupportedFeature, match="decoding one token at a time") as refused:
        build(seq_len=32, k=8).prefill(tokens(1, 4))
    message = str(refused.value)
    assert "mixes all seq_len positions" in message and "Generate with a causal variant" in message
    assert not build().capabilities.decoding


# --- padding -------------------------------------------------------------------------
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("sharing", SHARINGS)
def test_padding_cannot_leak(impl, sharing):
    module = build(seq_len=32, k=8, impl=impl, sharing=sharing)
    x, mask = tokens(3, 16, seed=1), padding_mask(3, 16)
    changed = torch.where(mask[..., None], x, 1e3 * tokens(3, 16, seed=2))
    before, after = (
        module(x, attention_mask=mask).output,
        module(changed, attention_mask=mask).output,
    )
    assert torch.equal(before[mask], after[mask])  # zeroed before E: bit for bit
    # Cross-attention: padded memory changes no query at all.
    query = tokens(3, 5, seed=3)
    before = module(query, x, x, attention_mask=mask).output
    after = module(query, changed, changed, attention_mask=mask).output
    assert torch.equal(before, after)


@pytest.mark.parametrize("sharing", SHARINGS)
def test_contract_checks_hold_for_every_sharing_mode(sharing):
    checks = [
        check_fast_matches_reference,
        check_padding_invariance,
        check_fully_masked_rows_are_zero,
        check_gradients_reach_every_parameter,
    ]
    report = check_attention("linformer", checks=checks, options={"sharing": sharing})
    assert report.ok, [(r.impl, r.check, r.reason) for r in report.failures]


@pytest.mark.parametrize("impl", IMPLS)
def test_fully_padded_element_outputs_exact_zeros(impl):
    module = build(seq_len=32, k=8, impl=impl).train()
    x, mask = tokens(2, 16, seed=1).requires_grad_(True), padding_mask(2, 16)
    mask[0] = False
    output = module(x, attention_mask=mask).output
    assert torch.equal(output[0], torch.zeros_like(output[0]))
    assert output[1].abs().max() > 0
    output.sum().backward()
    for gradient in [x.grad, *(p.grad for p in module.parameters())]:
        assert torch.isfinite(gradient).all()


# --- sharing -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("sharing", "shape", "e_is_f"),
    [
        ("headwise", (8, 32), False),
        ("kv", (8, 32), True),
        ("none", (HEADS, 8, 32), False),
        ("layerwise", (8, 32), True),
    ],
)
def test_sharing_modes_have_the_right_parameters(sharing, shape, e_is_f):
    module = build(seq_len=32, k=8, sharing=sharing)
    assert tuple(module.E.shape) == tuple(module.F.shape) == shape
    assert (module.E is module.F) == e_is_f
    projections = {name for name, _ in module.named_parameters()} - {
        f"{proj}.{kind}"
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj")
        for kind in ("weight", "bias")
    }
    assert projections == ({"E"} if e_is_f else {"E", "F"})  # a shared one is listed once
    if sharing == "none":  # each head its own matrix
        assert not torch.equal(module.E[0], module.E[1])


def test_layerwise_sharing_gives_layers_one_parameter():
    first, second = (
        build(seq_len=32, k=8, sharing="layerwise"),
        build(seq_len=32, k=8, sharing="layerwise"),
    )
    assert first.E is not second.E
    second.share_projections_with(first)
    assert second.E is first.E and second.F is first.E
    layers = torch.nn.ModuleList([first, second])
    own = sum(p.numel() for p in first.parameters())
    assert sum(p.numel() for p in layers.parameters()) == 2 * own - 8 * 32
    # Both layers train the one projection.
    x = tokens(1, 16)
    first(x).output.sum().backward()
    alone = first.E.grad.clone()
    first.E.grad = None
    second(first(x).output).output.sum().backward()
    assert not torch.allclose(first.E.grad, alone)
    with pytest.raises(ConfigError, match="same sharing, k, seq_len"):
        second.share_projections_with(build(seq_len=32, k=4, sharing="layerwise"))
    with pytest.raises(ConfigError, match="another linformer layer"):
        second.share_projections_with(playground.build("vanilla", d_model=D_MODEL, num_heads=HEADS))


# --- options, FLOPs, initialisation ----------------------------------------------------
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"k": 0}, "k must be between 1 and seq_len"),
        ({"k": 64, "seq_len": 32}, r"k must be between 1 and seq_len \(32\); got 64"),
        ({"seq_len": 0}, "seq_len must be a positive integer"),
        ({"sharing": "heads"}, "'sharing'.*'headwise', 'kv', 'none', 'layerwise'"),
        ({"k": 2.5}, "'k'.*must be an integer"),
        ({"dropout": 1.0}, "dropout must be in"),
    ],
)
def test_invalid_options_raise_clear_errors(options, message):
    with pytest.raises(ConfigError, match=message):
        build(**options)


def test_flops_count_every_term_and_grow_linearly():
    flops = playground.get_variant("linformer").flops
    n, d, k = 1024, 512, 256
    projections = 4 * 2 * n * d * d
    assert flops(n, n, d, 8, k=k) == projections + 2 * 2 * k * n * d + 2 * 2 * n * k * d
    assert flops(2 * n, 2 * n, d, 8, k=k) == 2 * flops(n, n, d, 8, k=k)
    assert flops_exponent(playground.get_variant("linformer")) == pytest.approx(1.0)
    # Shorter than k keys: E[:, :n] still makes k slots, and the softmax needs all k scores
    # (their rank, at most n, does not shorten it).
    assert flops(16, 16, d, 8, k=k) == 4 * 2 * 16 * d * d + 2 * 2 * k * 16 * d + 2 * 2 * 16 * k * d


def test_projections_start_as_fairseq_initialises_them():
    module = playground.build("linformer", seq_len=4096, k=256, sharing="none")
    bound = math.sqrt(6 / (4096 + 256)) / math.sqrt(2)  # xavier_uniform, gain 1/√2
    for projection in (module.E, module.F):
        assert projection.abs().max().item() <= bound
        assert projection.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.01)
    assert module.capabilities_for(module.config).max_seq_len == 4096


def test_every_reader_sees_the_limit_its_options_set():
    """Capabilities are a function of the config (`capabilities_for`): the model builder,
    the language task's scorer and the contract suite read the seq_len an instance was
    built with, not the class's default."""
    from playground.model.transformer import ModelConfig, TransformerClassifier
    from playground.registry import default_registry
    from playground.testing.subject import Subject

    cls = type(build())
    assert cls.capabilities.max_seq_len != 48
    config = ModelConfig(
        vocab_size=8, num_classes=4, max_seq_len=64, variant="linformer",
        variant_options={"seq_len": 48, "k": 4}, d_model=16, num_heads=2, num_layers=1,
    )  # fmt: skip
    with pytest.raises(UnsupportedFeature, match="its limit is 48"):
        TransformerClassifier(config, default_registry())
    subject = Subject(cls, options={"seq_len": 48, "k": 4})
    assert subject.caps.max_seq_len == 48 and max(subject.lengths) == 48
