"""MAD's selective copying (Poli et al. 2024, arXiv 2403.17844, §3.1 "Selective copying";
mad-lab at commit 0f49a45, mad/data/instances.py:514-600,
configs/tasks/selective-copying.yml).

`num_tokens_to_copy` content tokens are drawn uniformly with replacement from the V − 2
ordinary tokens (instances.py:542-550), and L − 2n − 1 blank tokens are scattered among
them: each blank independently lands in one of the n gaps before a content token,
uniformly (numpy.insert at uniformly drawn indices, :554-557; never after the last
content token). Then come the copy token and n more blanks (:558-560). The label at the
j-th of those trailing blanks is the j-th content token, −100 elsewhere (:562-565): there
is no shift and no teacher forcing, the model emits the whole copy from blanks. Train and
test labels are the same.

Tokens (ours): content 1 … V − 2, blank V − 1, copy V (MAD's 0 … V − 3, V − 2, V − 1).

Deviation: MAD draws the blanks' places from numpy's global generator (`np.random.randint`,
:556, seeded once by train.py), not from the task's generator; here every draw comes from
the split's seeded generator, so a split is reproducible on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from playground.tasks import IGNORE, TaskData
from playground.tasks.mad.common import SHIFT, MADOptions, MADTask


@dataclass(frozen=True)
class SelectiveCopyingOptions(MADOptions):
    vocab_size: int = 16
    """MAD's V: V − 2 content tokens, the blank and the copy token (instances.py:542-545;
    selective-copying.yml:2; sweep 32, 64, 128)."""
    seq_len: int = 256
    """MAD's L, the input length (selective-copying.yml:3; sweep 512, 1024)."""
    num_tokens_to_copy: int = 16
    """Content tokens n, copied after the copy token (selective-copying.yml:4; sweep 32,
    64, 96)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.vocab_size < 3:
            raise ValueError(
                f"vocab_size must be at least 3 (content, blank, copy); got {self.vocab_size}"
            )
        if self.num_tokens_to_copy < 1 or self.seq_len <= 2 * self.num_tokens_to_copy + 1:
            raise ValueError(
                f"seq_len must be more than 2 × num_tokens_to_copy + 1 = "
                f"{2 * self.num_tokens_to_copy + 1} (instances.py:548); got {self.seq_len}"
            )


class SelectiveCopying(MADTask):
    """MAD's selective copying (module docstring): after the copy token, emit the content
    tokens in order, skipping the blanks scattered among them."""

    name = "mad_selective_copy"
    summary = "Copy the non-blank tokens in order after a copy token (MAD)."
    Options = SelectiveCopyingOptions
    options: SelectiveCopyingOptions
    target = "token"

    @property
    def chance(self) -> float:
        return 1.0 / (self.options.vocab_size - 2)  # a scored label is a content token

    def generate(self, num_examples: int, seed: int) -> TaskData:
        options, n = self.options, num_examples
        length, copied = options.seq_len, options.num_tokens_to_copy
        blank, copy = options.vocab_size - 2 + SHIFT, options.vocab_size - 1 + SHIFT
        generator = torch.Generator().manual_seed(seed)
        content = torch.randint(SHIFT, blank, (n, copied), generator=generator)  # (N, n)
        blanks = length - 2 * copied - 1
        gaps = torch.randint(0, copied, (n, blanks), generator=generator)  # gap before content j
        before = torch.zeros(n, copied, dtype=torch.long).scatter_add_(
            1, gaps, torch.ones_like(gaps)
        )  # (N, n): blanks in each gap
        places = before.cumsum(dim=1) + torch.arange(copied)  # (N, n): where content j lands
        tokens = torch.full((n, length), blank, dtype=torch.long)  # (N, L)
        tokens.scatter_(1, places, content)
        tokens[:, length - copied - 1] = copy
        labels = torch.full((n, length), IGNORE, dtype=torch.long)  # (N, L)
        labels[:, length - copied :] = content
        return TaskData(tokens, labels)
