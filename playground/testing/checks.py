"""The contract checks: small named functions, each proving one promise of DESIGN.md.

A check takes a `Subject` (a variant class, its options and impl, at a small size) and
returns None when the promise holds. It raises `CheckFailed` with a message saying what
broke and by how much, or `CheckSkipped` naming the undeclared capability that makes the
check meaningless. Checks skip only by declared capability.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from playground.contract import AttentionOutput
from playground.errors import InvalidInput, UnsupportedFeature
from playground.masks import allowed_keys
from playground.testing.subject import Subject

TOLERANCE = 1e-5  # fp32: fast vs reference, batch independence, invariances


class CheckFailed(AssertionError):
    """The variant broke the promise the check tests."""


class CheckSkipped(Exception):
    """The check does not apply: the variant does not declare the capability."""


def _max_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def _describe(case: dict[str, Any]) -> str:
    """ "padding+causal", "causal", "no mask": which masks a case applies."""
    names = {"attention_mask": "padding", "is_causal": "causal"}
    return "+".join(names[key] for key in case) or "no mask"


# --- the checks --------------------------------------------------------------------
def check_output_shape_and_dtype(subject: Subject) -> None:
    """Self-attention returns (B, N, d_model) in the input dtype; weights only on request."""
    module, x = subject.build(), subject.tokens()
    result = module(x)
    if not isinstance(result, AttentionOutput):
        raise CheckFailed(f"forward returned {type(result).__name__}, not AttentionOutput")
    if tuple(result.output.shape) != tuple(x.shape) or result.output.dtype != x.dtype:
        raise CheckFailed(
            f"output is {tuple(result.output.shape)} {result.output.dtype}; "
            f"expected {tuple(x.shape)} {x.dtype}"
        )
    if result.weights is not None:
        raise CheckFailed("weights returned although need_weights=False")
    if not torch.isfinite(result.output).all():
        raise CheckFailed("output has NaN or inf on ordinary inputs")
    if subject.caps.need_weights:
        weights = module(x, need_weights=True).weights
        expected = (subject.batch, subject.num_heads, subject.seq_len, subject.seq_len)
        if weights is None or tuple(weights.shape) != expected:
            got = None if weights is None else tuple(weights.shape)
            raise CheckFailed(f"need_weights=True gave weights of shape {got}; expected {expected}")


def check_key_value_default_to_query(subject: Subject) -> None:
    """forward(x) equals forward(x, x, x): key and value default to the query."""
    module, x = subject.build(), subject.tokens()
    difference = _max_difference(module(x).output, module(x, x, x).output)
    if difference > 0:
        raise CheckFailed(f"forward(x) and forward(x, x, x) differ by {difference:.3g}")


def check_cross_attention(subject: Subject) -> None:
    """Queries attend over a key/value sequence of another length."""
    if not subject.caps.cross_attention:
        raise CheckSkipped("cross_attention not declared")
    module = subject.build()
    n_q, n_k = max(2, subject.seq_len // 2), subject.seq_len
    query, memory = subject.tokens(n_q), subject.tokens(n_k, seed=2)
    result = module(query, memory, memory, need_weights=subject.caps.need_weights)
    if tuple(result.output.shape) != (subject.batch, n_q, subject.d_model):
        raise CheckFailed(f"cross-attention output is {tuple(result.output.shape)}")
    if result.weights is not None and tuple(result.weights.shape) != (
        subject.batch,
        subject.num_heads,
        n_q,
        n_k,
    ):
        raise CheckFailed(f"cross-attention weights are {tuple(result.weights.shape)}")
    other = subject.tokens(n_k, seed=3)
    if _max_difference(result.output, module(query, other, other).output) == 0:
        raise CheckFailed("the output does not depend on key/value: they are ignored")


def check_batch_independence(subject: Subject) -> None:
    """Each batch element's output is what it gets alone."""
    module, x = subject.build(), subject.tokens()
    mask = subject.padding_mask() if subject.caps.padding_mask else None
    together = module(x, attention_mask=mask).output
    for b in range(subject.batch):
        alone_mask = None if mask is None else mask[b : b + 1]
        alone = module(x[b : b + 1], attention_mask=alone_mask).output
        difference = _max_difference(together[b : b + 1], alone)
        if difference > TOLERANCE:
            raise CheckFailed(
                f"batch element {b} differs by {difference:.3g} when run alone: "
                f"elements of a batch influence each other"
            )


