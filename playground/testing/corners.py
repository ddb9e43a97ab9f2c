"""The promises about masks, batches and time, as assertions that hold in the corners.

Each `assert_*` function tests one promise on one module and input, and raises
`CheckFailed` saying where it broke (length, mode, masks, batch element, position). The
named checks run them at every length of `Subject.lengths`, in eval and in train mode,
for every declared mask combination; the dtype checks and the property search
(`playground.testing.properties`) reuse them, so one promise has one definition.

Eval-mode calls run under `torch.no_grad()` (inference), train-mode calls with grad
enabled (training), since a variant may take another path in each.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from playground.contract import AttentionVariant
from playground.testing.subject import Mode, describe

TOLERANCES = {
    torch.float32: 1e-5,
    torch.float64: 1e-10,
    torch.bfloat16: 3e-2,
    torch.float16: 5e-3,
}
"""Largest difference, relative to the output's scale (at least 1), between two results
that must agree (an element alone and in a batch, before and after a masked change)."""


class CheckFailed(AssertionError):
    """The variant broke the promise the check tests."""


class CheckSkipped(Exception):
    """The check does not apply: the variant does not declare the capability."""


def max_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.numel() == 0:
        return 0.0
    return (a.double() - b.double()).abs().max().item()


def tolerance_for(reference: torch.Tensor, base: float | None = None) -> float:
    """`base` (default: the dtype's in TOLERANCES), relative to the reference's largest
    magnitude when that is above 1."""
    scale = reference.double().abs().max().item() if reference.numel() else 0.0
    return (TOLERANCES.get(reference.dtype, 1e-5) if base is None else base) * max(1.0, scale)


def running(mode: Mode) -> contextlib.AbstractContextManager[Any]:
    """No autograd graph for inference calls; a normal training call otherwise."""
    return torch.no_grad() if mode == "eval" else contextlib.nullcontext()


def where(n: int, mode: Mode, case: dict[str, Any], extra: str = "") -> str:
    """ "n=17, train, padding+causal" and any detail: for failure messages."""
    return f"n={n}, {mode}, {describe(case)}{', ' + extra if extra else ''}"


def _arguments(x: torch.Tensor, memory: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """The call's inputs: x alone (self-attention), or x over `memory` as key and value."""
    return (x,) if memory is None else (x, memory, memory)


def assert_batch_independent(
    module: AttentionVariant,
    x: torch.Tensor,
    case: dict[str, Any],
    mode: Mode,
    memory: torch.Tensor | None = None,
) -> None:
    """Each batch element's output is what it gets alone (x attending over itself, or
    over `memory` (B, Nk, E) as key and value)."""
    mask = case.get("attention_mask")
    with running(mode):
        together = module(*_arguments(x, memory), **case).output
        for b in range(x.shape[0]):
            alone_case = dict(case)
            if mask is not None:
                alone_case["attention_mask"] = mask[b : b + 1]
            own = None if memory is None else memory[b : b + 1]
            alone = module(*_arguments(x[b : b + 1], own), **alone_case).output
            difference = max_difference(together[b : b + 1], alone)
            if not difference <= tolerance_for(alone):
                raise CheckFailed(
                    f"batch element {b} differs by {difference:.3g} when run alone "
                    f"({where(x.shape[1], mode, case, _cross(memory))}): elements of a batch "
                    f"influence each other"
                )


def _cross(memory: torch.Tensor | None) -> str:
    return "" if memory is None else f"cross attention over Nk={memory.shape[1]}"


def assert_padding_invariant(
    module: AttentionVariant,
    x: torch.Tensor,
    case: dict[str, Any],
    mode: Mode,
    memory: torch.Tensor | None = None,
) -> None:
    """Changing padded tokens, to large noise, NaN or inf, never changes a real query's
    output, which stays finite. In cross attention (`memory` as key and value) the padded
    tokens are memory's, and every query is real."""
    mask = case["attention_mask"]
    padded = x if memory is None else memory
    real_queries = mask if memory is None else torch.ones(x.shape[:2], dtype=torch.bool)
    noise = torch.randn(padded.shape, generator=torch.Generator().manual_seed(9))
    context = where(x.shape[1], mode, case, _cross(memory))
    with running(mode):
        before = module(*_arguments(x, memory), **case).output
        for label, fill in (
            ("large noise", 100 * noise.to(padded.dtype)),
            ("NaN", torch.full_like(padded, float("nan"))),
            ("inf", torch.full_like(padded, float("inf"))),
        ):
            changed = torch.where(mask[..., None], padded, fill)
            inputs = (changed,) if memory is None else (x, changed, changed)
            after = module(*inputs, **case).output
            real_before, real_after = before[real_queries], after[real_queries]
            if not torch.isfinite(real_after).all():
                raise CheckFailed(
                    f"padded tokens set to {label} made real outputs non-finite "
                    f"({context}): padding leaks into the output"
                )
            difference = max_difference(real_before, real_after)
            if not difference <= tolerance_for(real_before):
                raise CheckFailed(
                    f"real queries changed by {difference:.3g} when only padded tokens "
                    f"changed to {label} ({context}): padding leaks into the output"
                )


STACKED_SEQUENCES = 96
"""Sequences per call when the causality checks stack one copy of the batch per cut."""


def _cuts(n: int, batch: int) -> list[range]:
    """The cut positions t = 0 … n − 2 in groups whose stacked copies (batch sequences
    each) fit in one call of at most STACKED_SEQUENCES sequences."""
    per_call = max(1, STACKED_SEQUENCES // max(batch, 1))
    return [range(start, min(start + per_call, n - 1)) for start in range(0, n - 1, per_call)]


def _stacked_case(case: dict[str, Any], copies: int) -> dict[str, Any]:
    """The same masks for `copies` copies of the batch stacked along the batch."""
    stacked = dict(case)
    if case.get("attention_mask") is not None:
        stacked["attention_mask"] = case["attention_mask"].repeat(copies, 1)
    return stacked


def assert_causal(
    module: AttentionVariant,
    inputs: dict[str, torch.Tensor],
    case: dict[str, Any],
    mode: Mode,
    gradients: bool,
) -> None:
    """Under is_causal, output i does not depend on any token j > i, for every i.

    Values: changing every token after t (of every input) leaves outputs 0..t unchanged.
    Gradients (when `gradients`): output t has an exactly zero gradient with respect to
    every token j > t of each input. `inputs` maps "query" (and "key", "value" for
    cross-attention) to (B, N, E) tensors.

    One copy of the batch per cut t, its future replaced by noise, is stacked along the
    batch, and only row t of copy t gets an upstream gradient: a few calls cover every
    position (a variant that couples batch elements fails here too, and in
    check_batch_independence).
    """
    arguments = list(inputs.values())
    batch, n = arguments[0].shape[:2]  # the queries
    longest = max(t.shape[1] for t in arguments)
    position = torch.arange(longest)
    context = where(n, mode, case, _cross(arguments[1] if len(arguments) > 1 else None))
    noises = [
        10 * torch.randn(t.shape, generator=torch.Generator().manual_seed(11 + i)).to(t.dtype)
        for i, t in enumerate(arguments)
    ]
    with running(mode):
        before = module(*arguments, **case).output  # (B, N, E)
    for cuts in _cuts(longest, batch):
        copies, rows = len(cuts), torch.tensor(list(cuts))
        past = position[None, :] <= rows[:, None]  # (copies, longest): each cut's past
        keep = past[:, :n]  # (copies, N): the queries' past
        leaves = [
            torch.where(past[:, None, : t.shape[1], None], t, noise).requires_grad_(gradients)
            for t, noise in zip(arguments, noises, strict=True)
        ]  # each (copies, B, N or Nk, E)
        with torch.enable_grad() if gradients else running(mode):
            output = module(*(leaf.flatten(0, 1) for leaf in leaves), **_stacked_case(case, copies))
        after = output.output.unflatten(0, (copies, batch))  # (copies, B, N, E)
        difference = (after.detach().double() - before.double()).abs().amax(dim=-1)
        difference = difference.nan_to_num(float("inf")).masked_fill(~keep[:, None, :], 0.0)
        if not difference.max().item() <= tolerance_for(before):
            cut, element, spot = _unravel(difference, (copies, batch, n))
            raise CheckFailed(
                f"output {spot} of batch element {element} changed by "
                f"{difference.max().item():.3g} when the tokens after position {cuts[cut]} "
                f"changed under is_causal=True ({context}): the variant leaks the future"
            )
        if not gradients:
            continue
        selected = position[None, :n] == rows[:, None]  # (copies, N): row t of copy t
        upstream = torch.randn(after.shape, generator=torch.Generator().manual_seed(12))
        upstream = upstream.to(after.dtype) * selected[:, None, :, None]
        grads = torch.autograd.grad((after * upstream).sum(), leaves, allow_unused=True)
        future_positions = position[None, :] > rows[:, None]  # (copies, longest)
        for name, grad in zip(inputs, grads, strict=True):
            if grad is None:
                continue
            tokens = grad.shape[2]
            future = grad.abs().amax(dim=-1)  # (copies, B, N or Nk)
            future = future.masked_fill(~future_positions[:, None, :tokens], 0.0)
            if not (future == 0).all():
                cut, element, token = _unravel(future, (copies, batch, tokens))
                raise CheckFailed(
                    f"output {cuts[cut]} of batch element {element} has a non-zero gradient "
                    f"({future.max().item():.3g}) with respect to {name} token {token} under "
                    f"is_causal=True ({context}): the future leaks through backward"
                )


def _unravel(values: torch.Tensor, shape: tuple[int, int, int]) -> tuple[int, int, int]:
    """(cut, batch element, position) of the largest entry of a (cuts, B, N) tensor."""
    flat = int(values.nan_to_num(float("inf")).argmax())
    cut, rest = divmod(flat, shape[1] * shape[2])
    element, position = divmod(rest, shape[2])
    return cut, element, position


def assert_empty_rows_are_zero(
    module: AttentionVariant,
    x: torch.Tensor,
    case: dict[str, Any],
    empty: torch.Tensor,
    mode: Mode,
    need_weights: bool,
) -> None:
    """Queries that see no key (empty (B, N) bool) output exactly zero, weights too, and
    the inputs' gradients stay finite."""
    x = x.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        result = module(x, need_weights=need_weights, **case)
    rows = result.output[empty]
    label = where(x.shape[1], mode, case)
    if rows.numel() and (not torch.isfinite(rows).all() or rows.abs().max().item() != 0):
        raise CheckFailed(
            f"queries that see no key gave {rows.abs().max().item():.3g} (NaN/inf: "
            f"{not torch.isfinite(rows).all()}) ({label}); they must output exactly 0"
        )
    if result.weights is not None:
        weights = result.weights.transpose(1, 2)[empty]  # (rows, H, Nk)
        if weights.numel() and weights.abs().max() != 0:
            raise CheckFailed(f"queries that see no key have non-zero weights ({label})")
    upstream = torch.randn(result.output.shape, generator=torch.Generator().manual_seed(5))
    (result.output * upstream.to(x.dtype)).sum().backward()
    if x.grad is not None and not torch.isfinite(x.grad).all():
        raise CheckFailed(f"gradients are NaN/inf with queries that see no key ({label})")
