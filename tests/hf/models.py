"""Tiny randomly initialised transformers models, built from configs (never downloaded),
and what the bridge tests compare on them."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

VOCAB = 64
TOLERANCES = {torch.float32: 1e-5, torch.float64: 1e-10}
"""What the bridge must agree with HF to, where the math is the same."""


def llama_config(**changes) -> transformers.LlamaConfig:
    """Two layers, d_model 32, 4 query heads over 2 key/value heads."""
    settings = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    return transformers.LlamaConfig(**{**settings, **changes})


def llama_like(config_class, **changes):
    """A Llama-family config (Mistral, Qwen2) with llama_config's sizes."""
    settings = {k: v for k, v in llama_config().to_dict().items() if k != "model_type"}
    return config_class(**{**settings, **changes})


def gpt2_config(**changes) -> transformers.GPT2Config:
    settings = dict(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=128)
    return transformers.GPT2Config(**{**settings, **changes})


def bert_config(**changes) -> transformers.BertConfig:
    settings = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    return transformers.BertConfig(**{**settings, **changes})


def build(model_class, config, implementation: str, dtype=torch.float32, seed: int = 0):
    """A model of `model_class` with `implementation`, its weights from `seed`; the config
    copied, since transformers writes the implementation into the one it is given."""
    torch.manual_seed(seed)
    model = model_class._from_config(copy.deepcopy(config), attn_implementation=implementation)
    return model.to(dtype).eval()


def tokens(batch: int, n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, n), generator=torch.Generator().manual_seed(seed))


def left_padded(batch_lengths: list[int], n: int) -> torch.Tensor:
    """(B, n) int64 attention mask: sequence b's last batch_lengths[b] tokens real."""
    lengths = torch.tensor(batch_lengths)
    return (torch.arange(n)[None, :] >= (n - lengths)[:, None]).long()


def greedy_by_rerunning(model, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """The greedy continuation from re-running the whole forward on the growing sequence."""
    sequence = prompt
    for _ in range(new_tokens):
        with torch.no_grad():
            following = model(sequence).logits[:, -1].argmax(dim=-1, keepdim=True)
        sequence = torch.cat([sequence, following], dim=1)
    return sequence
