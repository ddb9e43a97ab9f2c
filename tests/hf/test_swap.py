"""The module-level bridge (playground.hf.swap_attention) inside real transformers models:
exact where the variant computes what the model did, gradients, HF's generate through the
variant's own decoding state, training, and refusals."""

from __future__ import annotations

import copy

import pytest
import torch

import playground
import playground.hf
from playground.hf.swap import SUPPORTED
from playground.hf.swapped import SwappedAttention
from playground.tasks.lm.corpus import load_corpus
from tests.hf.models import (
    TOLERANCES,
    VOCAB,
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

ROTATED_BY_FLOAT32 = 1e-5
"""HF's rotary embedding forms cos and sin in float32 whatever the model's dtype, and rope
in float64 forms them in float64: a float64 model agrees to float32's precision only."""
SAME_MATH = {
    "rope in Llama": (transformers.LlamaForCausalLM, llama_config(), "rope"),
    "vanilla in Llama (its rotation kept)": (
        transformers.LlamaForCausalLM,
        llama_config(),
        "vanilla",
    ),
    "rope in Qwen2 (q, k, v biases)": (
        transformers.Qwen2ForCausalLM,
        llama_like(transformers.Qwen2Config),
        "rope",
    ),
    "vanilla in GPT-2": (transformers.GPT2LMHeadModel, gpt2_config(), "vanilla"),
    "vanilla in BERT": (transformers.BertModel, bert_config(), "vanilla"),
}
"""A swap whose variant computes exactly what the replaced attention did."""


def outputs(model, ids, mask=None) -> torch.Tensor:
    result = model(ids, attention_mask=mask)
    return result.logits if hasattr(result, "logits") else result.last_hidden_state


def swapped(model_class, config, name, dtype=torch.float32, **options):
    """(the model, a copy of it with `name` swapped in, the swap's report)."""
    theirs = build(model_class, config, "sdpa", dtype)
    ours = copy.deepcopy(theirs)
    report = playground.hf.swap_attention(ours, name, **options)
    return theirs, ours, report


@pytest.mark.parametrize("dtype", TOLERANCES, ids=str)
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@pytest.mark.parametrize(("model_class", "config", "name"), SAME_MATH.values(), ids=SAME_MATH)
def test_a_swap_with_ported_weights_gives_the_models_outputs(
    model_class, config, name, dtype, padded
):
    theirs, ours, report = swapped(model_class, config, name, dtype)
    assert report.ported == ["q_proj", "k_proj", "v_proj", "out_proj"] and report.new == []
    assert not any(type(module).__name__ in SUPPORTED.values() for module in ours.modules())
    ids = tokens(3, 12)
    mask = left_padded([12, 7, 2], 12) if padded else None
    with torch.no_grad():
        difference = outputs(ours, ids, mask) - outputs(theirs, ids, mask)
    real = torch.ones(3, 12, dtype=torch.bool) if mask is None else mask.bool()
    tolerance = ROTATED_BY_FLOAT32 if name == "rope" else TOLERANCES[dtype]
    assert difference[real].abs().max() < tolerance
    with torch.no_grad():  # the comparison can fail: a changed weight shows
        next(
            m for m in ours.modules() if isinstance(m, SwappedAttention)
        ).variant.q_proj.weight.mul_(2)
        assert (outputs(ours, ids, mask) - outputs(theirs, ids, mask)).abs().max() > 1e-4


def test_the_report_names_what_was_ported_what_is_new_and_the_positions():
    _, _, report = swapped(transformers.LlamaForCausalLM, llama_config(), "rope")
    assert "turned off for attention: rope encodes positions itself" in str(report)
    _, _, report = swapped(transformers.LlamaForCausalLM, llama_config(), "vanilla")
    assert "rotary positions are kept" in report.positions
    _, _, report = swapped(transformers.LlamaForCausalLM, llama_config(), "t5_relative")
    assert report.new == ["relative_attention_bias.weight"]
    assert "new parameters: relative_attention_bias.weight" in str(report)
    assert report.layers == 2


@pytest.mark.parametrize("name", ["rope", "vanilla"])
def test_training_gradients_equal_the_models(name):
    """Training mode, dropout 0: every gradient of the model's own parameters, and of the
    ported attention weights, equals the unswapped model's (key/value heads not grouped,
    so each ported weight is one of the model's)."""
    config = llama_config(num_key_value_heads=4)
    theirs, ours, _ = swapped(transformers.LlamaForCausalLM, config, name)
    ids, mask = tokens(2, 10), left_padded([10, 6], 10)
    for model in (theirs.train(), ours.train()):
        model(ids, attention_mask=mask, labels=ids).loss.backward()
    mine = dict(ours.named_parameters())
    renamed = {"o_proj": "out_proj"}
    for name_, parameter in theirs.named_parameters():
        key = name_.replace("self_attn.", "self_attn.variant.")
        for old, new in renamed.items():
            key = key.replace(old, new)
        assert (mine[key].grad - parameter.grad).abs().max() < 1e-5, name_


DECODING = {
    "vanilla": {},
    "gqa": {},
    "rope": {},
    "alibi": {},
    "sliding_window": {"window": 3},
    "linear": {},
    "performer": {},
    "longformer": {"attention_window": 4, "impl": "reference"},  # see the refusal below
    "t5_relative": {},
    "differential": {},
}


@pytest.mark.parametrize(("name", "options"), DECODING.items(), ids=DECODING)
def test_hf_generate_uses_the_variants_decoding_state_exactly(name, options):
    """Greedy `generate()` gives the tokens of re-running the whole forward; each layer of
    its cache holds the variant's state, and one number per token of its own."""
    model = build(transformers.LlamaForCausalLM, llama_config(), "sdpa")
    playground.hf.swap_attention(model, name, **options)
    prompt = tokens(2, 5)
    generated = model.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False
    )
    assert torch.equal(generated, greedy_by_rerunning(model, prompt, 8))
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(prompt, cache=cache, use_cache=True)
    assert len(cache.layers) == 2 and cache.get_seq_length() == 5
    states = [layer.state for layer in cache.layers]
    assert all(isinstance(state, playground.decoding.DecodingState) for state in states)


