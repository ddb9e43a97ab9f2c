"""The decoding API's own promises (playground.decoding; AttentionVariant.prefill and
decode_step): padded prompts, the state's checks, the default for a variant with no state
of its own, and the shared cache. The contract suite holds every shipped variant to the
causal forward (playground/testing/decoding.py)."""

from __future__ import annotations

import pytest
import torch

import playground
from playground import HookError, InvalidInput, UnsupportedFeature
from playground.decoding import MIN_CAPACITY, RecomputeState, TokenCache, left_aligned
from playground.errors import PluginLoadError
from playground.registry import Registry
from playground.testing import check_attention
from playground.testing.decoding_checks import DECODING_CHECKS, decoded, held_bytes

D_MODEL, HEADS = 32, 4


def build(name: str = "vanilla", **options) -> playground.AttentionVariant:
    torch.manual_seed(0)
    return playground.build(name, D_MODEL, HEADS, **options).double().eval()


def tokens(batch: int, n: int) -> torch.Tensor:
    return torch.randn(batch, n, D_MODEL, generator=torch.Generator().manual_seed(1)).double()


def real(batch: int, n: int) -> torch.Tensor:
    return torch.ones(batch, n, dtype=torch.bool)


# --- the contract's decoding checks at options other than the suite's ------------------
OPTION_CASES = {
    "gqa, 2 key/value heads": ("gqa", {"num_kv_heads": 2}),
    "sigmoid, short bias and blocks": ("sigmoid", {"bias_length": 9, "block_size": 5}),
    "differential, a deeper layer's lambda": ("differential", {"layer_depth": 2}),
    "linear, chunks of 4": ("linear", {"chunk_size": 4}),
    "performer, 12 features in chunks of 5": ("performer", {"nb_features": 12, "chunk_size": 5}),
    "sliding_window, window 3": ("sliding_window", {"window": 3}),
}


@pytest.mark.parametrize(("name", "options"), OPTION_CASES.values(), ids=OPTION_CASES.keys())
def test_decoding_holds_at_other_options(name, options):
    """The suite runs every shipped variant at its suite options; its decoding checks (both
    paths, every split, padded batches, the state's bytes) hold at these too."""
    report = check_attention(name, checks=list(DECODING_CHECKS), options=options)
    assert report.ok, report.failures
    assert {result.verdict for result in report.results} == {"passed"}


# --- padded prompts ---------------------------------------------------------------------
PADDED_CASES = {
    "vanilla": ("vanilla", {}),
    "rope": ("rope", {}),
    "alibi": ("alibi", {}),
    "rolling_buffer": ("sliding_window", {"window": 3}),
    "recurrent": ("linear", {}),
    "t5_relative": ("t5_relative", {}),
}


@pytest.mark.parametrize(("name", "options"), PADDED_CASES.values(), ids=PADDED_CASES.keys())
@pytest.mark.parametrize("side", ["left", "right"])
def test_a_padded_batch_decodes_like_each_sequence_alone(name, options, side):
    """Relative positions only: a sequence's outputs do not depend on its neighbours'
    lengths, nor on the side its padding is on; prefill outputs zero at padding."""
    module, lengths, prompt, steps = build(name, **options), [6, 3, 1, 0], 6, 4
    x = tokens(len(lengths), prompt + steps)
    padded = torch.full_like(x, float("nan"))  # the core keeps padding out, NaN included
    mask = torch.zeros(len(lengths), prompt, dtype=torch.bool)
    for b, length in enumerate(lengths):
        where = slice(prompt - length, prompt) if side == "left" else slice(0, length)
        padded[b, where], mask[b, where] = x[b, :length], True
        padded[b, prompt:] = x[b, length : length + steps]
    got, _ = decoded(module, padded, prompt, mask)
    for b, length in enumerate(lengths):
        with torch.no_grad():
            alone = module(x[b : b + 1, : length + steps], is_causal=True).output[0]
        mine = torch.cat([got[b, :prompt][mask[b]], got[b, prompt:]])
        assert (mine - alone).abs().max() < 1e-10
        assert (got[b, :prompt][~mask[b]] == 0).all()


def test_padding_inside_a_prompt_is_refused():
    mask = torch.tensor([[True, True, True], [True, False, True]])
    with pytest.raises(
        InvalidInput,
        match=r"pad on one side only \(left or right\): sequence 1 has padding between its "
        r"real tokens; remove it, or decode that sequence on its own",
    ):
        build().prefill(tokens(2, 3), attention_mask=mask)


def test_left_aligned_moves_only_right_padding():
    mask = torch.tensor([[True, True, False], [False, True, True], [False, False, False]])
    assert left_aligned(mask).tolist() == [1, 0, 0]
    assert left_aligned(real(2, 3)) is None
    assert left_aligned(real(2, 0)) is None


