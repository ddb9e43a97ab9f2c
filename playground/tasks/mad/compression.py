"""MAD's compression (Poli et al. 2024, arXiv 2403.17844, §3.1 "Compression"; mad-lab at
commit 0f49a45, mad/data/instances.py:464-509, configs/tasks/compression.yml,
mad/model/auto_encoder.py).

A sequence is L − 1 tokens drawn uniformly with replacement from the V − 1 ordinary
tokens, then the compression token (instances.py:492-497); the labels are the input itself,
every position scored, the compression token's included (:509). The model is MAD's
autoencoder (auto_encoder.py:53-125, global_pool="last", chosen for this task at
benchmark.py:213 and train.py:78-79): the encoder's state at the last position (the
compression token) is the only thing the decoder sees of the input, and every position is
decoded from it plus a fixed sinusoidal encoding of that position. This task declares it
as its target, "token_from_last" (playground.tasks.TargetName), which the playground's
model honours for any variant.

Tokens (ours): ordinary 1 … V − 1, compression token V (MAD's 0 … V − 2, V − 1).

Not implemented: MAD's noise branch (:500-507), unused by the benchmark, and broken there
(it returns the noisy inputs as their own targets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from playground.tasks import TaskData
from playground.tasks.mad.common import SHIFT, MADOptions, MADTask


@dataclass(frozen=True)
class CompressionOptions(MADOptions):
    vocab_size: int = 16
    """MAD's V: V − 1 ordinary tokens and the compression token (instances.py:492-495;
    compression.yml:2; sweep 32, 64, 128)."""
    seq_len: int = 32
    """MAD's L, the input length, the compression token included (compression.yml:3; sweep
    64, 128, 256)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.vocab_size < 2 or self.seq_len < 2:
            raise ValueError(
                f"vocab_size and seq_len must be at least 2 (a token and the compression "
                f"token); got {self.vocab_size}, {self.seq_len}"
            )


class Compression(MADTask):
    """MAD's compression (module docstring): reproduce the whole input from the model's
    state at its last position alone."""

    name = "mad_compression"
    summary = "Rebuild the input from the last position's state alone (MAD's autoencoder)."
    Options = CompressionOptions
    options: CompressionOptions
    target = "token_from_last"

    @property
    def chance(self) -> float:
        length = self.options.seq_len
        # A uniform guess over the V − 1 ordinary tokens, and the compression token's own
        # position, which is always the compression token.
        return ((length - 1) / (self.options.vocab_size - 1) + 1) / length

    def generate(self, num_examples: int, seed: int) -> TaskData:
        options = self.options
        generator = torch.Generator().manual_seed(seed)
        compress = options.vocab_size - 1 + SHIFT
        shape = (num_examples, options.seq_len - 1)
        content = torch.randint(SHIFT, compress, shape, generator=generator)  # (N, L − 1)
        tokens = torch.cat([content, torch.full((num_examples, 1), compress)], dim=1)  # (N, L)
        return TaskData(tokens, tokens.clone())