def check_padding_invariance(subject: Subject) -> None:
    """Changing a padded token never changes a real query's output."""
    if not subject.caps.padding_mask:
        raise CheckSkipped("padding_mask not declared")
    module, x, mask = subject.build(), subject.tokens(), subject.padding_mask()
    for case in ({}, {"is_causal": True}) if subject.caps.causal else ({},):
        before = module(x, attention_mask=mask, **case).output
        changed = torch.where(mask[..., None], x, 100 * subject.tokens(seed=9))
        after = module(changed, attention_mask=mask, **case).output
        difference = _max_difference(before[mask], after[mask])
        if difference > TOLERANCE:
            raise CheckFailed(
                f"real queries changed by {difference:.3g} when only padded tokens changed "
                f"({_describe(case)}): padding leaks into the output"
            )


def check_padded_weights_are_zero(subject: Subject) -> None:
    """Padded keys get exactly zero attention weight."""
    if not (subject.caps.padding_mask and subject.caps.need_weights):
        raise CheckSkipped("needs padding_mask and need_weights")
    module, x, mask = subject.build(), subject.tokens(), subject.padding_mask()
    weights = module(x, attention_mask=mask, need_weights=True).weights  # (B, H, N, N)
    leaked = weights.masked_select(~mask[:, None, None, :]).abs().max().item()
    if leaked != 0:
        raise CheckFailed(f"a padded key got weight {leaked:.3g}; it must be exactly 0")


