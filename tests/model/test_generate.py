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


def padded(prompts: list[list[int]], side: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts in one batch, (B, longest) tokens and mask, padded on `side`."""
    longest = max(len(prompt) for prompt in prompts)
    tokens = torch.zeros(len(prompts), longest, dtype=torch.long)
    mask = torch.zeros(len(prompts), longest, dtype=torch.bool)
    for b, prompt in enumerate(prompts):
        where = slice(longest - len(prompt), longest) if side == "left" else slice(0, len(prompt))
        tokens[b, where], mask[b, where] = torch.tensor(prompt), True
    return tokens, mask


@torch.no_grad()
def decoded_by_full_forward(
    net: TransformerClassifier, tokens: torch.Tensor, mask: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy tokens (B, n) and the logits they were chosen from (B, n, C), each step a
    full forward over the growing left-padded batch, read at its last position."""
    made, logits = [], []
    for _ in range(n):
        last = net(tokens, mask)[:, -1]  # (B, C)
        following = last.argmax(dim=-1, keepdim=True)  # (B, 1)
        made.append(following)
        logits.append(last)
        tokens = torch.cat([tokens, following], dim=1)
        mask = torch.cat([mask, torch.ones_like(following, dtype=torch.bool)], dim=1)
    return torch.cat(made, dim=1), torch.stack(logits, dim=1)


PROMPTS = [[3, 14, 15, 9, 2], [6, 5], [35]]
"""Three lengths in one batch, one of them a single token."""


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_a_padded_batch_decodes_as_the_full_forward_on_it(variant, side, dtype, tolerance):
    """Every step's logits through the state equal the full forward's on the left-padded
    batch (a right-padded one is decoded as if left-padded), 14 tokens: past the model's
    16 positions; and so do generate()'s tokens where positions are relative (with
    absolute ones generate() decodes each length alone: see the next test)."""
    net = model(variant, dtype)
    expected_tokens, expected_logits = decoded_by_full_forward(net, *padded(PROMPTS, "left"), 14)
    tokens, mask = padded(PROMPTS, side)
    if net.positional_encoding is None:
        assert generate(net, tokens, 14, attention_mask=mask).tolist() == expected_tokens.tolist()
    with torch.no_grad():
        logits, state = net.prefill(tokens, mask)
        last_real = torch.tensor([4, 4, 4] if side == "left" else [4, 1, 0])
        steps = [logits[torch.arange(3), last_real][:, None]]
        steps += [net.decode_step(expected_tokens[:, t : t + 1], state) for t in range(13)]
    assert state.length == 5 + 13
    assert (torch.cat(steps, dim=1) - expected_logits).abs().max() < tolerance


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


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("side", ["left", "right"])
def test_a_padded_batch_generates_what_each_prompt_does_alone(variant, side):
    """Relative positions (rope, alibi, t5_relative) do not depend on the padding; the
    sinusoids of the others would shift a shorter prompt's positions by its padding (13
    of these 24 tokens differed with vanilla), so generate() decodes each length alone."""
    net = model(variant)
    tokens, mask = padded(PROMPTS, side)
    made = generate(net, tokens, 8, attention_mask=mask)
    alone = torch.cat([generate(net, torch.tensor([prompt]), 8) for prompt in PROMPTS])
    assert made.tolist() == alone.tolist()


def test_sampling_a_padded_batch_with_sinusoids_draws_as_each_length_alone():
    """Sampling too: the draws of the prompts of each length generated as a batch, the
    shorter length first, from one generator."""
    net = model("vanilla")
    tokens, mask = padded([[3, 14, 15], [6, 5], [9, 2, 7]], "left")
    made = generate(
        net,
        tokens,
        6,
        attention_mask=mask,
        temperature=1.0,
        generator=torch.Generator().manual_seed(3),
    )
    generator = torch.Generator().manual_seed(3)  # the shorter length first
    two = generate(net, tokens[1:2, 1:], 6, temperature=1.0, generator=generator)
    threes = generate(net, tokens[[0, 2]], 6, temperature=1.0, generator=generator)
    assert made.tolist() == [threes[0].tolist(), two[0].tolist(), threes[1].tolist()]


def test_a_prompt_without_a_real_token_is_refused_under_sinusoids():
    tokens, mask = padded([[3, 14], [6]], "left")
    mask[1] = False
    with pytest.raises(ConfigError, match="sequence 1 of the prompt has no real token"):
        generate(model("vanilla"), tokens, 3, attention_mask=mask)


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
    with pytest.raises(ConfigError, match="target='sequence'"):
        generate(model("vanilla", target="sequence"), torch.tensor([[1, 2]]), 3)
    with pytest.raises(ConfigError, match="prompt must be"):
        generate(model("vanilla"), torch.tensor([1, 2]), 3)


def test_continue_bytes_gives_bytes():
    torch.manual_seed(0)
    config = ModelConfig(256, 256, 16, "vanilla", d_model=32, num_heads=4, causal=True)
    net = TransformerClassifier(config, default_registry()).eval()
    made = continue_bytes(net, b"def ", 6)
    assert isinstance(made, bytes) and len(made) == 6
    assert made == bytes(generate(net, torch.tensor([list(b"def ")]), 6)[0].tolist())


def test_continue_bytes_keeps_the_prompt_within_the_training_length():
    """16 positions, 6 new bytes: the prompt's last 10 bytes are the context."""
    torch.manual_seed(0)
    config = ModelConfig(256, 256, 16, "vanilla", d_model=32, num_heads=4, causal=True)
    net = TransformerClassifier(config, default_registry()).eval()
    prompt = b"    def __init__(self, name):"
    last_ten = torch.tensor([list(prompt[-10:])])
    assert continue_bytes(net, prompt, 6) == bytes(generate(net, last_ten, 6)[0].tolist())
