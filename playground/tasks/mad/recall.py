"""MAD's in-context recall and noisy in-context recall (Poli et al. 2024, arXiv 2403.17844,
§3.1 "In-context recall", "Noisy in-context recall"; mad-lab at commit 0f49a45,
mad/data/instances.py:31-181).

A sequence is L/2 − 1 key-value pairs, then a final query pair. Keys are drawn uniformly
with replacement from the lower half of the non-noise vocabulary, and a key's value is
drawn uniformly from the upper half when the key first appears and kept thereafter
(instances.py:63-67, :94-117), so keys repeat within a sequence and several keys may share
a value. The final pair repeats a key already seen, chosen uniformly among the distinct
keys seen (:119-131). The input is the sequence without its last token: L − 1 tokens
(multi-query layout, configs/tasks/in-context-recall.yml:5; :136-140).

Labels, as MAD gives them (:136-140):
- training: every next token (the whole sequence is a language-modelling target);
- test: only the value after a key already seen earlier in the sequence (each recall in
  the sequence and the final query), −100 elsewhere.

Noisy recall (:145-181, configs/tasks/noisy-in-context-recall.yml) turns each pair slot,
independently with probability `frac_noise`, into two tokens drawn uniformly from a noise
vocabulary of `noise_vocab_size` tokens above the keys and values (:64-73, :85-92); noise
is never scored, and in training it is part of the next-token targets.

Deviations from mad-lab, each documented where it is made:
- the generator is torch's, seeded by the split (MAD: one numpy Generator, seed 12345,
  shared by train and test, mad/configs.py:105; the data are the same distribution, not
  the same draws), and a key's value is drawn for every key up front, which is the same
  distribution as drawing it at the key's first appearance;
- the slot kept free of noise is drawn among the L/2 − 1 slots that exist (MAD draws it
  among L/2, :82, so with probability 2/L it names the query slot and guarantees nothing;
  an all-noise sequence then has no key to query and MAD's generator raises).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from playground.config import require_range
from playground.errors import ConfigError
from playground.tasks import IGNORE, TaskData
from playground.tasks.mad.common import SHIFT, MADTask, RecallOptions, next_token_labels


@dataclass(frozen=True)
class InContextRecallOptions(RecallOptions):
    vocab_size: int = 16
    """MAD's V: keys are the lower half of the V − noise_vocab_size non-noise tokens,
    values the upper half (instances.py:63-73; in-context-recall.yml:2; sweep 32, 64,
    128)."""
    seq_len: int = 128
    """MAD's L (even): L/2 − 1 pairs and the query pair; the input is L − 1 tokens
    (in-context-recall.yml:3; sweep 256, 512, 1024)."""
    noise_vocab_size: int = 0
    """Noise tokens, the top of the vocabulary (mad/configs.py:38: none for plain recall)."""
    frac_noise: float = 0.0
    """Probability that a pair slot is noise (mad/configs.py:37: none for plain recall)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.seq_len < 4 or self.seq_len % 2:
            raise ValueError(f"seq_len must be even and at least 4; got {self.seq_len}")
        require_range(self, "frac_noise", 0.0, 1.0)
        if self.noise_vocab_size < 0 or self.vocab_size - self.noise_vocab_size < 2:
            raise ValueError(
                f"vocab_size ({self.vocab_size}) must leave at least 2 non-noise tokens (a key "
                f"and a value) beside noise_vocab_size ({self.noise_vocab_size})"
            )
        if self.frac_noise > 0 and self.noise_vocab_size == 0:
            raise ValueError("frac_noise > 0 needs noise tokens: set noise_vocab_size > 0")


@dataclass(frozen=True)
class NoisyInContextRecallOptions(InContextRecallOptions):
    vocab_size: int = 32
    """MAD's V, noise included (noisy-in-context-recall.yml:2; sweep 48, 80, 144, "adding
    16 for noise vocab")."""
    noise_vocab_size: int = 16
    """Noise tokens, the top of the vocabulary (noisy-in-context-recall.yml:3)."""
    frac_noise: float = 0.2
    """Probability that a pair slot is noise (noisy-in-context-recall.yml:7; sweep 0.4,
    0.6, 0.8)."""


