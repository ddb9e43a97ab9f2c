"""The kernel-level bridge (playground.hf.register) inside real transformers models: exact
against HF's own sdpa where the math is the same, causal whatever the mask, every mask form,
refusals that point to the module-level bridge."""

from __future__ import annotations

import sys

import pytest
import torch

import playground
import playground.hf
from playground.hf.kernel import BridgedAttention
from tests.hf.models import (
    TOLERANCES,
    bert_config,
    build,
    gpt2_config,
    greedy_by_rerunning,
    left_padded,
    llama_config,
    llama_like,
    tokens,
    transformers,
)

KERNEL_VARIANTS = {
    "vanilla": {},
    "gqa": {},
    "alibi": {},
    "rope": {},
    "sliding_window": {"window": 3},
}
"""The shipped variants the kernel level takes (their attention is a function of q, k, v)."""


def calls_counted(implementation: str, monkeypatch) -> list[int]:
    """Count the calls of the registered function, so a test knows it ran."""
    function = transformers.AttentionInterface._global_mapping[implementation]
    assert isinstance(function, BridgedAttention)
    calls: list[int] = []
    original = BridgedAttention.__call__

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(BridgedAttention, "__call__", counted)
    return calls


@pytest.mark.parametrize("dtype", TOLERANCES, ids=str)
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
def test_exact_attention_equals_hf_sdpa_in_llama(dtype, padded, monkeypatch):
    """`vanilla` at kernel level is exact attention on Llama's own rotated q, k, v: the
    logits of every real token equal sdpa's (grouped heads, 4 over 2)."""
    implementation = playground.hf.register("vanilla")
    calls = calls_counted(implementation, monkeypatch)
    theirs = build(transformers.LlamaForCausalLM, llama_config(), "sdpa", dtype)
    ours = build(transformers.LlamaForCausalLM, llama_config(), implementation, dtype)
    ids = tokens(3, 12)
    mask = left_padded([12, 8, 1], 12) if padded else None
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask).logits
        got = ours(ids, attention_mask=mask).logits
    real = torch.ones(3, 12, dtype=torch.bool) if mask is None else mask.bool()
    assert (got - expected)[real].abs().max() < TOLERANCES[dtype]
    assert len(calls) == 2  # one per layer: the bridge ran, not sdpa


@pytest.mark.parametrize(
    ("model_class", "config"),
    [
        (transformers.GPT2LMHeadModel, gpt2_config()),
        (transformers.BertModel, bert_config()),
    ],
    ids=["gpt2", "bert"],
)
def test_exact_attention_equals_hf_sdpa_in_gpt2_and_bert(model_class, config, monkeypatch):
    """Causal (GPT-2) and bidirectional (BERT) masks, padded, reach the bridge whole."""
    implementation = playground.hf.register("vanilla")
    calls = calls_counted(implementation, monkeypatch)
    theirs = build(model_class, config, "sdpa")
    ours = build(model_class, config, implementation)
    ids, mask = tokens(2, 10), left_padded([10, 6], 10)
    with torch.no_grad():
        expected = theirs(ids, attention_mask=mask)
        got = ours(ids, attention_mask=mask)
    field = "logits" if hasattr(expected, "logits") else "last_hidden_state"
    difference = getattr(got, field) - getattr(expected, field)
    assert difference[mask.bool()].abs().max() < 1e-5
    assert calls


def test_training_gradients_equal_hf_sdpa():
    """In training mode (attention dropout 0), every weight's gradient equals sdpa's."""
    implementation = playground.hf.register("vanilla")
    theirs = build(transformers.LlamaForCausalLM, llama_config(), "sdpa").train()
    ours = build(transformers.LlamaForCausalLM, llama_config(), implementation).train()
    ids, mask = tokens(2, 10), left_padded([10, 7], 10)
    for model in (theirs, ours):
        model(ids, attention_mask=mask, labels=ids).loss.backward()
    for (name, mine), (_, reference) in zip(
        ours.named_parameters(), theirs.named_parameters(), strict=True
    ):
        assert (mine.grad - reference.grad).abs().max() < 1e-5, name


