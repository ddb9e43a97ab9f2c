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
