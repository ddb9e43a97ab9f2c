"""The decoding checks: token-by-token decoding equals the causal forward, and a state
holds exactly the bytes it reports (docs/design.md, "Decoding").

The contract is the one flash-linear-attention's model tests hold every model to: prefill
p tokens, decode the rest one at a time, and every output, the prompt's included, equals
the causal full forward's at its position. It is checked at every suite length (so past
every special size), for several splits (p = 0, 1, half, all but one), in float64 to 1e-10
where the variant declares it and in float32 to 1e-5, and for batches whose prompts differ
in length, padded on the left (against the padded forward) and on the right (the same
outputs: the core moves right padding to the left).
"""

from __future__ import annotations

import gc
import types
import weakref

import torch
from torch import nn

from playground.contract import AttentionVariant
from playground.decoding import DecodingState
from playground.errors import UnsupportedFeature
from playground.testing.corners import CheckFailed, CheckSkipped
from playground.testing.subject import Subject

FLOAT64_TOLERANCE = 1e-10
FLOAT32_TOLERANCE = 1e-5
"""Absolute, on outputs of order one (the suite's random inputs)."""


def _decodes(subject: Subject) -> None:
    """Skip a variant that declares it cannot decode, after checking it refuses."""
    caps = subject.caps
    if caps.causal and caps.decoding:
        return
    try:
        subject.build().prefill(subject.tokens(4))
    except UnsupportedFeature:
        reason = "causal not declared" if not caps.causal else "decoding=False declared"
        raise CheckSkipped(f"{reason} (and prefill refuses it)") from None
    raise CheckFailed(
        "the variant cannot decode (not causal, or decoding=False), yet prefill did not "
        "raise UnsupportedFeature"
    )


