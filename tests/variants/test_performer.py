"""Performer (FAVOR+) against `performer_pytorch`'s `FastAttention` given the same
projection matrix; its error against exact attention falling with the number of
features; fixed features in eval and redrawn ones in training only by option."""

from __future__ import annotations

import itertools
import math
import warnings

import pytest
import torch

import playground
from playground.heads import project_heads
from playground.testing import check_attention
from playground.testing.decoding_checks import decoded

D_MODEL, HEADS = 32, 4


@pytest.fixture(scope="module")
def fast_attention():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its distutils and torch.cuda.amp imports
        return pytest.importorskip("performer_pytorch").FastAttention


@pytest.mark.parametrize("impl", ["fast", "reference"])
@pytest.mark.parametrize("nb_features", [8, 40])
def test_equals_performer_pytorch_with_the_same_projection(fast_attention, impl, nb_features):
    torch.manual_seed(0)
    module = playground.build("performer", D_MODEL, HEADS, nb_features=nb_features, impl=impl)
    module = module.double().eval()
    theirs = fast_attention(D_MODEL // HEADS, nb_features=nb_features).double()
    theirs.projection_matrix.copy_(module.projection_matrix)
    x = torch.randn(2, 21, D_MODEL, dtype=torch.float64)
    q, k, v = project_heads(module, x, x, x)
    with torch.no_grad():
        expected = module.out_proj(theirs(q, k, v).transpose(1, 2).flatten(2))
        output = module(x).output
    assert (output - expected).abs().max() < 1e-10


def test_another_projection_is_caught(fast_attention):
    """The comparison can fail: other random features give another estimate."""
    torch.manual_seed(0)
    module = playground.build("performer", D_MODEL, HEADS, nb_features=8).double().eval()
    theirs = fast_attention(D_MODEL // HEADS, nb_features=8).double()  # its own draw
    x = torch.randn(1, 9, D_MODEL, dtype=torch.float64)
    q, k, v = project_heads(module, x, x, x)
    with torch.no_grad():
        expected = module.out_proj(theirs(q, k, v).transpose(1, 2).flatten(2))
        assert (module(x).output - expected).abs().max() > 1e-4


def error_against_exact(nb_features: int, seeds=range(4)) -> float:
    """Mean absolute error of the output against exact attention, over projection seeds,
    on inputs whose scores stay moderate (where positive features estimate well)."""
    errors = []
    for seed in seeds:
        torch.manual_seed(0)
        vanilla = playground.build("vanilla", D_MODEL, HEADS)
        performer = playground.build(
            "performer", D_MODEL, HEADS, nb_features=nb_features, feature_seed=seed
        )
        state = {**performer.state_dict(), **vanilla.state_dict()}
        performer.load_state_dict(state)
        x = 0.5 * torch.randn(2, 64, D_MODEL, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            errors.append((performer(x).output - vanilla(x).output).abs().mean().item())
    return sum(errors) / len(errors)


def test_the_error_falls_as_features_grow():
    curve = [error_against_exact(m) for m in (4, 16, 64, 256)]
    assert all(later < earlier for earlier, later in itertools.pairwise(curve))
    assert curve[-1] < curve[0] / 3


def test_features_are_fixed_in_eval_and_redrawn_in_training_only_by_option():
    torch.manual_seed(0)
    x = torch.randn(1, 10, D_MODEL)
    fixed = playground.build("performer", D_MODEL, HEADS).train()
    redrawn = playground.build("performer", D_MODEL, HEADS, redraw_features=True)
    redrawn.load_state_dict(fixed.state_dict())
    with torch.no_grad():
        assert torch.equal(fixed(x).output, fixed(x).output)
        assert not torch.equal(redrawn.train()(x).output, redrawn(x).output)
        assert torch.equal(redrawn.eval()(x).output, fixed(x).output)
    same_seed = playground.build("performer", D_MODEL, HEADS, feature_seed=0)
    assert torch.equal(same_seed.projection_matrix, fixed.projection_matrix)
    rows = fixed.projection_matrix[: D_MODEL // HEADS]
    gram = rows @ rows.T  # one block: orthogonal rows
    assert (gram - torch.diag(gram.diagonal())).abs().max() < 1e-4


def test_the_contract_holds_with_redrawn_features():
    """Declared random in training: the suite seeds each training call it compares, and
    checks that the randomness is there."""
    report = check_attention("performer", options={"redraw_features": True})
    assert report.ok, report.failures
    assert math.isfinite(error_against_exact(8, seeds=[0]))


# --- causal attention and decoding -------------------------------------------------------
TOLERANCES = {torch.float64: 1e-10, torch.float32: 1e-5}


def build(dtype=torch.float64, **options) -> playground.AttentionVariant:
    torch.manual_seed(0)
    options = {"nb_features": 12, **options}
    return playground.build("performer", D_MODEL, HEADS, **options).to(dtype).eval()


@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_causal_output_is_performer_pytorch_on_the_prefix(fast_attention, impl):
    """Query i stabilises the keys it sees by their maximum: its output is FastAttention's
    (non-causal, the same W) on the tokens up to i, at i."""
    module = build(impl=impl, chunk_size=4)
    theirs = fast_attention(D_MODEL // HEADS, nb_features=12).double()
    theirs.projection_matrix.copy_(module.projection_matrix)
    x = torch.randn(2, 11, D_MODEL, dtype=torch.float64)
    x[:, 7] *= 4  # a key with a large peak midway: the stabiliser grows there
    with torch.no_grad():
        output = module(x, is_causal=True).output
        for i in range(x.shape[1]):
            q, k, v = project_heads(module, x[:, : i + 1], x[:, : i + 1], x[:, : i + 1])
            expected = module.out_proj(theirs(q, k, v).transpose(1, 2).flatten(2))[:, -1]
            assert (output[:, i] - expected).abs().max() < 1e-10, i
        # The comparison can fail: the sequence's own stabiliser, seen by every query,
        # gives other outputs before the large key.
        q, k, v = project_heads(module, x, x, x)
        everything = fast_attention(D_MODEL // HEADS, nb_features=12, causal=True).double()
        everything.projection_matrix.copy_(module.projection_matrix)
        leaked = module.out_proj(everything(q, k, v).transpose(1, 2).flatten(2))
        assert (leaked[:, :7] - output[:, :7]).abs().max() > 1e-6


@pytest.mark.parametrize("chunk_size", [1, 4, 64])
def test_causal_fast_path_equals_the_reference_with_padding(chunk_size):
    """The chunked prefix sums equal the masked φ(Q) φ_i(K)ᵀ, with padding on the left, on
    the right and inside, at any chunk size; a future token changes nothing before it."""
    fast, reference = build(chunk_size=chunk_size), build(impl="reference")
    x = torch.randn(3, 13, D_MODEL, dtype=torch.float64)
    mask = torch.ones(3, 13, dtype=torch.bool)
    mask[1, 9:], mask[1, 4], mask[2, :3] = False, False, False
    with torch.no_grad():
        got = fast(x, attention_mask=mask, is_causal=True).output
        expected = reference(x, attention_mask=mask, is_causal=True).output
        assert (got - expected).abs().max() < 1e-12
        future = x.clone()
        future[:, 8:] = 30 * torch.randn(3, 5, D_MODEL, dtype=torch.float64)
        changed = fast(future, attention_mask=mask, is_causal=True).output
        assert (changed[:, :8] - got[:, :8]).abs().max() < 1e-12
        assert (changed[:, 8:] - got[:, 8:]).abs().max() > 1e-3


@pytest.mark.parametrize("dtype", TOLERANCES, ids=str)
@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_decoding_equals_the_causal_forward(impl, dtype):
    """Every decoded output equals the causal forward's, for prompts of 0, 1, past a
    chunk and past nb_features tokens, and for a batch of left-padded prompts of different
    lengths (padding only in the prompt)."""
    module = build(dtype, impl=impl, chunk_size=5)
    x = torch.randn(3, 17, D_MODEL, dtype=dtype)
    x[:, 9] *= 4  # the running maximum grows while decoding
    with torch.no_grad():
        expected = module(x, is_causal=True).output
    for prompt in (0, 1, 6, 13, 16):
        got, state = decoded(module, x, prompt)
        assert (got - expected).abs().max() < TOLERANCES[dtype], prompt
    assert type(state).__name__ == "PerformerState"
    prompt, lengths = 10, torch.tensor([10, 4, 1])
    mask = torch.arange(17)[None, :] >= (prompt - lengths)[:, None]  # left padding
    with torch.no_grad():
        expected = module(x, attention_mask=mask, is_causal=True).output
    got, _ = decoded(module, x, prompt, mask[:, :prompt])
    assert ((got - expected) * mask[..., None]).abs().max() < TOLERANCES[dtype]
    assert (got[~mask] == 0).all()  # padding outputs zero


def test_the_state_has_a_fixed_size():
    """kv = Σ φ(k) vᵀ (B, H, m, dv) and normaliser = Σ φ(k) (B, H, m), with what restabilises
    them: as many bytes after 1k tokens as after 4k, and after more decoding steps."""
    module = build(torch.float32, chunk_size=1024)
    x = torch.randn(2, 4096, D_MODEL)
    with torch.no_grad():
        short = module.prefill(x[:, :1024])[1]
        long = module.prefill(x)[1]
        module.decode_step(x[:, :1], long)
    assert short.kv.shape == (2, HEADS, 12, D_MODEL // HEADS)
    assert short.normaliser.shape == (2, HEADS, 12)
    assert short.nbytes == long.nbytes
    assert (long.count == 4097).all()


def test_decoding_with_features_redrawn_in_training_is_refused():
    """Every training call draws its own W, so one decode's steps could not share it:
    refused with what to do. Eval mode decodes with the kept W; training without redrawing
    decodes exactly too."""
    redrawn = build(redraw_features=True).train()
    x = torch.randn(2, 6, D_MODEL, dtype=torch.float64)
    with pytest.raises(playground.UnsupportedFeature, match=r"training mode.*module\.eval\(\)"):
        redrawn.prefill(x)
    _, state = redrawn.eval().prefill(x[:, :3])
    with pytest.raises(playground.UnsupportedFeature, match="redraw_features=True"):
        redrawn.train().decode_step(x[:, 3:4], state)
    redrawn.eval()
    with torch.no_grad():
        expected = redrawn(x, is_causal=True).output
    assert (decoded(redrawn, x, 3)[0] - expected).abs().max() < 1e-10
    fixed = build().train()
    with torch.no_grad():
        expected = fixed(x, is_causal=True).output
    assert (decoded(fixed, x, 2)[0] - expected).abs().max() < 1e-10