class InContextRecall(MADTask):
    """MAD's in-context recall (module docstring): recall the value paired with a key seen
    earlier in the sequence. Trained on every next token, scored on the recalls."""

    name = "mad_recall"
    summary = "Recall the value a repeated key had earlier (MAD; trains on next tokens)."
    Options = InContextRecallOptions
    options: InContextRecallOptions
    target = "token"

    @property
    def seq_len(self) -> int:
        return self.options.seq_len - 1  # the sequence without its last token

    @property
    def chance(self) -> float:
        non_noise = self.options.vocab_size - self.options.noise_vocab_size
        return 1.0 / (non_noise - non_noise // 2)  # a scored label is one of the values

    def at_length(self, length: int) -> InContextRecall:
        """The task with sequences of `length` + 1 tokens: pairs fill the sequence, so a
        longer one has proportionally more of them (of the same keys and values)."""
        if length % 2 == 0:
            raise ConfigError(
                f"{self.name} sequences hold whole key-value pairs and drop their last token, so "
                f"its lengths are odd ({self.seq_len} here); score at {length - 1} or {length + 1}"
            )
        return type(self)(**{**dataclasses.asdict(self.options), "seq_len": length + 1})

    def generate(self, num_examples: int, seed: int) -> TaskData:
        options, n = self.options, num_examples
        slots = options.seq_len // 2 - 1  # pairs before the query pair
        non_noise = options.vocab_size - options.noise_vocab_size
        num_keys = non_noise // 2
        generator = torch.Generator().manual_seed(seed)
        rows = torch.arange(n)
        keys = torch.randint(0, num_keys, (n, slots), generator=generator)  # (N, S)
        value_of = torch.randint(num_keys, non_noise, (n, num_keys), generator=generator)
        values = value_of.gather(1, keys)  # (N, S)
        real = torch.ones(n, slots, dtype=torch.bool)  # (N, S): a pair, not noise
        pairs = torch.stack([keys, values], dim=-1)  # (N, S, 2)
        if options.frac_noise > 0:
            real = torch.rand(n, slots, generator=generator) >= options.frac_noise
            real[rows, torch.randint(0, slots, (n,), generator=generator)] = True
            noise = torch.randint(non_noise, options.vocab_size, (n, slots, 2), generator=generator)
            pairs = torch.where(real[..., None], pairs, noise)
        # A pair is a recall when a real pair before it has the same key: sort the real
        # keys by (key, slot) and compare each with its predecessor.
        marked = torch.where(real, keys, num_keys)  # noise slots get a key no pair has
        order = (marked * slots + torch.arange(slots)).argsort(dim=1)  # (N, S)
        ordered = marked.gather(1, order)
        repeats = torch.zeros_like(real)
        repeats[:, 1:] = ordered[:, 1:] == ordered[:, :-1]
        recalled = torch.zeros_like(real).scatter(1, order, repeats) & real  # (N, S)
        # The query: uniform among the distinct keys of the real pairs (instances.py:120).
        present = torch.zeros(n, num_keys + 1, dtype=torch.bool).scatter(1, marked, True)
        scores = torch.rand(n, num_keys, generator=generator).masked_fill(
            ~present[:, :num_keys], -1
        )
        query = scores.argmax(dim=1)  # (N,)
        answer = value_of[rows, query]  # (N,)
        tokens = torch.cat([pairs.flatten(1), query[:, None]], dim=1) + SHIFT  # (N, L − 1)
        labels = torch.full((n, 2 * slots + 1), IGNORE, dtype=torch.long)  # (N, L − 1)
        labels[:, 0 : 2 * slots : 2] = torch.where(recalled, values + SHIFT, IGNORE)
        labels[:, -1] = answer + SHIFT  # at the query key: its value, the sequence's last token
        return TaskData(tokens, labels)

    def generate_training(self, num_examples: int, seed: int) -> TaskData:
        """Every next token is a target in training (instances.py:136-138)."""
        return next_token_labels(self.generate(num_examples, seed))


class NoisyInContextRecall(InContextRecall):
    """MAD's noisy in-context recall (module docstring): recall among noise pairs."""

    name = "mad_noisy_recall"
    summary = "Recall the value a repeated key had earlier, among noise (MAD)."
    Options = NoisyInContextRecallOptions
    options: NoisyInContextRecallOptions
    default_steps = 1200  # noise slows the lookup's forming: 800 steps are not enough at L 32
