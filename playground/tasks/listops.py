"""ListOps: Nangia & Bowman 2018, with the generator semantics of Long Range Arena
(Tay et al. 2021, §3.1 and its `listops` data generator).

An expression nests operators over single digits, `[MAX 2 9 [MIN 4 7 ] 0 ]` = 9:

    MIN, MAX   smallest, largest argument
    MED        median, truncated to an integer (int(median): MED 1 2 = 1)
    SM         sum modulo 10

Trees are grown top-down from depth 1: below `max_depth` a node is a digit with probability
1 − operator_probability (LRA: 0.75) and otherwise an operator with 2 … max_args arguments
(uniform); at max_depth it is always a digit. Expressions whose token count falls outside
[min_length, max_length] are rejected (LRA: 500 … 2000 tokens, depth 10, 10 arguments).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch

import playground
from playground.errors import InvalidInput
from playground.tasks import PAD, Task, TaskData, TaskOptions

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
END = "]"
CLS = "[CLS]"
VOCABULARY = (
    "[PAD]",
    CLS,
    *(str(d) for d in range(10)),
    *OPERATORS,
    END,
)
"""Token ids are positions here: PAD = 0, CLS = 1, digits 2 … 11, operators, END."""
TOKEN_ID = {token: index for index, token in enumerate(VOCABULARY)}


def apply_operator(operator: str, arguments: Sequence[int]) -> int:
    """The value of one operator over its (already evaluated) digit arguments."""
    if operator == "[MIN":
        return min(arguments)
    if operator == "[MAX":
        return max(arguments)
    if operator == "[MED":
        return int(statistics.median(arguments))
    if operator == "[SM":
        return sum(arguments) % 10
    raise InvalidInput(f"unknown ListOps operator {operator!r}; known: {', '.join(OPERATORS)}")


def evaluate(tokens: Sequence[str]) -> int:
    """The value of an expression given as tokens, e.g. "[MAX 2 9 ]".split() -> 9."""
    stack: list[tuple[str, list[int]]] = []
    result: int | None = None
    for token in tokens:
        if token in OPERATORS:
            stack.append((token, []))
            continue
        if token == END:
            if not stack:
                raise InvalidInput(f"unbalanced ']' in {' '.join(tokens)!r}")
            operator, arguments = stack.pop()
            value = apply_operator(operator, arguments)
        elif token.isdigit() and len(token) == 1:
            value = int(token)
        else:
            raise InvalidInput(f"unknown ListOps token {token!r}")
        if stack:
            stack[-1][1].append(value)
        elif result is None:
            result = value
        else:
            raise InvalidInput(f"more than one expression in {' '.join(tokens)!r}")
    if stack or result is None:
        raise InvalidInput(f"incomplete ListOps expression {' '.join(tokens)!r}")
    return result


class _TooLong(Exception):
    """A tree grew past max_length; the sample is rejected (so stop growing it)."""


@dataclass(frozen=True)
class ListOpsOptions(TaskOptions):
    min_length: int = 16
    """Fewest tokens of an expression (LRA: 500)."""
    max_length: int = 64
    """Most tokens of an expression (LRA: 2000); sequences are this plus one [CLS] token."""
    max_depth: int = 10
    """Nesting bound: nodes at this depth are digits (LRA: 10)."""
    max_args: int = 10
    """Most arguments of an operator (LRA: 10); the fewest is 2."""
    operator_probability: float = 0.25
    """Chance a node above max_depth is an operator (LRA: 0.25)."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_length <= self.max_length:
            raise ValueError(
                f"need 1 <= min_length <= max_length; got {self.min_length}, {self.max_length}"
            )
        if self.max_depth < 2:
            raise ValueError(f"max_depth must be at least 2 (one operator); got {self.max_depth}")
        if self.max_args < 2:
            raise ValueError(f"max_args must be at least 2; got {self.max_args}")
        if not 0.0 < self.operator_probability <= 1.0:
            raise ValueError(
                f"operator_probability must be in (0, 1]; got {self.operator_probability}"
            )
        if self.max_length < 4:
            raise ValueError(
                f"max_length must fit one operator with two digits (4 tokens); got "
                f"{self.max_length}"
            )


class ListOps(Task):
    """ListOps (LRA, Tay et al. 2021 §3.1): classify the value 0–9 of a nested expression.

    Input: `[CLS]` then the expression's tokens, padded to max_length + 1 (padding mask
    passed to attention); the model classifies from the [CLS] position, which Longformer
    makes a global token. Ten classes, chance 0.1, though the classes are not balanced
    (the measured majority-class rate is reported next to the accuracy).

    Default size and budget: expressions of 16 … 64 tokens with LRA's depth (10), argument
    (10) and operator (0.25) settings, so the tree statistics are LRA's, cut to lengths a
    CPU trains on (median about 30 tokens); 500 steps of 32 sequences, about 40 s per seed
    on one quiet core for vanilla. LRA's own models stay below 40 % after far longer runs,
    so the budget is sized to separate the variants from the majority-class baseline, not
    to solve the task.
    """

    name = "listops"
    summary = "Value 0–9 of a nested MIN/MAX/MED/SM expression (sequence classification)."
    paper = "Nangia & Bowman 2018; Tay et al. 2021 (Long Range Arena), §3.1"
    Options = ListOpsOptions
    target = "sequence"
    pads = True
    default_steps = 500

    @property
    def vocab_size(self) -> int:
        return len(VOCABULARY)

    @property
    def num_classes(self) -> int:
        return 10

    @property
    def seq_len(self) -> int:
        return self.options.max_length + 1

    def sample_expression(self, rng: random.Random) -> tuple[list[str], int]:
        """One expression within the length bounds and its value (rejection sampling)."""
        options = self.options
        while True:
            tokens: list[str] = []
            try:
                value = self._grow(rng, 1, tokens)
            except _TooLong:
                continue
            if len(tokens) >= options.min_length:
                return tokens, value

    def _grow(self, rng: random.Random, depth: int, tokens: list[str]) -> int:
        """Append one subtree's tokens to `tokens`; return its value."""
        options = self.options
        if len(tokens) >= options.max_length:
            raise _TooLong
        is_operator = depth < options.max_depth and rng.random() < options.operator_probability
        if not is_operator:
            digit = rng.randrange(10)
            tokens.append(str(digit))
            return digit
        operator = rng.choice(OPERATORS)
        tokens.append(operator)
        arguments = [
            self._grow(rng, depth + 1, tokens) for _ in range(rng.randint(2, options.max_args))
        ]
        tokens.append(END)
        if len(tokens) > options.max_length:
            raise _TooLong
        return apply_operator(operator, arguments)

    def generate(self, num_examples: int, seed: int) -> TaskData:
        rng = random.Random(seed)
        length = self.seq_len
        tokens = torch.full((num_examples, length), PAD, dtype=torch.long)  # (N, L)
        labels = torch.empty(num_examples, dtype=torch.long)  # (N,)
        for row in range(num_examples):
            expression, value = self.sample_expression(rng)
            ids = [TOKEN_ID[CLS], *(TOKEN_ID[t] for t in expression)]
            tokens[row, : len(ids)] = torch.tensor(ids)
            labels[row] = value
        return TaskData(tokens, labels, attention_mask=tokens != PAD)


@playground.hookimpl
def register_tasks(register):
    register(ListOps)
