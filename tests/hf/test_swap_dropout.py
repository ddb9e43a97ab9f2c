"""The model's attention dropout in a swapped model: carried into the variant's dropout
option, or through its attention on projected heads, or warned about by name; the swap
report says which."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import playground
import playground.hf
from tests.hf.models import (
    bert_config,
    build,
    gpt2_config,
    left_padded,
    llama_config,
    tokens,
    transformers,
)

P = 0.5
MODELS = {  # the attention's dropout alone: what varies between two calls is its doing
    "GPT-2": (
        transformers.GPT2LMHeadModel,
        gpt2_config(attn_pdrop=P, resid_pdrop=0.0, embd_pdrop=0.0),
    ),
    "BERT": (
        transformers.BertModel,
        bert_config(attention_probs_dropout_prob=P, hidden_dropout_prob=0.0),
    ),
    "Llama": (transformers.LlamaForCausalLM, llama_config(attention_dropout=P)),
}


def outputs(model, ids, mask) -> torch.Tensor:
    result = model(ids, attention_mask=mask)
    return result.logits if hasattr(result, "logits") else result.last_hidden_state


def two_calls(model, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two training-mode calls after one seed, and the real tokens of their batch."""
    ids, mask = tokens(2, 8), left_padded([8, 5], 8)
    model.train()
    torch.manual_seed(seed)
    with torch.no_grad():
        return outputs(model, ids, mask), outputs(model, ids, mask), mask.bool()


@pytest.mark.parametrize(("model_class", "config"), MODELS.values(), ids=MODELS)
def test_the_models_attention_dropout_goes_to_the_variants_option(model_class, config):
    """Training mode, p = 0.5: the unswapped model's outputs vary between calls (GPT-2
    by 0.17, BERT 0.035, Llama 0.24 here); before, the swapped model's did not vary at all.
    Now vanilla drops what HF drops: from one seed, the very same outputs."""
    theirs = build(model_class, config, "sdpa")
    ours = copy.deepcopy(theirs)
    report = playground.hf.swap_attention(ours, "vanilla")
    first, second, real = two_calls(ours)
    assert (first - second)[real].abs().max() > 1e-2
    expected, _, _ = two_calls(theirs)
    assert (first - expected)[real].abs().max() < 1e-5
    assert "attention dropout: 0.5, through the variant's dropout option" in str(report)


def test_a_variant_without_the_option_drops_through_its_heads():
    """rope has no dropout option; its attention runs on projected heads, which takes one:
    in training the swapped module drops there, as Llama does (the same outputs from one
    seed), and gradients reach its weights."""
    model_class, config = MODELS["Llama"]
    theirs = build(model_class, config, "sdpa")
    ours = copy.deepcopy(theirs)
    report = playground.hf.swap_attention(ours, "rope")
    assert "through its attention on projected heads" in str(report)
    first, second, real = two_calls(ours)
    assert (first - second)[real].abs().max() > 1e-2
    assert (first - two_calls(theirs)[0])[real].abs().max() < 1e-5
    ids = tokens(2, 8)
    ours(ids, labels=ids).loss.backward()
    assert all(p.grad is not None for p in ours.parameters() if p.requires_grad)


@pytest.mark.parametrize(("model_class", "config"), MODELS.values(), ids=MODELS)
def test_grouped_key_value_heads_drop_through_their_heads(model_class, config):
    """Found by review: the probe split gqa's keys and values into as many heads as its
    queries, failed on the shapes, and the swap warned, quoting that shape error, that gqa
    could not drop (its outputs varied by 0 in training). Its grouped heads reach
    attend_heads as HF's do, which drops."""
    model = build(model_class, config, "sdpa")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "not applied" warning
        report = playground.hf.swap_attention(model, "gqa")
    assert "through its attention on projected heads" in str(report)
    first, second, real = two_calls(model)
    assert (first - second)[real].abs().max() > 1e-2


def test_alibi_in_gpt2_varies_in_training_and_not_in_eval():
    model = build(*MODELS["GPT-2"], "sdpa")
    playground.hf.swap_attention(model, "alibi")
    first, second, real = two_calls(model)
    assert (first - second)[real].abs().max() > 1e-2
    model.eval()
    ids, mask = tokens(2, 8), left_padded([8, 5], 8)
    with torch.no_grad():
        assert torch.equal(outputs(model, ids, mask), outputs(model, ids, mask))


def test_a_variant_that_cannot_drop_is_warned_about_by_name():
    """linear attention has no dropout option and no attention on heads: the swap warns,
    naming it and the probability, and the report says the dropout is not applied."""
    model = build(*MODELS["Llama"], "sdpa")
    with pytest.warns(UserWarning, match=r"attention dropout \(0\.5\) is not applied by 'linear'"):
        report = playground.hf.swap_attention(model, "linear")
    assert "attention dropout: the model's 0.5 is NOT applied: linear has no dropout" in str(report)


def test_the_users_dropout_option_wins_and_the_report_says_so():
    model = build(*MODELS["GPT-2"], "sdpa")
    report = playground.hf.swap_attention(model, "vanilla", dropout=0.0)
    assert "none (yours; the model's is 0.5)" in str(report)
    first, second, _ = two_calls(model)
    assert torch.equal(first, second)


def test_a_swap_keeps_the_models_eval_mode():
    """The swapped modules are built in training mode, as every new module is; a model
    put in eval mode before the swap stays there (before, a variant's dropout would have
    run in an eval-mode model)."""
    model = build(*MODELS["BERT"], "sdpa")  # eval
    playground.hf.swap_attention(model, "vanilla")
    assert not any(module.training for module in model.modules())


def test_decoding_in_training_mode_through_the_heads_is_refused_with_what_to_do():
    model = build(*MODELS["Llama"], "sdpa").train()
    playground.hf.swap_attention(model, "rope")
    cache = transformers.DynamicCache(config=model.config)
    with torch.no_grad():
        model(tokens(1, 4), cache=cache, use_cache=True)
        with pytest.raises(playground.UnsupportedFeature, match=r"model\.eval\(\)"):
            model(tokens(1, 1), cache=cache, use_cache=True)
