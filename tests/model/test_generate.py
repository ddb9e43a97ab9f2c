"""Generation through the decoding state: a causal model's incremental logits and greedy
tokens equal those of the full forward re-run on the growing sequence."""

from __future__ import annotations

import pytest
import torch

from playground.errors import ConfigError
from playground.model.sampling import continue_bytes, generate
from playground.model.transformer import ModelConfig, TransformerClassifier
from playground.registry import default_registry

VARIANTS = ["vanilla", "rope", "alibi", "sliding_window", "linear", "t5_relative", "gqa"]


def model(variant: str, dtype=torch.float32, **config) -> TransformerClassifier:
    torch.manual_seed(0)
    options = {"window": 4} if variant == "sliding_window" else {}
    settings = {
        "vocab_size": 50,
        "num_classes": 50,
        "max_seq_len": 16,
        "variant": variant,
        "variant_options": options,
        "d_model": 32,
        "num_heads": 4,
        "causal": True,
        **config,
    }
    return TransformerClassifier(ModelConfig(**settings), default_registry()).to(dtype).eval()


def full_forward_greedy(net: TransformerClassifier, prompt: torch.Tensor, n: int) -> list[int]:
    sequence = prompt.clone()
    for _ in range(n):
        with torch.no_grad():
            following = net(sequence)[:, -1].argmax(dim=-1, keepdim=True)
        sequence = torch.cat([sequence, following], dim=1)
    return sequence[0, prompt.shape[1] :].tolist()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("prompt_length", [1, 5])
def test_greedy_tokens_are_those_of_the_full_forward(variant, prompt_length):
    """20 tokens: past the model's 16 positions (sinusoids computed beyond the table)."""
    net = model(variant)
    prompt = torch.randint(0, 50, (1, prompt_length), generator=torch.Generator().manual_seed(2))
    made = generate(net, prompt, 20)[0].tolist()
    assert made == full_forward_greedy(net, prompt, 20)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_each_step_has_the_full_forward_logits(variant, dtype, tolerance):
    net = model(variant, dtype)
    tokens = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = net(tokens)  # (2, 12, 50)
        logits, state = net.prefill(tokens[:, :4])
        steps = [logits] + [net.decode_step(tokens[:, t : t + 1], state) for t in range(4, 12)]
    assert (torch.cat(steps, dim=1) - expected).abs().max() < tolerance


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_padded_batch_generates_what_each_prompt_does_alone(side):
    net = model("rope")  # relative positions: a prompt's tokens do not depend on padding
    prompts = [[3, 14, 15, 9, 2], [6, 5], [35]]
    padded = torch.zeros(3, 5, dtype=torch.long)
    mask = torch.zeros(3, 5, dtype=torch.bool)
    for b, prompt in enumerate(prompts):
        where = slice(5 - len(prompt), 5) if side == "left" else slice(0, len(prompt))
        padded[b, where], mask[b, where] = torch.tensor(prompt), True
    made = generate(net, padded, 8, attention_mask=mask)
    for b, prompt in enumerate(prompts):
        assert made[b].tolist() == generate(net, torch.tensor([prompt]), 8)[0].tolist()


def test_sampling_is_reproducible_and_top_1_is_greedy():
    net, prompt = model("vanilla"), torch.tensor([[1, 2, 3]])
    draws = [
        generate(net, prompt, 10, temperature=1.0, generator=torch.Generator().manual_seed(5))
        for _ in range(2)
    ]
    assert torch.equal(*draws)
    top_1 = generate(net, prompt, 10, temperature=1.0, top_k=1)
    assert torch.equal(top_1, generate(net, prompt, 10))


def test_a_model_that_cannot_decode_says_why():
    with pytest.raises(ConfigError, match="decoding needs a causal model"):
        model("vanilla", causal=False).prefill(torch.tensor([[1, 2]]))
    with pytest.raises(ConfigError, match="prompt must be"):
        generate(model("vanilla"), torch.tensor([1, 2]), 3)


def test_continue_bytes_gives_bytes():
    torch.manual_seed(0)
    config = ModelConfig(256, 256, 16, "vanilla", d_model=32, num_heads=4, causal=True)
    net = TransformerClassifier(config, default_registry()).eval()
    made = continue_bytes(net, b"def ", 6)
    assert isinstance(made, bytes) and len(made) == 6