def check_causality(subject: Subject) -> None:
    """Perturbing token j never changes the output at any position i < j."""
    if not subject.caps.causal:
        raise CheckSkipped("causal not declared")
    module, x = subject.build(), subject.tokens()
    before = module(x, is_causal=True).output
    for j in (1, subject.seq_len // 2, subject.seq_len - 1):
        changed = x.clone()
        changed[:, j] += 10 * subject.tokens(seed=j + 10)[:, j]
        after = module(changed, is_causal=True).output
        difference = _max_difference(before[:, :j], after[:, :j])
        if difference > TOLERANCE:
            raise CheckFailed(
                f"outputs before position {j} changed by {difference:.3g} when token {j} "
                f"changed under is_causal=True: the variant leaks the future"
            )
    if subject.caps.need_weights:
        weights = module(x, is_causal=True, need_weights=True).weights
        future = weights.triu(diagonal=1).abs().max().item()
        if future != 0:
            raise CheckFailed(f"a future key got weight {future:.3g} under is_causal=True")


def check_weights_sum_to_one(subject: Subject) -> None:
    """Every real query that can see a key has non-negative weights summing to 1."""
    if not subject.caps.need_weights:
        raise CheckSkipped("need_weights not declared")
    module, x = subject.build(), subject.tokens()
    for case in subject.mask_cases():
        weights = module(x, need_weights=True, **case).weights
        allowed = allowed_keys(
            case.get("attention_mask"), x.shape[1], x.shape[1], case.get("is_causal", False)
        )
        rows = torch.ones(weights.shape[:-1], dtype=torch.bool)
        if allowed is not None:
            rows = allowed.any(dim=-1).expand_as(rows)
        if "attention_mask" in case:
            # A padded query's row is the variant's to define (Longformer, like HF, gives
            # it no weights at all); real queries must sum to 1.
            rows = rows & case["attention_mask"][:, None, :]
        error = (weights.sum(dim=-1)[rows] - 1).abs().max().item()
        if error > TOLERANCE or weights.min().item() < 0:
            raise CheckFailed(
                f"weights rows sum to 1 ± {error:.3g} (min weight {weights.min().item():.3g}) "
                f"with {_describe(case)}"
            )


def check_fully_masked_rows_are_zero(subject: Subject) -> None:
    """A query with no visible key outputs exactly zero, never NaN, and stays trainable."""
    if not subject.caps.padding_mask:
        raise CheckSkipped("padding_mask not declared (no query can be fully masked)")
    module, x = subject.build(), subject.tokens().requires_grad_(True)
    all_padding = subject.padding_mask()
    all_padding[0] = False  # element 0: every key is padding, so all its queries are empty
    cases = [({"attention_mask": all_padding}, (0, slice(None)))]
    if subject.caps.causal:
        first_padded = subject.padding_mask()
        first_padded[:, 0] = False  # query 0 sees only key 0, which is padding
        cases.append(({"attention_mask": first_padded, "is_causal": True}, (slice(None), 0)))
    for case, empty_rows in cases:
        result = module(x, need_weights=subject.caps.need_weights, **case)
        rows = result.output[empty_rows]
        if not torch.isfinite(rows).all() or rows.abs().max().item() != 0:
            raise CheckFailed(
                f"fully masked query rows ({_describe(case)}) gave {rows.abs().max().item():.3g} "
                f"(NaN/inf: {not torch.isfinite(rows).all()}); they must be exactly 0"
            )
        if (
            result.weights is not None
            and result.weights[empty_rows[0], :, empty_rows[1]].abs().max() != 0
        ):
            raise CheckFailed(f"fully masked query rows have non-zero weights ({_describe(case)})")
        (result.output * subject.tokens(seed=5)).sum().backward()
        if not torch.isfinite(x.grad).all():
            raise CheckFailed(f"gradients are NaN/inf with a fully masked row ({_describe(case)})")
        x.grad = None


def check_gradients_reach_every_parameter(subject: Subject) -> None:
    """Backward gives a finite, non-zero gradient to every parameter and to the inputs."""
    module = subject.build().train()
    query = subject.tokens().requires_grad_(True)
    inputs = [query]
    output = module(query).output
    if subject.caps.cross_attention:
        memory = subject.tokens(seed=2).requires_grad_(True)
        inputs.append(memory)
        output = output + module(query, memory, memory).output
    (output * subject.tokens(seed=4)).sum().backward()
    for name, parameter in module.named_parameters():
        grad = parameter.grad
        if grad is None or not torch.isfinite(grad).all() or grad.abs().max().item() == 0:
            state = "no" if grad is None else "a zero or non-finite"
            raise CheckFailed(f"parameter {name!r} gets {state} gradient")
    for tensor in inputs:
        if tensor.grad is None or tensor.grad.abs().max().item() == 0:
            raise CheckFailed("the inputs get no gradient")


def check_eval_mode_is_deterministic(subject: Subject) -> None:
    """In eval mode two calls give identical outputs, dropout included."""
    overrides = {"dropout": 0.5} if "dropout" in _option_names(subject) else {}
    module, x = subject.build(**overrides), subject.tokens()
    difference = _max_difference(module(x).output, module(x).output)
    if difference != 0:
        raise CheckFailed(f"two eval-mode calls differ by {difference:.3g}")


def check_fast_matches_reference(subject: Subject) -> None:
    """impl="fast" equals impl="reference" (same weights) within 1e-5 in fp32 for every
    mask combination the variant declares: outputs, weights, and the gradients of the
    inputs and of every parameter."""
    if subject.cls.forward_fast is None:
        raise CheckSkipped("no fast path: impl='fast' runs the reference")
    fast, reference = subject.build(impl="fast"), subject.build(impl="reference")
    reference.load_state_dict(fast.state_dict())
    x = subject.tokens()
    for case in subject.mask_cases():
        for need_weights in {False, subject.caps.need_weights}:
            inputs = [x.clone().requires_grad_(True) for _ in range(2)]
            results = [
                module(tokens, need_weights=need_weights, **case)
                for module, tokens in zip((fast, reference), inputs, strict=False)
            ]
            label = f"{_describe(case)}, need_weights={need_weights}"
            difference = _max_difference(results[0].output, results[1].output)
            if difference > TOLERANCE:
                raise CheckFailed(
                    f"fast and reference outputs differ by {difference:.3g} ({label})"
                )
            if need_weights:
                difference = _max_difference(results[0].weights, results[1].weights)
                if difference > TOLERANCE:
                    raise CheckFailed(
                        f"fast and reference weights differ by {difference:.3g} ({label})"
                    )
            upstream = subject.tokens(seed=6)
            for module, result in zip((fast, reference), results, strict=True):
                module.zero_grad(set_to_none=True)
                (result.output * upstream).sum().backward()
            difference = _max_difference(inputs[0].grad, inputs[1].grad)
            if difference > 10 * TOLERANCE:
                raise CheckFailed(
                    f"fast and reference input gradients differ by {difference:.3g} ({label})"
                )
            references = dict(reference.named_parameters())
            for name, parameter in fast.named_parameters():
                other = references[name].grad
                if (parameter.grad is None) != (other is None):
                    raise CheckFailed(f"only one path gives {name!r} a gradient ({label})")
                if parameter.grad is not None:
                    difference = _max_difference(parameter.grad, other)
                    if difference > 10 * TOLERANCE:
                        raise CheckFailed(
                            f"fast and reference gradients of {name!r} differ by "
                            f"{difference:.3g} ({label})"
                        )


def _check_dtype(subject: Subject, dtype: torch.dtype, tolerance: float) -> None:
    if dtype not in subject.caps.dtypes:
        raise CheckSkipped(f"{dtype} not declared")
    x = subject.tokens()
    for case in subject.mask_cases():
        expected = subject.build()(x, **case).output.double()
        output = subject.build(dtype=dtype)(x.to(dtype), **case).output
        if output.dtype != dtype or not torch.isfinite(output).all():
            raise CheckFailed(f"{dtype} run gave dtype {output.dtype} or non-finite values")
        difference = _max_difference(output, expected) / max(expected.abs().max().item(), 1e-12)
        if difference > tolerance:
            raise CheckFailed(
                f"{dtype} output differs from float32 by {difference:.3g} of its scale "
                f"({_describe(case)}); allowed {tolerance}"
            )


def check_float64(subject: Subject) -> None:
    """Declared float64 works and agrees with float32 to 1e-4 of the output scale."""
    _check_dtype(subject, torch.float64, 1e-4)


def check_bfloat16(subject: Subject) -> None:
    """Declared bfloat16 works and agrees with float32 to 5e-2 of the output scale."""
    _check_dtype(subject, torch.bfloat16, 5e-2)


def check_large_magnitude_inputs(subject: Subject) -> None:
    """Inputs scaled by 1e3 give finite outputs (and weights) under every mask."""
    module, x = subject.build(), 1e3 * subject.tokens()
    for case in subject.mask_cases():
        result = module(x, need_weights=subject.caps.need_weights, **case)
        for label, tensor in (("output", result.output), ("weights", result.weights)):
            if tensor is not None and not torch.isfinite(tensor).all():
                raise CheckFailed(f"{label} has NaN/inf for inputs ×1e3 ({_describe(case)})")


def check_undeclared_features_raise(subject: Subject) -> None:
    """Each feature the variant does not declare raises UnsupportedFeature."""
    module, x = subject.build(), subject.tokens()
    caps = subject.caps
    requests: list[tuple[str, Callable[[], object]]] = []
    if not caps.causal:
        requests.append(("causal", lambda: module(x, is_causal=True)))
    if not caps.padding_mask:
        requests.append(("padding", lambda: module(x, attention_mask=subject.padding_mask())))
    if not caps.cross_attention:
        other = subject.tokens(seed=2)
        requests.append(("cross-attention", lambda: module(x, other, other)))
    if not caps.need_weights:
        requests.append(("need_weights", lambda: module(x, need_weights=True)))
    if caps.max_seq_len is not None:
        longer = subject.tokens(caps.max_seq_len + 1)
        requests.append(("a sequence over max_seq_len", lambda: module(longer)))
    undeclared = [d for d in (torch.float64, torch.bfloat16) if d not in caps.dtypes]
    for dtype in undeclared:
        requests.append((str(dtype), lambda dtype=dtype: module.to(dtype)(x.to(dtype))))
    if not requests:
        raise CheckSkipped("the variant declares every feature the suite can request")
    for feature, call in requests:
        try:
            call()
        except UnsupportedFeature:
            continue
        raise CheckFailed(f"asking for undeclared {feature} did not raise UnsupportedFeature")


def check_rejects_malformed_inputs(subject: Subject) -> None:
    """Wrong rank, wrong width and a non-bool mask raise InvalidInput."""
    module, x = subject.build(), subject.tokens()
    bad_calls: list[tuple[str, Callable[[], object]]] = [
        ("a 2-D query", lambda: module(x[0])),
        ("a query of the wrong width", lambda: module(x[..., :-1])),
    ]
    if subject.caps.padding_mask:
        bad_calls.append(
            ("a float mask", lambda: module(x, attention_mask=subject.padding_mask().float()))
        )
    for label, call in bad_calls:
        try:
            call()
        except InvalidInput:
            continue
        raise CheckFailed(f"{label} was accepted; it must raise InvalidInput")


def _option_names(subject: Subject) -> set[str]:
    return {f.name for f in dataclasses.fields(subject.cls.Config)}


CHECKS: tuple[Callable[[Subject], None], ...] = (
    check_output_shape_and_dtype,
    check_key_value_default_to_query,
    check_cross_attention,
    check_batch_independence,
    check_padding_invariance,
    check_padded_weights_are_zero,
    check_causality,
    check_weights_sum_to_one,
    check_fully_masked_rows_are_zero,
    check_gradients_reach_every_parameter,
    check_eval_mode_is_deterministic,
    check_fast_matches_reference,
    check_float64,
    check_bfloat16,
    check_large_magnitude_inputs,
    check_undeclared_features_raise,
    check_rejects_malformed_inputs,
)
"""Every check, in the order they run."""

IMPL_INDEPENDENT = {check_fast_matches_reference}
"""Checks that compare the two paths themselves, so they run once per variant."""
