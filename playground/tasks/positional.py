"""A positional task: at every position, name the token a fixed number of places back.

The tokens are drawn independently and uniformly, so the content of a position says
nothing about the answer: only where the other tokens are does. A model solves it by
attending from position i to position i − offset, which relative position information
(T5's bias, Raffel et al. 2020 §2.1; Shaw et al. 2018) expresses in one learned number per
head and distance, and absolute encodings (Vaswani et al. 2017 §3.5) must learn as a
rotation of the sinusoids.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from playground.hookspecs import hookimpl
from playground.tasks import IGNORE, Task, TaskData, TaskOptions


@dataclass(frozen=True)
class LookbackOptions(TaskOptions):
    seq_len: int = 64
    """Tokens per sequence."""
    offset: int = 5
    """How many places back the answer lies: the label at i is the token at i − offset."""
    vocab_size: int = 32
    """Token ids; the tokens are drawn from [1, vocab_size) (0 is padding, never used)."""

    def __post_init__(self) -> None:
        if self.seq_len < 2:
            raise ValueError(
                f"seq_len must be at least 2 (a token and one to name it from); got {self.seq_len}"
            )
        if self.vocab_size < 3:
            raise ValueError(f"vocab_size must be at least 3; got {self.vocab_size}")
        if not 1 <= self.offset < self.seq_len:
            raise ValueError(
                f"offset must be between 1 and seq_len - 1 = {self.seq_len - 1} so some "
                f"positions have an answer; got {self.offset}"
            )


class Lookback(Task):
    """Per-token: the label at position i is the token at i − offset (−100 for i < offset).

    Random tokens make content useless, so the only way is to attend to a fixed relative
    position: the task separates attention that knows relative distances (T5 bias) from
    attention that must reconstruct them from absolute sinusoids, and from attention that
    cannot address single positions (Linformer's k ≪ n slots mix many positions; a sliding
    window reaches the answer only if offset ≤ attention_window / 2).

    Default size and budget: 64 tokens, offset 5, 31 token values (chance 1/31), 300 steps
    of 32 sequences with 59 scored positions each, so the signal per step is dense: enough
    for attention that can address a relative position to learn it, without spending
    minutes on variants that already have (docs/results.md gives the measured accuracies).
    """

    name = "lookback"
    summary = "Name the token `offset` places back (per-token; needs relative position)."
    paper = "positional probe in the spirit of Shaw et al. 2018 / Raffel et al. 2020 §2.1"
    Options = LookbackOptions
    options: LookbackOptions  # built from Options by Task.__init__
    target = "token"
    default_steps = 300

    @property
    def vocab_size(self) -> int:
        return self.options.vocab_size

    @property
    def num_classes(self) -> int:
        return self.options.vocab_size

    @property
    def seq_len(self) -> int:
        return self.options.seq_len

    @property
    def chance(self) -> float:
        return 1.0 / (self.options.vocab_size - 1)

    def generate(self, num_examples: int, seed: int) -> TaskData:
        options = self.options
        generator = torch.Generator().manual_seed(seed)
        shape = (num_examples, options.seq_len)
        tokens = torch.randint(1, options.vocab_size, shape, generator=generator)  # (N, L)
        labels = torch.full(shape, IGNORE, dtype=torch.long)  # (N, L)
        labels[:, options.offset :] = tokens[:, : -options.offset]
        return TaskData(tokens, labels)


@hookimpl
def register_tasks(register: Callable[[type[Task]], None]) -> None:
    register(Lookback)
