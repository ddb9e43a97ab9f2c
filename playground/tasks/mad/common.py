"""What the six MAD tasks share: their options for the data sizes and causality, the
token shift, and the next-token labels the recall tasks train on.

Sources: Poli et al. 2024, "Mechanistic Design and Scaling of Hybrid Architectures"
(arXiv 2403.17844), §3.1 and Appendix B; mad-lab (github.com/athms/mad-lab, commit
0f49a45), cited as file:line.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from playground.config import require_positive
from playground.tasks import IGNORE, Task, TaskData, TaskOptions

SHIFT = 1
"""MAD's token t is our token t + SHIFT, because token 0 is PAD in every task of this
framework; a task's `vocab_size` option is MAD's V and the model's vocabulary is V + 1."""


@dataclass(frozen=True)
class MADOptions(TaskOptions):
    vocab_size: int = 16
    """MAD's vocabulary V, its special tokens included (mad/configs.py:35); the model's
    is V + 1, for token 0 (PAD)."""
    seq_len: int = 128
    """MAD's sequence length (mad/configs.py:36)."""
    num_train_examples: int = 12_800
    """Training examples, a fixed set sampled in shuffled epochs (mad/configs.py:43; every
    task's yml but memorization's, which has 256). A run generates at most what its steps
    draw (steps × batch size)."""
    num_test_examples: int = 1_280
    """Held-out examples the accuracy is measured on (mad/configs.py:44)."""
    causal: bool = True
    """Causal attention, as every MAD model has (configs/layers/*.yml, e.g.
    mh-attention.yml:2 `causal: true`). The recall tasks train on next tokens and need
    it; selective copying, compression and memorization also run bidirectionally with
    False (then variants without causal attention run too)."""

    def __post_init__(self) -> None:
        require_positive(self, "vocab_size", "seq_len", "num_train_examples", "num_test_examples")


@dataclass(frozen=True)
class RecallOptions(MADOptions):
    """The recall tasks' options: they train on next tokens, so they need causal attention."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.causal:
            raise ValueError(
                "causal must be True: recall trains on next tokens (MAD's setting), which a "
                "model that sees the following position reads off instead of recalling"
            )


class MADTask(Task):
    """Base of the MAD tasks: sizes from the options, the shifted vocabulary, and a CPU
    budget.

    MAD trains 200 epochs of batch 128 with AdamW at a learning rate from {1e-4, 5e-4,
    1e-3} and weight decay from {0, 0.1}, cosine decay to 1e-6 and no warm-up
    (mad/configs.py:51-58, :160-161), on a GPU: about 20 000 steps at the baseline sizes.
    The default here is 800 steps of 32 sequences at the playground's 3e-3, with its
    warm-up, cosine decay to 0 and clipping (playground.model.training): enough for
    softmax attention to form the recall lookup at a length of 32, not at MAD's 128, so a
    spec that shortens the tasks (experiments/mad.toml) keeps this budget and one that
    keeps MAD's lengths gives more steps."""

    paper = "Poli et al. 2024, Mechanistic Design and Scaling of Hybrid Architectures, §3.1"
    options: MADOptions
    default_steps = 800
    default_batch_size = 32
    default_learning_rate = 3e-3

    # Task declares these ClassVars (fixed answers); MAD's depend on the options and are
    # only read from instances.
    @property
    def num_train(self) -> int:  # type: ignore[override]
        return self.options.num_train_examples

    @property
    def num_test(self) -> int:  # type: ignore[override]
        return self.options.num_test_examples

    @property
    def needs_causal(self) -> bool:  # type: ignore[override]
        return self.options.causal

    @property
    def vocab_size(self) -> int:
        return self.options.vocab_size + SHIFT

    @property
    def seq_len(self) -> int:
        return self.options.seq_len

    @property
    def num_classes(self) -> int:
        return self.vocab_size  # the answer is a token


def next_token_labels(data: TaskData) -> TaskData:
    """The same examples labelled with every next token, as MAD trains its recall tasks
    (mad/data/instances.py:136-138, :343-345: inputs seq[:-1], targets seq[1:]). The last
    position's next token is the last token of the final query's value, which the scored
    labels hold there (it is always scored)."""
    if bool((data.labels[:, -1] == IGNORE).any()):
        raise ValueError("the last position of every example must be scored (the final value)")
    labels = torch.cat([data.tokens[:, 1:], data.labels[:, -1:]], dim=1)  # (N, L)
    return TaskData(data.tokens, labels, data.attention_mask)