def future_leak(model, ids: torch.Tensor, cut: int, mask=None) -> tuple[float, float]:
    """How far the logits before `cut`, and those from `cut` on, move when every token from
    `cut` on changes."""
    changed = ids.clone()
    changed[:, cut:] = (ids[:, cut:] + 1 + torch.arange(ids.shape[1] - cut)) % ids.max()
    with torch.no_grad():
        moved = model(ids, attention_mask=mask).logits - model(changed, attention_mask=mask).logits
    return float(moved[:, :cut].abs().max()), float(moved[:, cut:].abs().max())


@pytest.mark.parametrize(("name", "options"), KERNEL_VARIANTS.items(), ids=KERNEL_VARIANTS)
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
def test_a_bridged_model_never_sees_its_future(name, options, padded):
    """Perturb the tokens after a cut: no logit before it moves (and after it they do, so
    the perturbation reaches the model)."""
    implementation = playground.hf.register(name, **options)
    model = build(transformers.LlamaForCausalLM, llama_config(), implementation)
    ids = tokens(2, 16)
    mask = left_padded([16, 11], 16) if padded else None
    before, after = future_leak(model, ids, 8, mask)
    assert before == 0.0 and after > 1e-3


def test_an_attention_function_without_its_mask_function_leaks_the_future():
    """The trap the bridge avoids (transformers #46132): the same function registered
    without a mask function gets no mask, and the future leaks. So the test above can
    fail."""
    function = BridgedAttention(playground.get_variant("vanilla"), {})
    transformers.AttentionInterface.register("playground-test:no-mask", function)
    model = build(transformers.LlamaForCausalLM, llama_config(), "playground-test:no-mask")
    model.model.layers[0].self_attn.is_causal = False  # what a bidirectional caller sets
    model.model.layers[1].self_attn.is_causal = False
    assert future_leak(model, tokens(2, 16), 8)[0] > 1e-3


def test_every_mask_form_reaches_the_variant():
    """A float mask from HF's eager mask function, a boolean 4-D mask, and no mask with
    is_causal give the same outputs at the real tokens; a float mask carrying a bias is
    refused, not dropped."""
    function = BridgedAttention(playground.get_variant("alibi"), {})
    module = torch.nn.Module().eval()
    q, k, v = (
        torch.randn(2, 4, 6, 8, generator=torch.Generator().manual_seed(s)) for s in range(3)
    )
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    allowed = causal[None, None].repeat(2, 1, 1, 1)
    allowed[1, :, :, :2] = False  # sequence 1 left-padded by 2
    additive = torch.zeros(2, 1, 6, 6).masked_fill(~allowed, torch.finfo(torch.float32).min)
    padding = torch.ones(2, 6, dtype=torch.bool)
    padding[1, :2] = False
    outputs = [
        function(module, q, k, v, mask, is_causal=True)[0] for mask in (allowed, additive, padding)
    ]
    for other in outputs[1:]:
        assert (other - outputs[0])[:, 2:].abs().max() < 1e-6
    unpadded = function(module, q, k, v, None, is_causal=True)[0]
    assert (unpadded[0] - outputs[0][0]).abs().max() < 1e-6
    with pytest.raises(playground.InvalidInput, match="bias"):
        function(module, q, k, v, additive + 0.5 * allowed, is_causal=True)


def test_a_sliding_window_model_passes_its_window_through_the_mask():
    """Mistral with a sliding window of 4: the bridged exact attention equals sdpa, and
    differs from the same weights without the window, so the window reached it."""
    windowed = llama_like(transformers.MistralConfig, sliding_window=4)
    unwindowed = llama_like(transformers.MistralConfig, sliding_window=None)
    implementation = playground.hf.register("vanilla")
    ids = tokens(2, 12)
    with torch.no_grad():
        expected = build(transformers.MistralForCausalLM, windowed, "sdpa")(ids).logits
        got = build(transformers.MistralForCausalLM, windowed, implementation)(ids).logits
        full = build(transformers.MistralForCausalLM, unwindowed, implementation)(ids).logits
    assert (got - expected).abs().max() < 1e-5
    assert (got - full).abs().max() > 1e-3