@torch.no_grad()
def decoded(
    module: AttentionVariant, x: torch.Tensor, prompt: int, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Outputs (B, N, d_model) of `x` (B, N, d_model): prefill `prompt` tokens (padded as
    `mask` (B, prompt) says), then decode the rest one token at a time."""
    output, state = module.prefill(x[:, :prompt], attention_mask=mask)
    outputs = [output]
    for t in range(prompt, x.shape[1]):
        step, state = module.decode_step(x[:, t : t + 1], state)
        outputs.append(step)
    return torch.cat(outputs, dim=1)


def _compare(got: torch.Tensor, expected: torch.Tensor, tolerance: float, where: str) -> None:
    error = (got - expected).abs()
    if not bool(torch.isfinite(got).all()) or float(error.max()) > tolerance:
        b, position, _ = divmod_index(error)
        raise CheckFailed(
            f"decoded output differs from the causal forward by {float(error.max()):.3g} "
            f"(tolerance {tolerance:g}) {where}, first at batch element {b}, position "
            f"{position}"
        )


def divmod_index(error: torch.Tensor) -> tuple[int, int, int]:
    """(b, position, feature) of the largest entry of a (B, N, D) tensor (NaN first)."""
    flat = error.nan_to_num(float("inf")).flatten().argmax().item()
    b, rest = divmod(int(flat), error.shape[1] * error.shape[2])
    return b, *divmod(rest, error.shape[2])


def _splits(n: int) -> list[int]:
    return sorted({p for p in (0, 1, n // 2, n - 1) if 0 <= p <= n})


def check_decoding_matches_forward(subject: Subject) -> None:
    """Prefill p tokens, then one token at a time: every output equals the causal full
    forward's, at every suite length and several splits, in float64 (1e-10, where
    declared) and float32 (1e-5)."""
    _decodes(subject)
    dtypes = [(torch.float32, FLOAT32_TOLERANCE)]
    if torch.float64 in subject.caps.dtypes:
        dtypes.append((torch.float64, FLOAT64_TOLERANCE))
    for dtype, tolerance in dtypes:
        module = subject.build(dtype)
        for n in subject.lengths:
            x = subject.tokens(n, dtype=dtype)
            with torch.no_grad():
                expected = module(x, is_causal=True).output
            for prompt in _splits(n):
                got = decoded(module, x, prompt)
                _compare(got, expected, tolerance, f"at n={n}, prompt {prompt}, {dtype}")


def check_decoding_padded_prompts(subject: Subject) -> None:
    """A batch of prompts of different lengths: padded on the left, decoding equals the
    padded causal forward; padded on the right, the same outputs, in the caller's layout
    (the core moves the padding to the left, whose positions the state holds)."""
    _decodes(subject)
    if not subject.caps.padding_mask:
        raise CheckSkipped("padding_mask not declared")
    dtype = torch.float64 if torch.float64 in subject.caps.dtypes else torch.float32
    tolerance = FLOAT64_TOLERANCE if dtype == torch.float64 else FLOAT32_TOLERANCE
    module = subject.build(dtype)
    for n in subject.lengths:
        if n < 4:
            continue
        prompt = n // 2
        lengths = [prompt, max(1, prompt // 2), 1][: subject.batch]
        x = subject.tokens(n, batch=len(lengths), dtype=dtype)
        left = torch.ones(len(lengths), n, dtype=torch.bool)
        for b, real in enumerate(lengths):
            left[b, : prompt - real] = False
        with torch.no_grad():
            expected = module(x, attention_mask=left, is_causal=True).output
        got = decoded(module, x, prompt, left[:, :prompt])
        _compare(
            got * left[..., None], expected * left[..., None], tolerance, f"left-padded, n={n}"
        )
        for b, real in enumerate(lengths):  # the same sequences padded on the right
            if bool((got[b, : prompt - real] != 0).any()):
                raise CheckFailed(f"prefill output at left padding is not zero (n={n})")
        right = x.clone()
        right_mask = torch.ones(len(lengths), prompt, dtype=torch.bool)
        for b, real in enumerate(lengths):
            right[b, :real] = x[b, prompt - real : prompt]
            right[b, real:prompt] = 0.0
            right_mask[b, real:] = False
        got = decoded(module, right, prompt, right_mask)
        for b, real in enumerate(lengths):
            mine = torch.cat([got[b : b + 1, :real], got[b : b + 1, prompt:]], dim=1)
            left_padded = expected[b : b + 1, prompt - real :]
            where = f"right-padded, n={n}, sequence {b} of length {real}"
            _compare(mine, left_padded, tolerance, where)
            if bool((got[b, real:prompt] != 0).any()):
                raise CheckFailed(f"prefill output at right padding is not zero (n={n})")


def held_bytes(state: DecodingState) -> int:
    """Bytes of every tensor reachable from `state`, found with the garbage collector's
    view of its references (not the state's own `tensors()`): each storage once. The
    module that owns the state, classes, modules and weak references are not state."""
    storages: dict[tuple[torch.device, int], int] = {}
    seen: set[int] = set()
    stack: list[object] = [state]
    skipped = (nn.Module, type, types.ModuleType, weakref.ReferenceType, str, bytes)
    while stack:
        item = stack.pop()
        if id(item) in seen or isinstance(item, skipped):
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            storages[(item.device, storage.data_ptr())] = storage.nbytes()
        elif isinstance(item, types.FunctionType):  # a closure's cells, not its globals
            stack.extend(cell.cell_contents for cell in item.__closure__ or ())
        else:
            stack.extend(gc.get_referents(item))
    return sum(storages.values())


def check_decoding_state_size(subject: Subject) -> None:
    """The state reports the bytes it holds: `nbytes` equals the storage of every tensor
    reachable from it, after the prompt and after more tokens."""
    _decodes(subject)
    module = subject.build()
    n = subject.lengths[-1]
    x = subject.tokens(n)
    with torch.no_grad():
        state = module.prefill(x[:, : n // 2])[1]
        for stage in ("after the prompt", "after decoding"):
            if state.nbytes != held_bytes(state):
                raise CheckFailed(
                    f"the state reports {state.nbytes} bytes but holds {held_bytes(state)} "
                    f"{stage} (n={n}): keep every tensor in its attributes, lists or dicts"
                )
            for t in range(n // 2, n):
                module.decode_step(x[:, t : t + 1], state)


DECODING_CHECKS = (
    check_decoding_matches_forward,
    check_decoding_padded_prompts,
    check_decoding_state_size,
)
