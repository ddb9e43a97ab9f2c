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

import functools
import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from playground.errors import InvalidInput
from playground.hookspecs import hookimpl
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
        # Options can pass every check above and still admit no expression (or almost
        # none) of an accepted length; rejection sampling would then loop forever.
        problem = _length_problem(self)
        if problem:
            raise ValueError(problem)


MIN_ACCEPTANCE = 1e-4
"""Least share of grown trees whose length is accepted: below it each expression takes
more than 10,000 draws, which is a stalled run rather than a slow one."""


def _effective_depth(options: ListOpsOptions) -> int:
    """The depth bound that gives the same accepted expressions as max_depth: an operator
    at depth r below the root brings at least 3r + 4 tokens (its own four and an operator,
    `]` and a sibling at each level above), so deeper ones never fit max_length."""
    return min(options.max_depth, options.max_length // 3 + 2)


def possible_lengths(options: ListOpsOptions) -> list[int]:
    """Every token count up to max_length that some expression has, exactly (sets of
    lengths as bit masks, grown from the depth bound up)."""
    cap = (1 << (options.max_length + 1)) - 1
    leaf = 1 << 1  # a digit: one token
    lengths = leaf
    for _ in range(_effective_depth(options) - 1):
        power, children = lengths, 0
        for _ in range(2, options.max_args + 1):  # 2 … max_args children, lengths added
            grown, rest = 0, lengths
            while rest:
                lowest = rest & -rest
                grown |= power << (lowest.bit_length() - 1)
                rest ^= lowest
            power = grown & cap
            children |= power
        operator = (children << 2) & cap  # the operator's token and its "]"
        lengths = operator | (leaf if options.operator_probability < 1 else 0)
    return [n for n in range(options.max_length + 1) if lengths >> n & 1]


@functools.lru_cache(maxsize=64)
def acceptance_rate(options: ListOpsOptions) -> float:
    """The probability that a grown tree has between min_length and max_length tokens: the
    distribution of a subtree's length, truncated at max_length, computed from the depth
    bound up (sums of children's lengths as convolutions, by FFT)."""
    size, fft_size = options.max_length + 1, 2 * (options.max_length + 1)
    leaf = torch.zeros(size, dtype=torch.float64)
    leaf[1] = 1.0
    distribution = leaf
    for _ in range(_effective_depth(options) - 1):
        spectrum = torch.fft.rfft(distribution, fft_size)
        power, children = distribution, torch.zeros(size, dtype=torch.float64)
        for _ in range(2, options.max_args + 1):
            power = torch.fft.irfft(torch.fft.rfft(power, fft_size) * spectrum, fft_size)
            power = power[:size].clamp(min=0.0)  # FFT rounding can dip below zero
            children += power
        operator = torch.zeros(size, dtype=torch.float64)
        operator[2:] = children[:-2] / (options.max_args - 1)  # uniform argument count
        p = options.operator_probability
        distribution = (1 - p) * leaf + p * operator
    return float(distribution[options.min_length :].sum().clamp(max=1.0))


def _length_problem(options: ListOpsOptions) -> str | None:
    """Why no expression (or almost none) of the accepted lengths can be grown; None when
    sampling them is practical."""
    bounds = f"between min_length = {options.min_length} and max_length = {options.max_length}"
    knobs = (
        f"max_depth = {options.max_depth}, max_args = {options.max_args} and "
        f"operator_probability = {options.operator_probability}"
    )
    lengths = possible_lengths(options)
    if not any(options.min_length <= n for n in lengths):
        if not lengths:
            # A full binary tree; the formula rather than its value for a deep bound.
            shortest = (
                f"{3 * 2 ** (options.max_depth - 1) - 2}"
                if options.max_depth <= 40
                else "3·2^(max_depth − 1) − 2"
            )
            found = (
                f"with operator_probability = 1 every node above max_depth is an operator, "
                f"so the shortest expression has {shortest} tokens"
            )
        else:
            found = f"the longest possible up to max_length has {lengths[-1]} tokens"
        return (
            f"no ListOps expression has {bounds} tokens with {knobs}: {found}; widen the "
            f"length range, or change max_depth, max_args or operator_probability"
        )
    rate = acceptance_rate(options)
    if rate < MIN_ACCEPTANCE:
        return (
            f"only a share {rate:.1e} of ListOps expressions grown with {knobs} has {bounds} "
            f"tokens, so each example would take about {1 / max(rate, 1e-300):,.0f} draws; "
            f"widen the length range, or change operator_probability or max_args so "
            f"expressions of that length are common"
        )
    return None


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
    options: ListOpsOptions  # built from Options by Task.__init__
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
        """One expression within the length bounds and its value (rejection sampling).

        The options were checked to accept at least MIN_ACCEPTANCE of the grown trees; the
        attempts are still bounded (at 40 times the expected number, which valid options
        exceed with probability about e^-40) so that no input can make this loop forever."""
        options = self.options
        attempts = math.ceil(40 / max(acceptance_rate(options), MIN_ACCEPTANCE))
        for _ in range(attempts):
            tokens: list[str] = []
            try:
                value = self._grow(rng, 1, tokens)
            except _TooLong:
                continue
            if len(tokens) >= options.min_length:
                return tokens, value
        raise InvalidInput(
            f"no ListOps expression of {options.min_length} … {options.max_length} tokens "
            f"in {attempts} draws with {self.label}'s options; widen the length range"
        )

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


@hookimpl
def register_tasks(register: Callable[[type[Task]], None]) -> None:
    register(ListOps)
