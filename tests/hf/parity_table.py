"""The bridge's parity table: model × variant × bridge -> the largest difference from the
model's own attention (HF's sdpa), float32 and float64, unpadded and left-padded; then
the gradients in training mode. The tests (test_kernel.py, test_swap.py) assert the same
comparisons; this prints them.

    python -m tests.hf.parity_table
"""

from __future__ import annotations

import copy

import torch
import transformers as T

import playground.hf
from tests.hf.models import (
    bert_config,
    build,
    gpt2_config,
    left_padded,
    llama_config,
    llama_like,
    tokens,
)


def outputs(model, ids, mask) -> torch.Tensor:
    result = model(ids, attention_mask=mask)
    return result.logits if hasattr(result, "logits") else result.last_hidden_state


def errors(ours, theirs, ids, mask) -> tuple[float, float]:
    with torch.no_grad():
        unpadded = (outputs(ours, ids, None) - outputs(theirs, ids, None)).abs().max()
        padded = (outputs(ours, ids, mask) - outputs(theirs, ids, mask))[mask.bool()]
    return float(unpadded), float(padded.abs().max())


def main() -> None:
    ids, mask = tokens(3, 12), left_padded([12, 7, 2], 12)
    models = {
        "Llama": (T.LlamaForCausalLM, llama_config()),
        "Qwen2": (T.Qwen2ForCausalLM, llama_like(T.Qwen2Config)),
        "Mistral (window 4)": (T.MistralForCausalLM, llama_like(T.MistralConfig, sliding_window=4)),
        "GPT-2": (T.GPT2LMHeadModel, gpt2_config()),
        "BERT": (T.BertModel, bert_config()),
    }
    print("| model | variant | bridge | dtype | unpadded | left-padded |")
    print("| --- | --- | --- | --- | --- | --- |")
    for model_name, (model_class, config) in models.items():
        for dtype in (torch.float32, torch.float64):
            theirs = build(model_class, config, "sdpa", dtype)
            rows = []
            for name in ("vanilla", "gqa") if model_name == "Llama" else ("vanilla",):
                ours = build(model_class, config, playground.hf.register(name), dtype)
                rows.append((name, "kernel", *errors(ours, theirs, ids, mask)))
            if not model_name.startswith("Mistral"):  # a windowed model is refused there
                rotary = model_name in ("Llama", "Qwen2")
                for name in ("rope", "vanilla") if rotary else ("vanilla",):
                    ours = copy.deepcopy(theirs)
                    playground.hf.swap_attention(ours, name)
                    rows.append((name, "module", *errors(ours, theirs, ids, mask)))
            for name, bridge, unpadded, padded in rows:
                kind = str(dtype).removeprefix("torch.")
                print(
                    f"| {model_name} | {name} | {bridge} | {kind} | {unpadded:.1e} | {padded:.1e} |"
                )
    for bridge, name in (("kernel", "vanilla"), ("module", "rope"), ("module", "vanilla")):
        config = llama_config(num_key_value_heads=4)
        theirs = build(T.LlamaForCausalLM, config, "sdpa").train()
        if bridge == "kernel":
            ours = build(T.LlamaForCausalLM, config, playground.hf.register(name)).train()
        else:
            ours = copy.deepcopy(theirs)
            playground.hf.swap_attention(ours, name)
        for model in (theirs, ours):
            model(ids, attention_mask=mask, labels=ids).loss.backward()
        mine = {
            key.replace("self_attn.variant.", "self_attn.").replace("out_proj", "o_proj"): p
            for key, p in ours.named_parameters()
        }
        error = max(
            float((mine[k].grad - p.grad).abs().max()) for k, p in theirs.named_parameters()
        )
        print(f"gradients in training, Llama, {name} at {bridge} level: {error:.1e}")


if __name__ == "__main__":
    main()
