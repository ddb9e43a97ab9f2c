"""Synthetic tasks for accuracy comparisons (registered through `register_tasks`).

A task is a class with a name, a typed options dataclass and a deterministic generator; a
plugin module registers it like a variant:

    @playground.hookimpl
    def register_tasks(register):
        register(MyTask)

Every task emits integer tokens with 0 reserved for padding, and either one label per
token (`target = "token"`, −100 where nothing is asked), one label per sequence
(`target = "sequence"`), or one label per token read out of the last position alone
(`target = "token_from_last"`, an autoencoder's bottleneck). `split()` gives disjoint
train and test sets from one seed; a task may train on other labels (or other examples)
than it is scored on (`generate_training`).

A task is scored by its `metric`: "accuracy" (the synthetic tasks), or "bits_per_byte" for
a `LanguageTask`: next-byte prediction on real text, where every byte value is a token (no
padding; nothing is padded) and the model is evaluated at its training length and longer.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch

from playground.config import build_config
from playground.errors import ConfigError

TargetName = Literal["token", "sequence", "token_from_last"]
"""What a task labels, and so the head a model reads it with:
- "token": a label per position, predicted from that position's hidden state;
- "sequence": one label per sequence (from position 0 or the mean, the model's pooling);
- "token_from_last": a label per position, every one decoded from the last position's
  hidden state alone plus a fixed encoding of the position asked for, so everything the
  labels need must pass through that one vector (the autoencoder of MAD's compression
  task, Poli et al. 2024, arXiv 2403.17844, §3.1 and mad-lab's mad/model/auto_encoder.py).
"""

IGNORE = -100
"""Label of a position that is not scored (PyTorch's cross-entropy `ignore_index`)."""
PAD = 0
"""Token id of padding in every task."""


@dataclass(frozen=True)
class TaskOptions:
    """Options every task has (none yet); a task's own options derive from this."""


@dataclass(frozen=True)
class TaskData:
    """A batch of examples of one task."""

    tokens: torch.Tensor
    """(num_examples, seq_len) int64, PAD = 0 past each sequence's end."""
    labels: torch.Tensor
    """(num_examples, seq_len) int64 with IGNORE where unscored (per-token tasks), or
    (num_examples,) int64 (sequence tasks)."""
    attention_mask: torch.Tensor | None = None
    """(num_examples, seq_len) bool, True = real token; None when nothing is padded."""

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def select(self, index: torch.Tensor) -> TaskData:
        """The examples at `index` (a long or bool tensor over the first dimension)."""
        mask = None if self.attention_mask is None else self.attention_mask[index]
        return TaskData(self.tokens[index], self.labels[index], mask)


class Task:
    """Base class of a synthetic task. Subclasses set the class attributes and write
    `generate`; `vocab_size`, `num_classes` and `seq_len` may depend on the options."""

    name: ClassVar[str]
    """Registry name, e.g. "mqar"."""
    summary: ClassVar[str]
    """One line: what the task asks."""
    paper: ClassVar[str]
    """Where the task comes from."""
    Options: ClassVar[type[TaskOptions]] = TaskOptions
    target: ClassVar[TargetName] = "token"
    """One label per position ("token"), per sequence ("sequence"), or per position read
    out of the last position alone ("token_from_last"); see TargetName."""
    needs_causal: ClassVar[bool] = False
    """Whether the task must be run with `is_causal=True` (MQAR with causal=True)."""
    pads: ClassVar[bool] = False
    """Whether sequences have different lengths (padding mask passed to attention)."""
    default_steps: ClassVar[int] = 600
    """Optimizer steps at default size (each task's docstring says why)."""
    default_batch_size: ClassVar[int] = 32
    default_learning_rate: ClassVar[float] = 3e-3
    num_train: ClassVar[int] = 8192
    """Training examples generated (sampled in shuffled epochs)."""
    num_test: ClassVar[int] = 1024
    """Held-out examples the accuracy is measured on."""
    metric: ClassVar[Literal["accuracy", "bits_per_byte"]] = "accuracy"
    """What a trained model is scored by (LanguageTask: bits per byte)."""

    def __init__(self, **options: Any) -> None:
        self.options = build_config(self.Options, options, self.name, kind="task")

    # --- what a model needs to know -------------------------------------------------
    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    @property
    def num_classes(self) -> int:
        raise NotImplementedError

    @property
    def seq_len(self) -> int:
        """Length of every generated sequence (padded ones included)."""
        raise NotImplementedError

    @property
    def chance(self) -> float:
        """Accuracy of a uniform guess over the classes a scored position can take."""
        return 1.0 / self.num_classes

    @property
    def label(self) -> str:
        """The task with the options that differ from the defaults, e.g. `mqar(seq_len=128)`."""
        defaults = self.Options()
        changed = {
            f.name: getattr(self.options, f.name)
            for f in dataclasses.fields(self.options)
            if getattr(self.options, f.name) != getattr(defaults, f.name)
        }
        if not changed:
            return self.name
        return f"{self.name}({', '.join(f'{k}={v}' for k, v in changed.items())})"

    def generate(self, num_examples: int, seed: int) -> TaskData:
        """`num_examples` examples, the same for the same seed on every machine."""
        raise NotImplementedError

    def generate_training(self, num_examples: int, seed: int) -> TaskData:
        """Training examples, labelled as the model learns from them. Default: `generate`'s,
        the same format as the held-out set. A task overrides it when training differs
        from scoring: MAD's recall tasks (Poli et al. 2024) train on every next token but
        score only the recalled values, and fuzzy recall trains on keys of every size."""
        return self.generate(num_examples, seed)

    # --- splits -----------------------------------------------------------------
    def split(
        self, seed: int, num_train: int | None = None, num_test: int | None = None
    ) -> tuple[TaskData, TaskData]:
        """Train and test sets for `seed`, with no test or validation input also in train:
        they come from different generator streams (train from `generate_training`, test
        and validation from `generate`) and any train example whose tokens repeat a held-out
        example's is dropped, whatever its labels (so train may be slightly smaller)."""
        num_train = self.num_train if num_train is None else num_train
        num_test = self.num_test if num_test is None else num_test
        test = self.test_split(seed, num_test)
        train = self.generate_training(num_train, seed=2 * seed)
        held_out = (test, self.validation_split(seed, num_test))
        seen = {digest for data in held_out for digest in example_fingerprints(data, labels=False)}
        keep = torch.tensor(
            [f not in seen for f in example_fingerprints(train, labels=False)], dtype=torch.bool
        )
        if not bool(keep.any()):
            raise ConfigError(
                f"task {self.label!r}: every one of its {len(train)} training examples repeats "
                f"an input of the test or validation split ({num_test} examples each), so "
                "nothing is left to train on; the task has too few distinct inputs for "
                "held-out sets this large: lengthen it, widen its vocabulary, or hold out fewer"
            )
        return train.select(keep), test

    def test_split(self, seed: int, num_examples: int | None = None) -> TaskData:
        """The test set of `seed` (num_test examples unless told): stream 2·seed + 1."""
        return self.generate(self.num_test if num_examples is None else num_examples, 2 * seed + 1)

    def at_length(self, length: int) -> Task:
        """This task at sequence length `length`, scaled as the task defines it (MQAR: more
        key-value pairs in proportion), for scoring a model trained at `seq_len` on longer
        inputs (a spec's `eval_lengths`). ConfigError when the task has no such form."""
        raise ConfigError(
            f"task {self.name!r} is scored at its own length only: it does not say how it "
            f"scales to another length (Task.at_length); leave eval_lengths out for it"
        )

    def check_eval_length(self, length: int) -> None:
        """ConfigError when a model of this task cannot be scored at `length`."""
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ConfigError(f"an evaluation length must be a positive integer; got {length!r}")
        self.at_length(length)

    def validation_split(self, seed: int, num_examples: int | None = None) -> TaskData:
        """The validation set of `seed` (num_test examples unless told): a stream of its own
        (VALIDATION_STREAM + seed), so hyperparameters are chosen on examples that are
        neither trained on nor reported (`split` keeps its inputs out of train, and a
        validation example may repeat a test one only by chance, as two test draws may)."""
        count = self.num_test if num_examples is None else num_examples
        return self.generate(count, seed=VALIDATION_STREAM + seed)


VALIDATION_STREAM = 3 << 30
"""The validation set's generator seeds start here: far above the 2·seed (train) and
2·seed + 1 (test) streams of any seed below 10⁹, and below 2³², where torch's and
Python's generators would wrap it onto seed 0's training stream."""


def example_fingerprints(data: TaskData, *, labels: bool = True) -> list[bytes]:
    """One digest per example of its tokens and (with `labels`) its labels: equal
    examples, equal digests. Without labels, equal inputs (a train example labelled for
    training repeats a test input whatever the two sets' labels)."""
    rows = data.labels.reshape(len(data), -1)
    return [
        hashlib.blake2b(
            tokens.numpy().tobytes() + (label.numpy().tobytes() if labels else b""),
            digest_size=16,
        ).digest()
        for tokens, label in zip(data.tokens, rows, strict=True)
    ]


class LanguageTask(Task):
    """Base class of a causal, byte-level language-modelling task: the label at position i
    is the byte at i + 1, every position is scored, and a trained model is scored in bits
    per byte on a fixed held-out set at its training length and at longer ones
    (`held_out(length)`), beside n-gram baselines fitted on the same training split."""

    metric = "bits_per_byte"
    target = "token"
    needs_causal = True

    @property
    def vocab_size(self) -> int:
        return 256

    @property
    def num_classes(self) -> int:
        return 256

    @property
    def fingerprint(self) -> str:
        """The data's identity: scores with different fingerprints are not comparable."""
        raise NotImplementedError

    def describe_data(self) -> dict[str, Any]:
        """What a row says about the data (its fingerprint included)."""
        raise NotImplementedError

    def check_eval_length(self, length: int) -> None:
        """ConfigError when the held-out set cannot be scored at `length`."""
        raise NotImplementedError

    def held_out(self, length: int) -> TaskData:
        """The fixed held-out set cut into windows of `length` bytes (labels: next bytes)."""
        raise NotImplementedError

    def validation(self, length: int) -> TaskData:
        """The validation split in windows of `length` bytes."""
        raise NotImplementedError

    def baselines(self, length: int) -> dict[str, float]:
        """Name -> bits per byte of a model that needs no attention (unigram, bigram),
        fitted on the training split, on the held-out bytes scored at `length`."""
        raise NotImplementedError

    @property
    def prompt(self) -> bytes:
        """Where the continuation shown in a report starts."""
        raise NotImplementedError

    @property
    def sample_bytes(self) -> int:
        """How many bytes of continuation a report shows."""
        raise NotImplementedError

    @property
    def position_bucket(self) -> int:
        """Positions per bucket of the loss by position (`bits_per_byte_by_position`)."""
        return 64

    @property
    def passkey_depths(self) -> tuple[float, ...]:
        """Depths in [0, 1] of the passkey probe's needle in its filler (0: at its start, 1:
        just before the query); () when the task has no probe (the default)."""
        return ()

    def passkey_prompts(self, length: int, depth: float) -> TaskData:
        """The passkey probe at one context length and depth: prompts of exactly `length`
        tokens that hide a key at `depth` of their filler and end by asking for it, labelled
        IGNORE but on the positions that predict the key's bytes (Mohtashami & Jaggi 2023,
        "Landmark Attention", §4.2). A task with `passkey_depths` writes it."""
        raise ConfigError(
            f"task {self.name!r} has no passkey probe: it does not write passkey_prompts, so "
            f"no key can be hidden in its data; probe a task that does"
        )