def test_packed_sequences_attend_only_within_their_own():
    """Two sequences packed in one row, told apart by position_ids, give each one's logits
    alone: the mask HF builds from the positions reaches the bridge."""
    implementation = playground.hf.register("alibi")
    model = build(transformers.LlamaForCausalLM, llama_config(), implementation)
    first, second = tokens(1, 5), tokens(1, 7, seed=2)
    packed = torch.cat([first, second], dim=1)
    positions = torch.cat([torch.arange(5), torch.arange(7)])[None]
    with torch.no_grad():
        together = model(packed, position_ids=positions, use_cache=False).logits
        alone = torch.cat([model(first).logits, model(second).logits], dim=1)
    assert (together - alone).abs().max() < 1e-5


@pytest.mark.parametrize("name", ["alibi", "sliding_window"])
def test_greedy_generation_equals_rerunning_the_forward(name):
    implementation = playground.hf.register(name, **KERNEL_VARIANTS[name])
    model = build(transformers.LlamaForCausalLM, llama_config(), implementation)
    prompt = tokens(2, 5)
    generated = model.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False
    )
    assert torch.equal(generated, greedy_by_rerunning(model, prompt, 8))


@pytest.mark.parametrize(
    ("name", "options", "words"),
    [
        ("performer", {}, "owns its projections"),
        ("linformer", {}, "owns its projections"),
        ("gated", {}, "context_mod"),
        ("alibi", {"learnable_slopes": True}, "learns slopes"),
    ],
)
def test_what_cannot_work_at_kernel_level_is_refused_towards_swap_attention(name, options, words):
    with pytest.raises(playground.UnsupportedFeature, match=words) as refused:
        playground.hf.register(name, **options)
    assert "playground.hf.swap_attention" in str(refused.value)


def test_without_transformers_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(playground.PlaygroundError, match=r"attention-playground\[hf\]"):
        playground.hf.register("vanilla")


@pytest.mark.parametrize(
    ("name", "kernel", "families"),
    [
        ("alibi", "yes", "llama, mistral, qwen2, gpt2, bert; generate()"),
        ("performer", "no: its attention is not a function", "llama, mistral"),
        ("linformer", "no: its attention is not a function", ": bert"),
    ],
)
def test_playground_info_says_which_bridges_a_variant_supports(name, kernel, families, capsys):
    from playground.cli import main

    assert main(["info", name]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "kernel level" in out and kernel in out and families in out


@pytest.mark.parametrize("name", ["alibi", "rope"])
def test_a_static_cache_decodes_at_the_right_positions(name):
    """A StaticCache hands the function every preallocated slot, the unwritten ones
    masked: the queries' positions come from the mask, so a position-dependent mod gives
    the logits of the forward without a cache, for the prompt and for each next token."""
    implementation = playground.hf.register(name)
    model = build(transformers.LlamaForCausalLM, llama_config(), implementation)
    ids = tokens(2, 8)
    cache = transformers.StaticCache(config=model.config, max_cache_len=16)
    with torch.no_grad():
        expected = model(ids).logits
        prompt = model(ids[:, :5], cache=cache, use_cache=True).logits
        steps = [model(ids[:, t : t + 1], cache=cache, use_cache=True).logits for t in range(5, 8)]
    got = torch.cat([prompt, *steps], dim=1)
    assert (got - expected).abs().max() < 1e-5


@pytest.mark.parametrize("name", ["vanilla", "alibi", "rope"])
def test_a_static_cache_takes_a_batch_whose_every_row_ends_in_padding(name):
    """The last query of such a batch is padding and does not see its own slot, which the
    queries' positions were read from: alibi and rope raised a shape error (vanilla, which
    reads no position, and a DynamicCache worked). Every real token's logits are the
    forward's without a cache, and the next token's too."""
    implementation = playground.hf.register(name)
    model = build(transformers.LlamaForCausalLM, llama_config(), implementation)
    ids = tokens(2, 9)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[0, 6:8], mask[1, 7:8] = 0, 0  # the prompt, ids[:, :8], ends in padding in both rows
    cache = transformers.StaticCache(config=model.config, max_cache_len=16)
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
        prompt = model(ids[:, :8], attention_mask=mask[:, :8], cache=cache, use_cache=True)
        step = model(ids[:, 8:], attention_mask=mask, cache=cache, use_cache=True).logits
    real = mask[:, :8].bool()
    assert (prompt.logits - expected[:, :8])[real].abs().max() < 1e-5
    assert (step - expected[:, 8:]).abs().max() < 1e-5
