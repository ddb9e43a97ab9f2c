"""A swapped model saved with save_pretrained, loaded with from_pretrained and swapped
again: the saved attention weights come back, or the swap is refused saying why."""

from __future__ import annotations

import pytest
import torch

import playground
import playground.hf
from tests.hf.models import bert_config, build, gpt2_config, llama_config, tokens, transformers

SAVED = {
    "vanilla in Llama": (transformers.LlamaForCausalLM, llama_config(), "vanilla", {}),
    "alibi in GPT-2 (a buffer)": (transformers.GPT2LMHeadModel, gpt2_config(), "alibi", {}),
    "vanilla in BERT (its output dense moved)": (
        transformers.BertModel,
        bert_config(),
        "vanilla",
        {},
    ),
    "t5_relative in Llama (a new parameter)": (
        transformers.LlamaForCausalLM,
        llama_config(),
        "t5_relative",
        {},
    ),
    "sliding_window in Llama (an option)": (
        transformers.LlamaForCausalLM,
        llama_config(),
        "sliding_window",
        {"window": 3},
    ),
}


def outputs(model, ids) -> torch.Tensor:
    with torch.no_grad():
        result = model(ids)
    return result.logits if hasattr(result, "logits") else result.last_hidden_state


def trained_and_saved(model_class, config, name, options, directory):
    """A swapped model whose every weight moved (as training moves them), saved."""
    model = build(model_class, config, "sdpa")
    playground.hf.swap_attention(model, name, **options)
    generator = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn(parameter.shape, generator=generator))
    model.save_pretrained(directory)
    return model


@pytest.mark.parametrize(("model_class", "config", "name", "options"), SAVED.values(), ids=SAVED)
def test_from_pretrained_then_swap_attention_gives_the_saved_model(
    model_class, config, name, options, tmp_path
):
    """Before, the swap ported the fresh attention weights from_pretrained had made (the
    logits of vanilla in Llama differed by 6.3 here, BERT's outputs by 3.6); now it loads the saved ones, with
    the options recorded in the config."""
    saved = trained_and_saved(model_class, config, name, options, tmp_path)
    loaded = model_class.from_pretrained(tmp_path).eval()
    report = playground.hf.swap_attention(loaded, name)
    assert report.loaded_from == str(tmp_path)
    assert f"attention weights loaded from {tmp_path}" in str(report)
    ids = tokens(2, 9)
    assert torch.equal(outputs(loaded, ids), outputs(saved, ids))


def test_another_variant_is_refused_naming_the_saved_one(tmp_path):
    trained_and_saved(transformers.LlamaForCausalLM, llama_config(), "vanilla", {}, tmp_path)
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    with pytest.raises(playground.InvalidInput, match=r"saved with 'vanilla' swapped in"):
        playground.hf.swap_attention(loaded, "alibi")


def test_other_options_are_refused_and_the_same_ones_accepted(tmp_path):
    trained_and_saved(
        transformers.LlamaForCausalLM, llama_config(), "sliding_window", {"window": 3}, tmp_path
    )
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    with pytest.raises(playground.InvalidInput, match=r"options \{'window': 3\}, not"):
        playground.hf.swap_attention(loaded, "sliding_window", window=4)
    assert playground.hf.swap_attention(loaded, "sliding_window", window=3).loaded_from


def test_a_checkpoint_that_is_not_a_local_directory_is_refused(tmp_path):
    trained_and_saved(transformers.LlamaForCausalLM, llama_config(), "vanilla", {}, tmp_path)
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path)
    loaded.config._name_or_path = "someone/a-swapped-llama"  # as from the Hub
    with pytest.raises(playground.InvalidInput, match="snapshot_download"):
        playground.hf.swap_attention(loaded, "vanilla")


def test_a_model_built_from_a_swapped_models_config_swaps_as_new():
    """No checkpoint, nothing trained to lose: the record in the config is not a reason
    to refuse."""
    swapped = build(transformers.LlamaForCausalLM, llama_config(), "sdpa")
    playground.hf.swap_attention(swapped, "vanilla")
    fresh = build(transformers.LlamaForCausalLM, swapped.config, "sdpa")
    assert playground.hf.swap_attention(fresh, "alibi").loaded_from == ""