# --- a wrong call is a clear error ----------------------------------------------------
@pytest.mark.parametrize(
    ("problem", "words"),
    [
        (
            "another module",
            r"not started by this 'vanilla' module \(got TokenCache\); start one with "
            r"`module.prefill\(prompt\)`, and give each layer its own",
        ),
        (
            "not a state",
            r"not started by this 'vanilla' module \(got dict\); start one with",
        ),
        (
            "dtype",
            "the token is torch.float32 on cpu but the state was started with torch.float64 "
            "on cpu; convert the token, or start again",
        ),
        (
            "device",
            "the token is torch.float64 on meta but the state was started with torch.float64 "
            "on cpu; convert the token, or start again",
        ),
        (
            "shape",
            r"one token per sequence, \(batch=2, 1, d_model=32\); got \(2, 2, 32\)",
        ),
        (
            "full",
            "the state is full: it was started with max_length=4 and holds 4 tokens; start it "
            "with a larger max_length",
        ),
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
        elif problem == "not a state":
            state = {"k": torch.zeros(1)}
        elif problem == "dtype":
            token = token.float()
        elif problem == "device":
            token = token.to("meta")
        elif problem == "shape":
            token = tokens(2, 2)
        with pytest.raises(InvalidInput, match=words):
            target.decode_step(token, state)


@pytest.mark.parametrize(
    ("max_length", "words"),
    [
        (2, r"max_length \(2\) must be at least the prompt's length \(3\) and 1; it counts the "),
        (3.0, "max_length must be an integer or None; got 3.0"),
    ],
)
def test_a_wrong_max_length_is_refused(max_length, words):
    with pytest.raises(InvalidInput, match=words):
        build().prefill(tokens(1, 3), max_length=max_length)


@pytest.mark.parametrize("name", ["linformer", "nystromformer"])
def test_a_variant_that_cannot_decode_says_so(name):
    with pytest.raises(
        UnsupportedFeature, match=rf"variant '{name}' does not support decoding one token at a time"
    ):
        build(name).prefill(tokens(1, 4))


# --- the default, and the pair of hooks ---------------------------------------------------
class Recomputed(playground.get_variant("vanilla")):
    """A user's causal variant with no state of its own."""

    name = "recomputed"
    prefill_state = playground.AttentionVariant.prefill_state
    step_state = playground.AttentionVariant.step_state


def test_a_user_variant_gets_the_exact_default():
    """A causal variant with no state of its own decodes by re-running its forward."""
    torch.manual_seed(0)
    module = Recomputed(D_MODEL, HEADS).double().eval()
    x = tokens(2, 7)
    with torch.no_grad():
        expected = module(x, is_causal=True).output
    for prompt in (0, 1, 4, 7):
        got, _ = decoded(module, x, prompt)
        assert (got - expected).abs().max() < 1e-12
    _, state = module.prefill(x)
    assert isinstance(state, RecomputeState)
    assert state.nbytes == held_bytes(state) > x.numel() * x.element_size()


def test_an_empty_prompt_starts_decoding():
    """p = 0: an empty prompt (with or without its empty mask) gives an empty output and a
    state at position 0; what follows decodes as the forward does, for a cache and for the
    default alike."""
    x = tokens(2, 5)
    for module in (build(), Recomputed(D_MODEL, HEADS).double().eval()):
        with torch.no_grad():
            expected = module(x, is_causal=True).output
        for mask in (None, real(2, 0)):
            output, state = module.prefill(x[:, :0], attention_mask=mask, max_length=5)
            assert output.shape == (2, 0, D_MODEL) and state.length == 0
            for t in range(5):
                step, state = module.decode_step(x[:, t : t + 1], state)
                assert (step[:, 0] - expected[:, t]).abs().max() < 1e-12
            assert state.length == 5


# Every decoding state written for the shipped plugins: the shared key/value cache
# (vanilla's), and each plugin's own.
DECODING_STATES = ["vanilla", "gqa", "differential", "linear", "performer", "longformer"]


@pytest.mark.parametrize("name", DECODING_STATES)
def test_a_decoding_state_refuses_a_forward_argument_it_does_not_keep(name):
    """A user's subclass that declares a forward argument of its own but keeps its
    parent's decoding state is refused when it decodes with that argument: the state
    would decode later tokens without it (it was a TypeError of the hook's signature)."""
    parent = playground.get_variant(name)
    declares = type(
        "DeclaresBias",
        (parent,),
        {"name": "declares_bias", "forward_kwargs": (*parent.forward_kwargs, "bias")},
    )
    torch.manual_seed(0)
    module = declares(D_MODEL, HEADS).double().eval()
    with pytest.raises(
        UnsupportedFeature,
        match=r"'declares_bias' does not support decoding with forward arguments \(bias\); "
        r"its decoding state keeps none of them",
    ):
        module.prefill(tokens(1, 3), bias=torch.zeros(1, 3))


class OnlyPrefills(playground.get_variant("linformer")):
    """Overrides prefill_state alone (never registered: registration refuses it)."""

    name = "only_prefills"
    capabilities = playground.get_variant("vanilla").capabilities

    def prefill_state(self, prompt, attention_mask, max_length):
        return torch.zeros_like(prompt), TokenCache()


def test_overriding_half_of_the_decoding_pair_is_a_hook_error_when_decoding():
    module = OnlyPrefills(D_MODEL, HEADS).double()
    _, state = module.prefill(tokens(1, 3))
    with pytest.raises(
        HookError,
        match=r"'only_prefills'.*its step_state\(\) hook got a TokenCache, made by an "
        r"overridden prefill_state; a variant that overrides one of prefill_state and "
        r"step_state must override both",
    ):
        module.decode_step(tokens(1, 1), state)


@pytest.mark.parametrize("hook", ["prefill_state", "step_state"])
def test_overriding_half_of_the_decoding_pair_is_refused_at_registration(tmp_path, hook):
    arguments = "prompt, attention_mask, max_length" if hook == "prefill_state" else "token, s"
    (tmp_path / "half.py").write_text(
        "import playground\n"
        "class Half(playground.get_variant('linformer')):\n"
        "    name = 'half'\n"
        f"    def {hook}(self, {arguments}):\n"
        "        raise AssertionError\n"
        "@playground.hookimpl\n"
        "def register_attention(register):\n"
        "    register(Half)\n"
    )
    registry = Registry()
    registry.load_directory(tmp_path, "test")
    other = "step_state" if hook == "prefill_state" else "prefill_state"
    assert "half" not in registry.names()
    assert any(
        isinstance(error, PluginLoadError) and f"overrides {hook} but not {other}" in str(error)
        for error in registry.errors
    ), registry.errors


# --- TokenCache ---------------------------------------------------------------------------
def test_a_growing_cache_keeps_everything_and_doubles():
    cache, slots = TokenCache(), []
    for n in (3, 20, 1, 0):
        cache.append(real(1, n), k=torch.randn(1, 2, n, 4))
        slots.append(cache.slots)
    assert slots == [MIN_CAPACITY, 2 * MIN_CAPACITY, 2 * MIN_CAPACITY, 2 * MIN_CAPACITY]
    assert cache.kept == 24 and cache.kept_positions().tolist() == list(range(24))
    # float32 keys (2 heads × 4) and one bool per slot
    assert cache.nbytes == held_bytes(cache) == 32 * (2 * 4 * 4 + 1)


def test_a_growing_cache_keeps_its_tokens_in_order():
    cache, values = TokenCache(), torch.arange(40.0).view(1, 1, 40, 1)
    cache.append(real(1, 10), v=values[:, :, :10])
    for t in range(10, 40):
        cache.append(real(1, 1), v=values[:, :, t : t + 1])
    assert cache.kept_entries()["v"].flatten().tolist() == values.flatten().tolist()


def test_a_rolling_cache_keeps_the_last_window_and_stops_growing():
    cache, values = TokenCache(window=4), torch.arange(10.0).view(1, 1, 10, 1)
    cache.append(real(1, 7), v=values[:, :, :7])
    size = cache.nbytes
    for t in range(7, 10):
        cache.append(real(1, 1), v=values[:, :, t : t + 1])
        assert cache.nbytes == size == held_bytes(cache) == 4 * (4 + 1)
    kept = cache.kept_entries()["v"].flatten().tolist()
    assert sorted(kept) == [6.0, 7.0, 8.0, 9.0]
    assert kept == [float(p) for p in cache.kept_positions().tolist()]


def test_a_static_cache_is_allocated_once_and_refuses_to_overflow():
    cache = TokenCache(max_length=40)
    cache.append(real(1, 3), k=torch.randn(1, 1, 3, 2))
    entries = cache.entries["k"]
    size = cache.nbytes
    assert size == 40 * (2 * 4 + 1)  # every slot, from the first token on
    for _ in range(37):
        cache.append(real(1, 1), k=torch.randn(1, 1, 1, 2))
    assert cache.entries["k"] is entries and cache.nbytes == size
    with pytest.raises(InvalidInput, match="the cache holds at most 40 tokens"):
        cache.append(real(1, 1), k=torch.randn(1, 1, 1, 2))


def test_a_cache_keeps_the_same_entries_at_every_call():
    cache = TokenCache()
    cache.append(real(1, 1), k=torch.zeros(1, 1, 1, 2), v=torch.zeros(1, 1, 1, 2))
    with pytest.raises(InvalidInput, match=r"keeps \['k', 'v'\]; got \['k'\]"):
        cache.append(real(1, 1), k=torch.zeros(1, 1, 1, 2))


# --- the state's size -----------------------------------------------------------------------
def test_the_state_size_check_finds_a_hidden_tensor():
    _, state = build().prefill(tokens(1, 3))
    assert state.nbytes == held_bytes(state)
    state.hidden = (lambda kept: lambda: kept)(torch.zeros(100))  # in a closure only
    assert held_bytes(state) == state.nbytes + 400
    state.hidden = {torch.zeros(50)}  # in a set, where tensors() does not look
    assert held_bytes(state) == state.nbytes + 200


def test_the_state_size_check_leaves_out_the_model():
    """A state that refers to its module (a bound method, say) does not hold its weights;
    a view of a kept tensor is counted once."""
    module = build()
    _, state = module.prefill(tokens(1, 3))
    size = state.nbytes
    state.project = module.forward
    state.view = state.entries["keys"][:, :1]
    assert held_bytes(state) == state.nbytes == size
