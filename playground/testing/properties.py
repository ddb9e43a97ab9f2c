"""A property-based search for contract breaks, with hypothesis.

The named checks look where bugs usually are (short lengths, special sizes, both modes,
every mask combination). This search looks everywhere else, drawing the batch size,
query and key lengths, a mask pattern per element, causal masking, the dtype and the
mode, and asserting the core promises on each draw (shape and dtype, finiteness, batch
independence, padding invariance, causality, zero output for queries that see nothing).

It is derandomized (the same draws every run, so CI is reproducible) and budgeted by
`max_examples`; a failure is shrunk by hypothesis to a small example and reported with
its draw. Third parties call it directly:

    from playground.testing import property_search
    property_search("my_variant", max_examples=200)      # raises CheckFailed on a break
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from hypothesis import HealthCheck, Verbosity, given, settings
from hypothesis import strategies as st

from playground.testing.corners import (
    CheckFailed,
    assert_batch_independent,
    assert_causal,
    assert_padding_invariant,
)
from playground.testing.subject import MODES, Mode, Subject, resolve_variant

if TYPE_CHECKING:
    from playground.contract import AttentionVariant

SUITE_EXAMPLES = 40
"""Draws per impl in the contract suite (`check_property_search`): a budget that keeps
`playground check` quick; call `property_search` for a longer search."""


@dataclass(frozen=True)
class Draw:
    """One drawn case: what the search found a break with."""

    batch: int
    n_q: int
    n_k: int
    cross: bool
    causal: bool
    mask: tuple[tuple[bool, ...], ...] | None
    dtype: torch.dtype
    mode: Mode

    def __str__(self) -> str:
        mask = (
            None
            if self.mask is None
            else ["".join("1" if k else "0" for k in row) for row in self.mask]
        )
        return (
            f"batch={self.batch}, n_q={self.n_q}, n_k={self.n_k}, cross={self.cross}, "
            f"causal={self.causal}, mask={mask}, dtype={self.dtype}, mode={self.mode}"
        )


def _longest(subject: Subject) -> int:
    """Lengths reach past every special size (and 20), within max_seq_len."""
    longest = max(20, *(n + 2 for n in subject.lengths if n < 128))
    if subject.caps.max_seq_len is not None:
        longest = min(longest, subject.caps.max_seq_len)
    return longest


def _strategy(subject: Subject) -> Any:
    caps, longest = subject.caps, _longest(subject)

    @st.composite
    def draws(draw: Any) -> Draw:
        batch = draw(st.integers(1, 4))
        cross = caps.cross_attention and draw(st.integers(0, 3)) == 0  # a quarter
        n_q = draw(st.integers(1, longest))
        n_k = draw(st.integers(1, longest)) if cross else n_q
        causal = caps.causal and draw(st.booleans())
        mask = None
        if caps.padding_mask and draw(st.booleans()):
            row = st.tuples(*[st.booleans()] * n_k)
            mask = tuple(draw(st.lists(row, min_size=batch, max_size=batch)))
        dtype = draw(st.sampled_from(caps.dtypes))
        mode = draw(st.sampled_from(MODES))
        return Draw(batch, n_q, n_k, cross, causal, mask, dtype, mode)

    return draws()


def _assert_promises(subject: Subject, draw: Draw) -> None:
    module = subject.build(dtype=draw.dtype, mode=draw.mode)
    query = subject.tokens(draw.n_q, batch=draw.batch, dtype=draw.dtype)
    case: dict[str, Any] = {}
    if draw.causal:
        case["is_causal"] = True
    if draw.mask is not None:
        case["attention_mask"] = torch.tensor(draw.mask, dtype=torch.bool)
    if draw.cross:
        memory = subject.tokens(draw.n_k, batch=draw.batch, seed=2, dtype=draw.dtype)
        with torch.no_grad() if draw.mode == "eval" else torch.enable_grad():
            output = module(query, memory, memory, **case).output
        _assert_well_formed(output, (draw.batch, draw.n_q, subject.d_model), draw.dtype)
        if draw.causal and draw.n_q == draw.n_k:
            inputs = {"query": query, "key": memory, "value": memory.flip(1)}
            assert_causal(module, inputs, case, draw.mode, gradients=False)
        return
    with torch.no_grad() if draw.mode == "eval" else torch.enable_grad():
        output = module(query, **case).output
    _assert_well_formed(output, (draw.batch, draw.n_q, subject.d_model), draw.dtype)
    _assert_empty_rows(output, case, draw.n_q)
    assert_batch_independent(module, query, case, draw.mode)
    if draw.mask is not None:
        assert_padding_invariant(module, query, case, draw.mode)
    if draw.causal:
        assert_causal(module, {"query": query}, case, draw.mode, gradients=False)


def _assert_well_formed(output: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    if tuple(output.shape) != shape or output.dtype != dtype:
        raise CheckFailed(
            f"output is {tuple(output.shape)} {output.dtype}; expected {shape} {dtype}"
        )
    if not torch.isfinite(output).all():
        raise CheckFailed("output has NaN or inf")


def _assert_empty_rows(output: torch.Tensor, case: dict[str, Any], n_q: int) -> None:
    mask = case.get("attention_mask")
    if mask is None:
        return
    sees = (
        mask.cumsum(dim=-1).bool()
        if case.get("is_causal")
        else mask.any(dim=-1, keepdim=True).expand(-1, n_q)
    )
    empty = output[~sees]
    if empty.numel() and empty.abs().max() != 0:
        raise CheckFailed(f"queries that see no key output {empty.abs().max().item():.3g}, not 0")


def check_property_search(subject: Subject, max_examples: int = SUITE_EXAMPLES) -> None:
    """A derandomized hypothesis search over batch, lengths, per-element masks, causal,
    dtype and mode finds no break of the core promises.

    `max_examples` draws (the suite's budget unless `property_search` asks for more); a
    break raises CheckFailed naming the shrunk draw."""

    @settings(
        max_examples=max_examples,
        derandomize=True,
        database=None,
        deadline=None,
        verbosity=Verbosity.quiet,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )
    @given(_strategy(subject))
    def search(draw: Draw) -> None:
        try:
            _assert_promises(subject, draw)
        except CheckFailed as failed:
            raise CheckFailed(f"{failed} [found by the property search with {draw}]") from None

    search()


def property_search(
    variant: str | type[AttentionVariant],
    max_examples: int = 200,
    impl: str = "fast",
    options: dict[str, Any] | None = None,
) -> None:
    """Search `variant` (a registered name or a class) for a break of the core promises
    over `max_examples` derandomized draws; raises CheckFailed describing the smallest
    example found."""
    check_property_search(
        Subject(resolve_variant(variant), impl=impl, options=dict(options or {})), max_examples
    )
