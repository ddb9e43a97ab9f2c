"""A tiny transformers Llama with a variant swapped in, trained, scored and sampled by the
runner as the playground's own model is (`architecture = "hf_llama"`)."""

from __future__ import annotations

import io

import pytest
import torch
from rich.console import Console

from playground.errors import ConfigError
from playground.hf.language_model import LlamaLanguageModel, feed_forward_width
from playground.model.sampling import generate
from playground.model.transformer import ModelConfig
from playground.registry import Registry
from playground.run import runner as runner_module
from playground.run.runner import Runner
from playground.run.spec import SpecError
from playground.run.spec_loading import load_spec
from playground.run.store import RunStore
from tests.hf.models import transformers
from tests.tasks.text_corpus import write_corpus


def config(variant: str = "vanilla", **changes) -> ModelConfig:
    settings = dict(
        vocab_size=64,
        num_classes=64,
        max_seq_len=16,
        variant=variant,
        d_model=32,
        num_heads=4,
        num_layers=2,
        causal=True,
        architecture="hf_llama",
    )
    return ModelConfig(**{**settings, **changes})


def llama(variant: str, registry: Registry, **changes) -> LlamaLanguageModel:
    torch.manual_seed(0)
    return LlamaLanguageModel(config(variant, **changes), registry.get(variant)).eval()


def test_the_feed_forward_is_llamas_swiglu_width():
    """2/3 of 4 · d_model, rounded up to a multiple of 64: 341 -> 384, 256 stays."""
    assert feed_forward_width(128) == 384 and feed_forward_width(96) == 256


def test_it_is_a_llama_with_the_variant_in_every_layer(bundled_registry):
    model = llama("linear", bundled_registry)
    assert isinstance(model.llama, transformers.LlamaForCausalLM)
    assert [type(a).__name__ for a in model.attentions] == ["LinearAttention"] * 2
    assert model.llama.config.intermediate_size == feed_forward_width(32)


def test_forward_gives_logits_at_the_scored_positions(bundled_registry):
    model = llama("vanilla", bundled_registry)
    tokens = torch.randint(0, 64, (2, 10))
    scored = torch.zeros(2, 10, dtype=torch.bool)
    scored[:, 3:] = True
    with torch.no_grad():
        every = model(tokens)
        some = model(tokens, positions=scored)
    assert every.shape == (2, 10, 64)
    assert torch.equal(some, every[scored])


@pytest.mark.parametrize("variant", ["vanilla", "sliding_window", "linear"])
def test_generate_through_hfs_cache_equals_the_full_forward(variant, bundled_registry):
    """The playground's generate() on the Llama: its prefill and decode_step run through
    HF's cache and the variant's state; greedy gives the full forward's tokens."""
    model = llama(variant, bundled_registry)
    prompt = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(1))
    made = generate(model, prompt, 6)
    sequence = prompt
    for _ in range(6):
        with torch.no_grad():
            following = model(sequence)[:, -1].argmax(dim=-1, keepdim=True)
        sequence = torch.cat([sequence, following], dim=1)
    assert torch.equal(made, sequence[:, 5:])


def test_the_architecture_is_a_causal_token_models():
    with pytest.raises(ConfigError, match="causal language model"):
        config(causal=False)
    with pytest.raises(ConfigError, match="one of playground, hf_llama"):
        config(architecture="gpt3")


def spec(tmp_path, architecture: str) -> str:
    corpus = write_corpus(tmp_path / "corpus", files=10, size=3000)
    return f"""
name = "hf_tiny"
measures = ["accuracy"]
accuracy_workers = 1

[[variants]]
name = "vanilla"

[[variants]]
name = "linformer"

[[tasks]]
name = "lm"
corpus = "{corpus}"
seq_len = 16
eval_bytes = 512
sample_bytes = 8
prompt = "the "
steps = 3
batch_size = 4
seeds = 1
d_model = 16
num_heads = 2
num_layers = 1
architecture = "{architecture}"
"""


def test_a_spec_trains_the_llama_into_the_language_rows(tmp_path, bundled_registry, monkeypatch):
    monkeypatch.setattr(runner_module, "gemm_flops_per_second", lambda *a, **k: 1e11)
    path = tmp_path / "spec.toml"
    path.write_text(spec(tmp_path, "hf_llama"))
    loaded = load_spec(str(path), bundled_registry)
    store = RunStore.create(tmp_path / "results", loaded.name)
    runner = Runner(loaded, bundled_registry, store, Console(file=io.StringIO()))
    runner.start()
    assert runner.measure_pending()[1]
    rows = {row["variant"]: row for row in store.rows()}
    vanilla, linformer = rows["vanilla"], rows["linformer"]
    assert vanilla["status"] == "ok" and vanilla["bits_per_byte_mean"] > 0
    assert vanilla["task_label"].endswith("architecture=hf_llama")
    assert vanilla["model"]["architecture"] == "hf_llama"
    assert vanilla["samples"] and all(sample["continuation"] for sample in vanilla["samples"])
    assert linformer["status"] == "unsupported"


def test_a_spec_refuses_an_unknown_architecture(tmp_path, bundled_registry):
    path = tmp_path / "spec.toml"
    path.write_text(spec(tmp_path, "gpt9"))
    with pytest.raises(SpecError, match=r"architecture: 'gpt9' is not one of playground, hf_llama"):
        load_spec(str(path), bundled_registry)
