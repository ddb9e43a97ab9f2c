"""MAD's fuzzy in-context recall (Poli et al. 2024, arXiv 2403.17844, §3.1 "Fuzzy in-context
recall"; mad-lab at commit 0f49a45, mad/data/instances.py:186-347,
configs/tasks/fuzzy-in-context-recall.yml).

Keys and values are motifs: runs of 1 … k_motif_size (keys) and 1 … v_motif_size (values)
distinct tokens, keys from the lower half of the non-pad vocabulary and values from the
upper half (instances.py:222-244; MAD draws a motif uniformly from the shuffled list of
all ordered tuples of distinct tokens of its size, which is a uniform draw of distinct
tokens in order, as here). Every pair's key and value sizes are drawn uniformly; a key
keeps the value it was given at its first appearance (:299-308). One probe pair is placed
at a uniformly drawn point of the sequence (:252-281), pairs are added while the sequence
is shorter than L − (probe size) − (k_motif_size + v_motif_size) (:267), the probe pair
closes the sequence (:323-332), and the sequence is padded on the left to L + 1 tokens with
the pad token (:337-341). The input is the first L tokens.

Labels, as MAD gives them (:343-347):
- training: every next token, the pads' included;
- test: every token of a value whose key appeared earlier (each recall and the final
  probe), −100 elsewhere. In training, keys have every size 1 … k_motif_size; in test,
  keys always have k_motif_size tokens (:228-244, :253, :270) and values any size.

Tokens: MAD's pad (V − 1) becomes our PAD 0; every other token t becomes t + 1 (so token V
is unused). Pads are attended like any token, as in MAD (no attention mask).

Deviations from mad-lab:
- MAD's loop may end before it reaches the drawn probe point (about 2 % of test sequences
  at V 16, L 128), and its final query then asks for a key the sequence never showed,
  yet scores it. Such a draw is redrawn here: the distribution is MAD's given that the
  probe's key is in the context.
- MAD's noise branch (:283-291) is not implemented: the benchmark sets no noise for this
  task (fuzzy-in-context-recall.yml; mad/configs.py:37-38).
- The generator is Python's `random.Random(seed)` drawing only `random()` floats (the one
  stream Python keeps the same across versions), in a loop per sequence as MAD's is.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from playground.tasks import IGNORE, PAD, TaskData
from playground.tasks.mad.common import SHIFT, MADTask, RecallOptions, next_token_labels


@dataclass(frozen=True)
class FuzzyInContextRecallOptions(RecallOptions):
    vocab_size: int = 16
    """MAD's V: the pad token, then the V − 1 others split into key and value halves
    (instances.py:222-227; fuzzy-in-context-recall.yml:2; sweep 32, 64, 128)."""
    seq_len: int = 128
    """MAD's L, the input length (fuzzy-in-context-recall.yml:3; sweep 256, 512, 1024)."""
    k_motif_size: int = 3
    """Largest key: keys have 1 … k_motif_size tokens in training, k_motif_size in test
    (fuzzy-in-context-recall.yml:6)."""
    v_motif_size: int = 3
    """Largest value: values have 1 … v_motif_size tokens (fuzzy-in-context-recall.yml:7)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.k_motif_size < 1 or self.v_motif_size < 1:
            raise ValueError("k_motif_size and v_motif_size must be positive integers")
        keys = (self.vocab_size - 1) // 2
        if keys < self.k_motif_size or self.vocab_size - 1 - keys < self.v_motif_size:
            raise ValueError(
                f"vocab_size {self.vocab_size} has {keys} key and {self.vocab_size - 1 - keys} "
                f"value tokens: too few for motifs of {self.k_motif_size} and "
                f"{self.v_motif_size} distinct tokens; raise vocab_size"
            )
        longest = self.k_motif_size + self.v_motif_size
        if self.seq_len < 4 * longest:
            raise ValueError(
                f"seq_len must be at least 4 × (k_motif_size + v_motif_size) = {4 * longest} "
                f"(room for pairs besides the probe); got {self.seq_len}"
            )


class FuzzyInContextRecall(MADTask):
    """MAD's fuzzy in-context recall (module docstring): recall a multi-token value from a
    multi-token key. Trained on every next token with keys of every size, scored on the
    recalled values with keys of the largest size."""

    name = "mad_fuzzy_recall"
    summary = "Recall a multi-token value from a multi-token key (MAD; next-token training)."
    Options = FuzzyInContextRecallOptions
    options: FuzzyInContextRecallOptions
    target = "token"

    @property
    def chance(self) -> float:
        non_pad = self.options.vocab_size - 1
        return 1.0 / (non_pad - non_pad // 2)  # a scored label is a value token

    def generate(self, num_examples: int, seed: int) -> TaskData:
        return self._examples(num_examples, seed, training=False)

    def generate_training(self, num_examples: int, seed: int) -> TaskData:
        """Keys of every size, and every next token a target (instances.py:228-237, :343-345)."""
        return next_token_labels(self._examples(num_examples, seed, training=True))

    def _examples(self, num_examples: int, seed: int, *, training: bool) -> TaskData:
        draw = random.Random(seed)
        rows = [self._sequence(draw, training) for _ in range(num_examples)]
        tokens = torch.tensor([sequence[:-1] for sequence, _ in rows], dtype=torch.long)
        labels = torch.tensor([scored[1:] for _, scored in rows], dtype=torch.long)
        return TaskData(tokens.reshape(num_examples, -1), labels.reshape(num_examples, -1))

    def _sequence(self, draw: random.Random, training: bool) -> tuple[list[int], list[int]]:
        """One sequence of L + 1 tokens (ours: shifted, PAD 0 in front) and its test labels
        (instances.py:252-347), redrawn until the probe's key is in the context."""
        while True:
            drawn = self._attempt(draw, training)
            if drawn is not None:
                return drawn

    def _attempt(self, draw: random.Random, training: bool) -> tuple[list[int], list[int]] | None:
        options = self.options
        length, largest_key = options.seq_len, options.k_motif_size
        num_keys = (options.vocab_size - 1) // 2  # MAD's non-pad tokens, halved (:222-227)
        key_sizes = list(range(1, largest_key + 1)) if training else [largest_key]
        value_sizes = list(range(1, options.v_motif_size + 1))

        def below(n: int) -> int:
            return int(draw.random() * n)

        def motif(low: int, high: int, size: int) -> tuple[int, ...]:
            """`size` distinct tokens of [low, high) in random order (shifted)."""
            pool = list(range(low + SHIFT, high + SHIFT))
            for i in range(size):  # a partial Fisher-Yates shuffle
                j = i + below(len(pool) - i)
                pool[i], pool[j] = pool[j], pool[i]
            return tuple(pool[:size])

        def sizes() -> tuple[int, int]:
            return key_sizes[below(len(key_sizes))], value_sizes[below(len(value_sizes))]

        probe_key_size, probe_value_size = sizes()  # instances.py:253-257
        probe_key = motif(0, num_keys, probe_key_size)
        probe_value = motif(num_keys, options.vocab_size - 1, probe_value_size)
        probe_size = probe_key_size + probe_value_size
        probe_at = below(length - 2 * probe_size)  # instances.py:258
        values: dict[tuple[int, ...], tuple[int, ...]] = {}  # every key seen, with its value
        tokens: list[int] = []
        labels: list[int] = []
        added = False
        while len(tokens) < length - probe_size - (largest_key + options.v_motif_size):
            key_size, value_size = sizes()  # drawn on every pass, as MAD's (:270-271)
            if len(tokens) >= probe_at and not added:
                tokens += probe_key + probe_value
                labels += [IGNORE] * probe_size
                values[probe_key], added = probe_value, True
                continue
            key = motif(0, num_keys, key_size)
            recalled = key in values
            if key == probe_key:
                value, added = probe_value, True
            elif recalled:
                value = values[key]
            else:
                value = motif(num_keys, options.vocab_size - 1, value_size)
            values[key] = value
            tokens += key + value
            labels += [IGNORE] * key_size + (list(value) if recalled else [IGNORE] * len(value))
        if not added:
            return None  # MAD would query a key the context never showed
        tokens += probe_key + probe_value
        labels += [IGNORE] * probe_key_size + list(probe_value)
        padding = length + 1 - len(tokens)
        return [PAD] * padding + tokens, [IGNORE] * padding + labels