@pytest.mark.parametrize("name", ["vanilla", "alibi"])
def test_a_left_padded_batch_generates_each_sequence_as_alone(name):
    model = build(transformers.LlamaForCausalLM, llama_config(), "sdpa")
    playground.hf.swap_attention(model, name)
    prompt, mask = tokens(2, 6), left_padded([6, 3], 6)
    together = model.generate(prompt, attention_mask=mask, max_new_tokens=5, do_sample=False)
    alone = model.generate(prompt[1:, 3:], max_new_tokens=5, do_sample=False)
    assert torch.equal(together[1, 6:], alone[0, 3:])


BIDIRECTIONAL = {
    "linformer": ({"seq_len": 12, "k": 8}, True, True),
    "performer": ({}, True, False),
    "nystromformer": ({"num_landmarks": 4}, False, False),  # declares no padding mask
}
"""name: (options, padded, whether it can drop attention weights as BERT does)."""


@pytest.mark.parametrize(
    ("name", "options", "padded", "drops"), [(n, *c) for n, c in BIDIRECTIONAL.items()]
)
def test_a_bidirectional_model_takes_variants_without_causal_attention(
    name, options, padded, drops
):
    """BERT is not causal: Linformer, Performer and Nyströmformer swap in and run. BERT's
    attention dropout (0.1) goes to Linformer's option; the other two cannot apply it,
    and the swap says so by a warning rather than drop it silently."""
    model = build(transformers.BertModel, bert_config(), "sdpa")
    if drops:
        report = playground.hf.swap_attention(model, name, **options)
    else:
        with pytest.warns(UserWarning, match=f"not applied by '{name}'"):
            report = playground.hf.swap_attention(model, name, **options)
    ids = tokens(2, 12)
    mask = left_padded([12, 8], 12) if padded else None
    with torch.no_grad():
        hidden = model(ids, attention_mask=mask).last_hidden_state
    assert hidden.shape == (2, 12, 32) and bool(hidden.isfinite().all())
    assert report.layers == 2


@pytest.mark.parametrize("name", ["linear", "sliding_window", "rope"])
def test_a_tiny_llama_trains_with_the_variant_swapped_in(name):
    """A few AdamW steps on bytes of the default corpus (the language-modelling task's):
    the loss falls."""
    config = llama_config(vocab_size=256)
    model = build(transformers.LlamaForCausalLM, config, "sdpa").train()
    playground.hf.swap_attention(model, name, **({"window": 8} if name == "sliding_window" else {}))
    batch = load_corpus().streams["train"][: 8 * 32].long().view(8, 32)
    optimiser = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        loss = model(batch, labels=batch).loss
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0] - 0.5, losses


# --- refusals ------------------------------------------------------------------------------
def test_another_architecture_is_refused_naming_the_supported_ones():
    config = transformers.OPTConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, ffn_dim=64, num_attention_heads=4
    )
    model = build(transformers.OPTForCausalLM, config, "sdpa")
    with pytest.raises(playground.UnsupportedFeature, match="supported: bert, gpt2, llama") as no:
        playground.hf.swap_attention(model, "vanilla")
    # The refusal names the variant asked for, not "variant 'transformers bridge'".
    assert str(no.value).startswith("variant 'vanilla' does not support swapping the attention")


def test_a_causal_model_refuses_a_variant_without_causal_attention():
    model = build(transformers.LlamaForCausalLM, llama_config(), "sdpa")
    with pytest.raises(playground.UnsupportedFeature, match="causal attention"):
        playground.hf.swap_attention(model, "linformer", seq_len=12)


