"""The decoding API's own promises (playground.decoding; AttentionVariant.prefill and
decode_step): padded prompts, the state's checks, the default for a variant with no state
of its own, and the shared cache. The contract suite holds every shipped variant to the
causal forward (playground/testing/decoding.py)."""

from __future__ import annotations

import pytest
import torch

import playground
from playground import InvalidInput, UnsupportedFeature
from playground.decoding import TokenCache, left_aligned
from playground.errors import PluginLoadError
from playground.registry import Registry
from playground.testing.decoding import decoded, held_bytes

D_MODEL, HEADS = 32, 4


def build(name: str = "vanilla", **options) -> playground.AttentionVariant:
    torch.manual_seed(0)
    return playground.build(name, D_MODEL, HEADS, **options).double().eval()


def tokens(batch: int, n: int) -> torch.Tensor:
    return torch.randn(batch, n, D_MODEL, generator=torch.Generator().manual_seed(1)).double()


@pytest.mark.parametrize("name", ["vanilla", "rope", "alibi", "linear", "t5_relative"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_a_padded_batch_decodes_like_each_sequence_alone(name, side):
    """Relative positions only: a sequence's outputs do not depend on its neighbours'
    lengths, nor on the side its padding is on."""
    module, lengths, prompt, steps = build(name), [6, 3, 1], 6, 4
    x = tokens(3, prompt + steps)
    padded = torch.zeros_like(x)
    mask = torch.zeros(3, prompt, dtype=torch.bool)
    for b, real in enumerate(lengths):
        where = slice(prompt - real, prompt) if side == "left" else slice(0, real)
        padded[b, where], mask[b, where] = x[b, :real], True
        padded[b, prompt:] = x[b, real : real + steps]
    got = decoded(module, padded, prompt, mask)
    for b, real in enumerate(lengths):
        with torch.no_grad():
            alone = module(x[b : b + 1, : real + steps], is_causal=True).output[0]
        mine = torch.cat([got[b, :prompt][mask[b]], got[b, prompt:]])
        assert (mine - alone).abs().max() < 1e-10
        assert (got[b, :prompt][~mask[b]] == 0).all()  # padding outputs zero


def test_padding_inside_a_prompt_is_refused():
    mask = torch.tensor([[True, False, True]])
    with pytest.raises(InvalidInput, match=r"pad on one side only.*sequence 0"):
        build().prefill(tokens(1, 3), attention_mask=mask)


def test_left_aligned_moves_only_right_padding():
    mask = torch.tensor([[True, True, False], [False, True, True], [False, False, False]])
    assert left_aligned(mask).tolist() == [1, 0, 0]
    assert left_aligned(torch.ones(2, 3, dtype=torch.bool)) is None


@pytest.mark.parametrize(
    ("problem", "words"),
    [
        ("another module", "not started by this 'vanilla' module"),
        ("dtype", "the token is torch.float32 on cpu but the state was started with torch.float64"),
        ("shape", r"one token per sequence, \(batch=2, 1, d_model=32\)"),
        ("full", "the state is full: it was started with max_length=4"),
    ],
)
def test_a_wrong_step_is_a_clear_error(problem, words):
    module = build()
    with torch.no_grad():
        _, state = module.prefill(tokens(2, 3), max_length=4)
        module.decode_step(tokens(2, 1), state)
        token, target = tokens(2, 1), module
        if problem == "another module":
            target = build()
        elif problem == "dtype":
            token = token.float()
        elif problem == "shape":
            token = tokens(2, 2)
        with pytest.raises(InvalidInput, match=words):
            target.decode_step(token, state)


def test_max_length_shorter_than_the_prompt_is_refused():
    with pytest.raises(InvalidInput, match=r"max_length \(2\) must be at least the prompt"):
        build().prefill(tokens(1, 3), max_length=2)


@pytest.mark.parametrize("name", ["linformer", "nystromformer"])
def test_a_variant_that_cannot_decode_says_so(name):
    with pytest.raises(UnsupportedFeature, match="decoding one token at a time"):
        build(name).prefill(tokens(1, 4))


def test_a_user_variant_gets_the_exact_default():
    """A causal variant with no state of its own decodes by re-running its forward."""

    class Doubled(playground.get_variant("vanilla")):
        name = "doubled"
        prefill_state = playground.AttentionVariant.prefill_state
        step_state = playground.AttentionVariant.step_state

    torch.manual_seed(0)
    module = Doubled(D_MODEL, HEADS).double().eval()
    x = tokens(2, 7)
    with torch.no_grad():
        expected = module(x, is_causal=True).output
    for prompt in (0, 1, 4):
        got = decoded(module, x, prompt)
        assert (got - expected).abs().max() < 1e-12
    _, state = module.prefill(x)
    assert type(state).__name__ == "RecomputeState"


def test_overriding_half_of_the_decoding_pair_is_refused_at_registration(tmp_path):
    (tmp_path / "half.py").write_text(
        "import playground\n"
        "class Half(playground.get_variant('linformer')):\n"
        "    name = 'half'\n"
        "    def step_state(self, token, state):\n"
        "        return token\n"
        "@playground.hookimpl\n"
        "def register_attention(register):\n"
        "    register(Half)\n"
    )
    registry = Registry()
    registry.load_directory(tmp_path, "test")
    assert any(
        isinstance(e, PluginLoadError) and "overrides step_state but not prefill_state" in str(e)
        for e in registry.errors
    )


def test_a_growing_cache_keeps_everything_and_doubles():
    cache = TokenCache()
    for n in (3, 20, 1):
        cache.append(torch.ones(1, n, dtype=torch.bool), k=torch.randn(1, 2, n, 4))
    assert cache.kept == 24 and cache.slots == 32  # 16 slots, then twice that
    assert cache.kept_positions().tolist() == list(range(24))
    assert cache.nbytes == held_bytes(cache) == 32 * (2 * 4 * 4 + 1)


def test_a_rolling_cache_keeps_the_last_window():
    cache, values = TokenCache(window=4), torch.arange(10.0).view(1, 1, 10, 1)
    cache.append(torch.ones(1, 7, dtype=torch.bool), v=values[:, :, :7])
    for t in range(7, 10):
        cache.append(torch.ones(1, 1, dtype=torch.bool), v=values[:, :, t : t + 1])
    kept = cache.kept_entries()["v"].flatten().tolist()
    assert sorted(kept) == [6.0, 7.0, 8.0, 9.0]
    assert [kept[i] for i in range(4)] == [float(p) for p in cache.kept_positions().tolist()]


def test_a_preallocated_cache_refuses_to_overflow():
    cache = TokenCache(max_length=3)
    cache.append(torch.ones(1, 3, dtype=torch.bool), k=torch.randn(1, 1, 3, 2))
    with pytest.raises(InvalidInput, match="holds at most 3 tokens"):
        cache.append(torch.ones(1, 1, dtype=torch.bool), k=torch.randn(1, 1, 1, 2))


def test_the_state_size_check_finds_a_hidden_tensor():
    _, state = build().prefill(tokens(1, 3))
    assert state.nbytes == held_bytes(state)
    state.hidden = (lambda kept: lambda: kept)(torch.zeros(100))  # in a closure only
    assert held_bytes(state) == state.nbytes + 400
