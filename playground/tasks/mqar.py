"""Multi-query associative recall: Arora et al. 2023, "Zoology: Measuring and Improving
Recall in Efficient Language Models", §3.1.

A sequence lists key-value pairs, then asks for several keys again; the answer at each query
is the value that followed that key. Sizes in Zoology's synthetic study pair the length with
the number of pairs: (64, 4), (128, 8), (256, 16).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from playground.errors import ConfigError
from playground.hookspecs import hookimpl
from playground.tasks import IGNORE, Task, TaskData, TaskOptions


@dataclass(frozen=True)
class MQAROptions(TaskOptions):
    seq_len: int = 64
    """Tokens per sequence (Zoology: 64, 128, 256 with 4, 8, 16 pairs)."""
    num_pairs: int = 4
    """Key-value pairs, each queried once."""
    vocab_size: int = 64
    """Token ids: 0 is the blank filler, keys are [1, V/2), values [V/2, V) (Zoology: 8192;
    64 here so a CPU budget learns the embeddings; enough distinct keys for 31 pairs)."""
    query_placement: Literal["random", "end"] = "random"
    """"random": queries at random positions after the pairs (Zoology's layout, gaps
    blank); "end": all queries in the last num_pairs positions, as far from their keys as
    the length allows (at least seq_len - 3·num_pairs + 1 positions)."""

    causal: bool = True
    """True (the default): Zoology's own setting, causal attention (each position sees only
    what precedes it); variants without causal attention (Linformer, Nyströmformer,
    Performer here) are then `unsupported`. False: every position sees every other, so
    every variant runs; at the CPU budget no variant learns the lookup that way (see the
    class docstring), so it measures whether a variant can see the values, not recall."""

    def __post_init__(self) -> None:
        if self.vocab_size < 4 or self.vocab_size % 2:
            raise ValueError(f"vocab_size must be an even integer >= 4; got {self.vocab_size}")
        keys = self.vocab_size // 2 - 1
        if not 1 <= self.num_pairs <= keys:
            raise ValueError(
                f"num_pairs must be between 1 and the {keys} distinct keys of vocab_size="
                f"{self.vocab_size}; got {self.num_pairs} (raise vocab_size for more pairs)"
            )
        if self.seq_len < 3 * self.num_pairs:
            raise ValueError(
                f"seq_len must hold the pairs and the queries, 3 × num_pairs = "
                f"{3 * self.num_pairs}; got {self.seq_len}"
            )


class MQAR(Task):
    """Multi-query associative recall (Zoology, Arora et al. 2023, §3.1).

    Layout: `k1 v1 k2 v2 … kP vP` at positions 0 … 2P − 1, then each key once more, in a
    random order, at random positions after the pairs (or, with query_placement="end", in
    the last P positions); every other position holds the blank token 0. The label at a
    query is the value that followed its key, and −100 everywhere else. Zoology trains a
    causal model to emit the value as the next token; here the value is never in the input
    at a query, so a bidirectional model cannot copy it from the neighbourhood and must
    look the key up: one attention hop to the key (content), one from the key to the value
    beside it (position). Keys within a sequence are distinct; values may repeat.

    Default size and budget: Zoology's smallest setting, seq_len 64 with 4 pairs, vocabulary
    64 (Zoology: 8192; a small one keeps the embeddings learnable on a CPU budget); 1200
    AdamW steps of 32 sequences drawn from 40 000 generated ones (about one pass, so the
    model cannot memorise its way through). Causal by default, Zoology's own setting: the
    causal mask's recency is what lets the previous-token head form, and with it the
    lookup. In the bidirectional form (`causal=False`) that budget, and much larger ones
    and sweeps of the training recipe, leave every variant guessing among the values
    present: read it as "can the variant see the values", and causal MQAR as recall (docs/results.md
    gives the measurements). (128, 8) and (256, 16) are the options seq_len /
    num_pairs; query_placement="end" puts every query farther from its key than a sliding
    window of a few tokens reaches through a 2-layer stack. Trained on one of the larger
    sizes alone, a model needs many times this budget; Zoology trains one model over the
    sizes, and experiments/mqar.toml does the same with a spec curriculum (small sizes
    first, where the lookup forms, then the larger ones, where it carries over).
    """

    name = "mqar"
    summary = "Recall the value paired with each queried key (per-token)."
    paper = "Arora et al. 2023, Zoology, §3.1 (multi-query associative recall)"
    Options = MQAROptions
    options: MQAROptions  # built from Options by Task.__init__
    target = "token"
    default_steps = 1200
    num_train = 40_000  # about one pass: a smaller pool is memorised, not looked up

    # Task declares needs_causal a ClassVar (a fixed answer, set as a class attribute by
    # task plugins); MQAR's depends on its options, and it is only read from instances.
    @property
    def needs_causal(self) -> bool:  # type: ignore[override]
        return self.options.causal

    @property
    def vocab_size(self) -> int:
        return self.options.vocab_size

    @property
    def num_classes(self) -> int:
        return self.options.vocab_size  # the answer is a value's token id

    @property
    def seq_len(self) -> int:
        return self.options.seq_len

    @property
    def chance(self) -> float:
        return 1.0 / (self.options.vocab_size - self.options.vocab_size // 2)  # one value

    def at_length(self, length: int) -> MQAR:
        """MQAR at `length` with the pairs scaled in proportion (64 with 4 pairs -> 256 with
        16), as Zoology's sizes pair them; the vocabulary stays the trained model's."""
        options = self.options
        pairs = max(1, round(options.num_pairs * length / options.seq_len))
        try:
            return MQAR(**{**dataclasses.asdict(options), "seq_len": length, "num_pairs": pairs})
        except ValueError as error:
            raise ConfigError(
                f"mqar at length {length} needs {pairs} key-value pairs ({options.num_pairs} per "
                f"{options.seq_len} tokens): {error}"
            ) from None

    def generate(self, num_examples: int, seed: int) -> TaskData:
        options = self.options
        n, pairs, length = num_examples, options.num_pairs, options.seq_len
        half = options.vocab_size // 2
        generator = torch.Generator().manual_seed(seed)
        rows = torch.arange(n)[:, None]  # (N, 1)
        # Distinct keys per sequence: the first P of a random permutation of [1, V/2).
        keys = torch.rand(n, half - 1, generator=generator).argsort(dim=1)[:, :pairs] + 1
        values = torch.randint(half, options.vocab_size, (n, pairs), generator=generator)
        tokens = torch.zeros(n, length, dtype=torch.long)  # (N, L), blanks
        tokens[:, 0 : 2 * pairs : 2] = keys
        tokens[:, 1 : 2 * pairs : 2] = values
        order = torch.rand(n, pairs, generator=generator).argsort(dim=1)  # (N, P): query → pair
        if options.query_placement == "end":
            positions = torch.arange(length - pairs, length).expand(n, pairs)  # (N, P)
        else:
            free = length - 2 * pairs
            slots = torch.rand(n, free, generator=generator).argsort(dim=1)[:, :pairs]
            positions = slots + 2 * pairs  # (N, P), distinct positions after the pairs
        labels = torch.full((n, length), IGNORE, dtype=torch.long)  # (N, L)
        tokens[rows, positions] = keys.gather(1, order)
        labels[rows, positions] = values.gather(1, order)
        return TaskData(tokens, labels)


@hookimpl
def register_tasks(register: Callable[[type[Task]], None]) -> None:
    register(MQAR)
