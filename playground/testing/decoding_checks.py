"""The decoding checks: token-by-token decoding equals the causal forward, and a state
holds exactly the bytes it reports (docs/design.md, "Decoding").

The contract is the one flash-linear-attention's model tests hold every model to: prefill
p tokens, decode the rest one at a time, and every output, the prompt's included, equals
the causal full forward's at its position. It is checked at every suite length (so past
every special size), for several splits (p = 0, 1, half, all but one, all), in float64 to
1e-10 where the variant declares it and in float32 to 1e-5, and for a batch of prompts of
different lengths (one of them empty), padded on the left (against the padded forward)
and on the right (against each sequence's own forward, without padding).

A variant with no state of its own is checked the same way: the default (re-running the
causal forward, `AttentionVariant.prefill_state`) is what it decodes with.
"""

from __future__ import annotations

import gc
import types
import weakref
from typing import Any

import torch
from torch import nn

from playground.contract import AttentionVariant
from playground.decoding import DecodingState
from playground.errors import UnsupportedFeature
from playground.testing.corners import CheckFailed, CheckSkipped, tolerance_for
from playground.testing.subject import Subject

FLOAT64_TOLERANCE = 1e-10
FLOAT32_TOLERANCE = 1e-5
"""Absolute below outputs of magnitude one, relative above (corners.tolerance_for)."""

Split = tuple[int, int | None]
"""(prompt length p, max_length given to prefill or None)."""


def _decodes(subject: Subject) -> None:
    """Skip a variant that declares it cannot decode, after checking that prefill refuses
    it with UnsupportedFeature (never a silent wrong answer)."""
    caps = subject.caps
    if caps.causal and caps.decoding:
        return
    dtype = torch.float32 if torch.float32 in caps.dtypes else caps.dtypes[0]
    declared = ["causal not declared"] if not caps.causal else []
    if not caps.decoding:
        declared.append(f"decoding=False declared ({caps.decoding_hint or 'no hint given'})")
    reason = "; ".join(declared)
    try:
        subject.build(dtype).prefill(subject.tokens(4, dtype=dtype))
    except UnsupportedFeature:
        raise CheckSkipped(f"{reason}, and prefill refuses it") from None
    raise CheckFailed(f"{reason}, yet prefill did not raise UnsupportedFeature")


def _dtypes(subject: Subject) -> list[tuple[torch.dtype, float]]:
    """float64 first (the exact comparison) where declared, then float32."""
    pairs = [(torch.float64, FLOAT64_TOLERANCE), (torch.float32, FLOAT32_TOLERANCE)]
    chosen = [(dtype, tolerance) for dtype, tolerance in pairs if dtype in subject.caps.dtypes]
    if not chosen:
        raise CheckSkipped("neither float64 nor float32 declared")
    return chosen


@torch.no_grad()
def decoded(
    module: AttentionVariant,
    x: torch.Tensor,
    prompt: int,
    mask: torch.Tensor | None = None,
    max_length: int | None = None,
    **extra: Any,
) -> tuple[torch.Tensor, DecodingState]:
    """Outputs (B, N, d_model) of `x` (B, N, d_model): prefill `prompt` tokens (padded as
    `mask` (B, prompt) says, with a variant's `extra` inputs), then decode the rest one
    token at a time; and the state after the last token."""
    output, state = module.prefill(
        x[:, :prompt], attention_mask=mask, max_length=max_length, **extra
    )
    outputs = [output]
    for t in range(prompt, x.shape[1]):
        step, state = module.decode_step(x[:, t : t + 1], state)
        outputs.append(step)
    return torch.cat(outputs, dim=1), state


def _compare(
    got: torch.Tensor,
    expected: torch.Tensor,
    prompt: int,
    tolerance: float,
    where: str,
    sequence: int | None = None,
    why: str = "",
) -> None:
    """got and expected (B, N, d_model); positions below `prompt` came from prefill.
    `sequence`: the batch element a one-sequence comparison is of; `why`: what the
    comparison asks of the variant (both for the message)."""
    error = (got.double() - expected.double()).abs().nan_to_num(float("inf"))
    allowed = tolerance_for(expected, tolerance)
    if error.numel() and float(error.max()) > allowed:
        flat = int(error.amax(dim=-1).flatten().argmax())
        b, position = divmod(flat, error.shape[1])
        source = "the prompt's output (prefill)" if position < prompt else "a decoded token"
        element = f"batch element {b}" if sequence is None else f"sequence {sequence}"
        raise CheckFailed(
            f"decoding differs from the causal forward by {float(error.max()):.3g} "
            f"(tolerance {allowed:.3g}) at {where}: first in {element}, at its position "
            f"{position}, {source}{'; ' + why if why else ''}"
        )