def test_a_sliding_window_model_is_refused_towards_the_kernel_level():
    config = llama_like(transformers.MistralConfig, sliding_window=4)
    model = build(transformers.MistralForCausalLM, config, "sdpa")
    with pytest.raises(playground.UnsupportedFeature, match=r"playground\.hf\.register"):
        playground.hf.swap_attention(model, "vanilla")


def test_a_mask_that_is_not_padding_is_refused_not_dropped():
    """Packed sequences (told apart by position_ids) make a block mask the swapped module
    cannot follow: refused, pointing to the kernel level."""
    model = build(transformers.LlamaForCausalLM, llama_config(), "sdpa")
    playground.hf.swap_attention(model, "vanilla")
    positions = torch.cat([torch.arange(5), torch.arange(7)])[None]
    with pytest.raises(playground.InvalidInput, match=r"playground\.hf\.register"):
        model(tokens(1, 12), position_ids=positions, use_cache=False)


def test_a_right_padded_prompt_is_refused_when_decoding_with_the_models_rotation():
    model = build(transformers.LlamaForCausalLM, llama_config(), "sdpa")
    playground.hf.swap_attention(model, "vanilla")
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, 4:] = 0
    with pytest.raises(playground.InvalidInput, match="padded on the right"):
        model(tokens(2, 6), attention_mask=mask, use_cache=True)


def test_fewer_key_value_heads_than_the_model_start_new_and_keep_the_rotation():
    """gqa with 2 key/value heads in a Llama with 4: its k and v cannot take the model's
    weights (they start new, and the report says so), but its q and k still get the
    model's rotation, and it generates exactly."""
    model = build(transformers.LlamaForCausalLM, llama_config(num_key_value_heads=4), "sdpa")
    report = playground.hf.swap_attention(model, "gqa", num_kv_heads=2)
    assert report.ported == ["q_proj", "out_proj"]
    assert {"k_proj.weight", "v_proj.weight"} <= set(
        report.new
    ) and "rotary positions are kept" in report.positions
    prompt = tokens(2, 5)
    generated = model.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6, do_sample=False
    )
    assert torch.equal(generated, greedy_by_rerunning(model, prompt, 6))


def test_generation_with_a_variant_that_cannot_decode_says_why():
    """A causal variant that declares it cannot decode runs the model's forward (with a
    cache too: the first call is a plain forward), and the first generation step raises
    its reason instead of recomputing silently."""
    from tests.broken_variants import NO_DECODING_HINT, DeclaresNoDecoding

    model = build(transformers.LlamaForCausalLM, llama_config(), "sdpa")
    playground.hf.swap_attention(model, DeclaresNoDecoding)
    prompt = tokens(1, 5)
    with torch.no_grad():
        assert model(prompt).logits.shape == (1, 5, VOCAB)
    with pytest.raises(playground.UnsupportedFeature, match="decoding in this model") as refused:
        model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=3)
    assert NO_DECODING_HINT in str(refused.value)


def test_a_variant_that_bypasses_its_projections_is_refused_where_the_rotation_is_kept():
    """Longformer's fast path reads k_proj's weight (one product for k and v) instead of
    calling it, so the model's rotation, applied to what k_proj returns, missed its keys:
    its logits differed from its reference path's by 2.6e-3, silently. Refused, pointing
    to impl='reference', which calls its projections and is exact (cached or not)."""
    model = build(transformers.LlamaForCausalLM, llama_config(), "sdpa")
    with pytest.raises(playground.UnsupportedFeature, match="without calling q_proj") as refused:
        playground.hf.swap_attention(copy.deepcopy(model), "longformer", attention_window=4)
    assert "its forward computes" in str(refused.value) and "impl='reference'" in str(refused.value)
    playground.hf.swap_attention(model, "longformer", attention_window=4, impl="reference")
    ids = tokens(2, 9)
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        cached = torch.cat(
            [
                model(ids[:, :5], cache=cache, use_cache=True).logits,
                model(ids[:, 5:], cache=cache, use_cache=True).logits,
            ],
            dim=1,
        )
        assert (cached - model(ids, use_cache=False).logits).abs().max() < 1e-5


def test_a_model_swapped_twice_is_refused():
    model = build(transformers.LlamaForCausalLM, llama_config(), "sdpa")
    playground.hf.swap_attention(model, "vanilla")
    with pytest.raises(playground.InvalidInput, match="already swapped"):
        playground.hf.swap_attention(model, "linear")


def test_heads_that_do_not_span_the_width_are_refused_towards_the_kernel_level():
    model = build(transformers.LlamaForCausalLM, llama_config(head_dim=16), "sdpa")
    with pytest.raises(playground.UnsupportedFeature, match=r"do not span its width"):
        playground.hf.swap_attention(model, "vanilla")


def test_a_static_cache_is_refused_with_what_to_do():
    model = build(transformers.LlamaForCausalLM, llama_config(), "sdpa")
    playground.hf.swap_attention(model, "vanilla")
    prompt = tokens(1, 5)
    with pytest.raises(playground.InvalidInput, match="DynamicCache"):
        model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=3,
            cache_implementation="static",
        )
