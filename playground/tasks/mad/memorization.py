"""MAD's memorization (Poli et al. 2024, arXiv 2403.17844, §3.1 "Memorization"; mad-lab at
commit 0f49a45, mad/data/instances.py:352-459, mad/configs.py:83-94,
configs/tasks/memorization.yml).

One fixed map from keys to values serves every sequence, train and test alike: built on
the V − 1 ordinary tokens, keys the lower half and values the upper half, both shuffled
and paired in order, so each key has its own value and one value is left over when V − 1
is odd (instances.py:352-375, called from configs.py:89-94 with the run's seed, 12345). A
sequence is L/2 pairs (key, insert token), keys drawn uniformly with replacement; the
label at each insert token is its key's value, −100 elsewhere, with no shift
(instances.py:430-459). The test measures recall of the memorised map: a key the training
set never showed cannot be answered (at V 8192 with 256 sequences, about a third of them).

Tokens (ours): keys 1 … (V − 1)//2, values above them up to V − 1, insert token V (MAD's
keys 0 …, values, insert V − 1).

The map comes from its own generator seeded with `map_seed`, independent of the split
seed, as MAD's comes from its own generator (instances.py:370); MAD shuffles lists of
tuples with numpy, here torch draws a uniformly random one-to-one map, the same
distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from playground.tasks import IGNORE, TaskData
from playground.tasks.mad.common import SHIFT, MADOptions, MADTask


@dataclass(frozen=True)
class MemorizationOptions(MADOptions):
    vocab_size: int = 256
    """MAD's V: the map's keys and values, and the insert token (instances.py:409-411;
    memorization.yml:2; sweep 512, 1024, 2048, 4096, 8192)."""
    seq_len: int = 32
    """MAD's L (even): L/2 key-insert pairs (memorization.yml:3)."""
    num_train_examples: int = 256
    """Training sequences: 256 × 16 keys, each key shown 32 times on average at V 256
    (memorization.yml:4)."""
    map_seed: int = 12_345
    """Seed of the fixed key-value map, shared by every split (mad/configs.py:69, :93)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.vocab_size < 3:
            raise ValueError("vocab_size must be at least 3 (a key, a value, the insert token)")
        if self.seq_len < 2 or self.seq_len % 2:
            raise ValueError(f"seq_len must be even and at least 2; got {self.seq_len}")


class Memorization(MADTask):
    """MAD's memorization (module docstring): answer each key with its value under one
    fixed map, learnt from the training set (no context can tell it)."""

    name = "mad_memorization"
    summary = "Answer each key with its value under one fixed map, learnt in training (MAD)."
    Options = MemorizationOptions
    options: MemorizationOptions
    target = "token"

    @property
    def num_keys(self) -> int:
        return (self.options.vocab_size - 1) // 2

    @property
    def chance(self) -> float:
        return 1.0 / self.num_keys  # a scored label is one of the map's values

    def value_of(self) -> torch.Tensor:
        """(num_keys,) the fixed map: our key k + SHIFT has value value_of()[k]."""
        generator = torch.Generator().manual_seed(self.options.map_seed)
        num_values = self.options.vocab_size - 1 - self.num_keys
        return torch.randperm(num_values, generator=generator)[: self.num_keys] + (
            self.num_keys + SHIFT
        )

    def generate(self, num_examples: int, seed: int) -> TaskData:
        pairs = self.options.seq_len // 2
        generator = torch.Generator().manual_seed(seed)
        keys = torch.randint(0, self.num_keys, (num_examples, pairs), generator=generator)
        insert = self.options.vocab_size - 1 + SHIFT
        tokens = torch.stack([keys + SHIFT, torch.full_like(keys, insert)], dim=-1)  # (N, P, 2)
        labels = torch.full_like(tokens, IGNORE)
        labels[..., 1] = self.value_of()[keys]  # at the insert token: the key's value
        return TaskData(tokens.flatten(1), labels.flatten(1))  # (N, L) each