def _splits(n: int) -> list[Split]:
    """The empty and the one-token prompt, half (into a state allocated once, for all n
    tokens), all but one, and all (prefill alone)."""
    splits = {(0, None), (min(1, n), None), (n // 2, n), (n - 1, None), (n, None)}
    return sorted(splits, key=lambda split: (split[0], split[1] or 0))


def check_decoding_matches_forward(subject: Subject) -> None:
    """Prefill p tokens, then one token at a time: every output equals the causal full
    forward's, at every suite length and every split p of `_splits`, in float64 (1e-10)
    where declared; in float32 (1e-5) too, at the half split alone when float64 ran."""
    _decodes(subject)
    for index, (dtype, tolerance) in enumerate(_dtypes(subject)):
        module = subject.build(dtype)
        for n in subject.lengths:
            x = subject.tokens(n, dtype=dtype)
            with torch.no_grad():
                expected = module(x, is_causal=True).output
            splits = _splits(n) if index == 0 else [(n // 2, n)]
            for prompt, max_length in splits:
                got, _ = decoded(module, x, prompt, max_length=max_length)
                state = "" if max_length is None else f" (max_length={max_length})"
                where = f"n={n}, a prompt of {prompt}{state} then {n - prompt} steps, {dtype}"
                _compare(got, expected, prompt, tolerance, where)


def _padded_batch(
    x: torch.Tensor, prompt: int, lengths: list[int], side: str, padding: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence b is x[b, : lengths[b] + steps]: its first lengths[b] tokens padded on
    `side` to a prompt of `prompt`, the padding taken from `padding` (like x), then its
    next tokens. Returns the inputs (B, N, D) and the prompt's mask (B, prompt)."""
    inputs = padding.clone()
    mask = torch.zeros(x.shape[0], prompt, dtype=torch.bool)
    for b, real in enumerate(lengths):
        where = slice(prompt - real, prompt) if side == "left" else slice(0, real)
        inputs[b, where], mask[b, where] = x[b, :real], True
        inputs[b, prompt:] = x[b, real : real + x.shape[1] - prompt]
    return inputs, mask


def _zero_at_padding(got: torch.Tensor, mask: torch.Tensor, where: str) -> None:
    padding = got[:, : mask.shape[1]][~mask]
    if padding.numel() and not bool((padding == 0).all()):
        raise CheckFailed(f"prefill's output at padding is not exactly zero ({where})")


RIGHT_PADDING = (
    "a right-padded sequence must decode as it runs alone (the core moves right padding to "
    "the left before the variant sees it: an output that depends on absolute positions, "
    "such as a token global by its position, must not change with that move)"
)


def check_decoding_padded_prompts(subject: Subject) -> None:
    """A batch of prompts of different lengths (P, P/2, 1 and 0 real tokens of P): padded
    on the left (with large noise), decoding equals the padded causal forward at every real
    token; padded on the right (with NaN), it equals each sequence's own forward; prefill
    outputs zero at padding."""
    _decodes(subject)
    if not subject.caps.padding_mask:
        raise CheckSkipped("padding_mask not declared")
    dtype, tolerance = _dtypes(subject)[0]
    module = subject.build(dtype)
    for n in subject.lengths:
        if n < 2:
            continue
        prompt = n // 2
        lengths = [prompt, prompt // 2, 1, 0]
        x = subject.tokens(n, batch=len(lengths), dtype=dtype)

        noise = 100 * subject.tokens(n, batch=len(lengths), seed=7, dtype=dtype)
        inputs, mask = _padded_batch(x, prompt, lengths, "left", noise)
        real = torch.cat([mask, mask.new_ones(len(lengths), n - prompt)], dim=1)  # (B, N)
        with torch.no_grad():
            expected = module(inputs, attention_mask=real, is_causal=True).output
        got, _ = decoded(module, inputs, prompt, mask)
        where = f"n={n}, prompts of {lengths} real tokens left-padded to {prompt}, {dtype}"
        _zero_at_padding(got, mask, where)
        at_real = real[..., None]
        _compare(got.where(at_real, 0), expected.where(at_real, 0), prompt, tolerance, where)

        nan = torch.full_like(x, float("nan"))
        inputs, mask = _padded_batch(x, prompt, lengths, "right", nan)
        got, _ = decoded(module, inputs, prompt, mask)
        where = (
            f"n={n}, prompts of {lengths} real tokens right-padded to {prompt}, {dtype}, "
            f"against each sequence's own forward"
        )
        _zero_at_padding(got, mask, where)
        for b, length in enumerate(lengths):
            with torch.no_grad():
                alone = module(x[b : b + 1, : length + n - prompt], is_causal=True).output
            mine = torch.cat([got[b : b + 1, :length], got[b : b + 1, prompt:]], dim=1)
            _compare(mine, alone, length, tolerance, where, sequence=b, why=RIGHT_PADDING)


# --- the state's size ----------------------------------------------------------------------
NOT_STATE = (nn.Module, type, types.ModuleType, weakref.ReferenceType, str, bytes)
"""What a state may refer to without holding it: its owner and other modules (weights are
the model's), classes, modules, weak references."""


def held_bytes(state: DecodingState) -> int:
    """Bytes of every tensor (and bare storage) reachable from `state`, found with the
    garbage collector's view of its references, not the state's own `tensors()`: each
    storage once. A function contributes its closure and defaults, not its globals."""
    storages: dict[tuple[torch.device, int], int] = {}
    seen: set[int] = set()
    stack: list[object] = [state]
    while stack:
        item = stack.pop()
        if id(item) in seen or isinstance(item, NOT_STATE):
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            storages[(item.device, storage.data_ptr())] = storage.nbytes()
        elif isinstance(item, (torch.UntypedStorage, torch.TypedStorage)):
            untyped = item.untyped() if isinstance(item, torch.TypedStorage) else item
            storages[(untyped.device, untyped.data_ptr())] = untyped.nbytes()
        elif isinstance(item, types.FunctionType):
            stack.extend(cell.cell_contents for cell in item.__closure__ or ())
            stack.extend(item.__defaults__ or ())
            stack.extend((item.__kwdefaults__ or {}).values())
        else:
            stack.extend(gc.get_referents(item))
    return sum(storages.values())


def _assert_size(state: DecodingState, where: str) -> None:
    reported, held = state.nbytes, held_bytes(state)
    if reported != held:
        raise CheckFailed(
            f"the state ({type(state).__name__}) reports nbytes={reported} but holds {held} "
            f"bytes of tensors ({where}): keep every tensor in an attribute, or a list, tuple, "
            f"dict or DecodingState held by one, where DecodingState.tensors() finds it, and "
            f"do not override nbytes"
        )


def check_decoding_state_size(subject: Subject) -> None:
    """The state reports the bytes it holds: `nbytes` equals the storage of every tensor
    reachable from it (`held_bytes`), after a prompt, after decoding on to the longest
    suite length, for a state allocated once (max_length) and for a padded batch."""
    _decodes(subject)
    dtype = _dtypes(subject)[-1][0]  # float32 where declared
    module = subject.build(dtype)
    n = subject.lengths[-1]
    prompt = n // 2
    x = subject.tokens(n, dtype=dtype)
    with torch.no_grad():
        state = module.prefill(x[:, :prompt])[1]
        _assert_size(state, f"after a prompt of {prompt}")
        for t in range(prompt, n):
            _, state = module.decode_step(x[:, t : t + 1], state)
        _assert_size(state, f"after a prompt of {prompt} and {n - prompt} steps")
        state = module.prefill(x[:, :prompt], max_length=n)[1]
        _assert_size(state, f"after a prompt of {prompt}, max_length={n}")
        if subject.caps.padding_mask and prompt >= 2:
            mask = torch.ones(x.shape[0], prompt, dtype=torch.bool)
            mask[1:, : prompt // 2] = False
            state = module.prefill(x[:, :prompt], attention_mask=mask)[1]
            _assert_size(state, f"after a left-padded prompt of {prompt}")


DECODING_CHECKS = (
    check_decoding_matches_forward,
    check_decoding_padded_prompts,
    check_decoding_state_size,
)
