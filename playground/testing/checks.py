"""The contract checks: small named functions, each proving one promise of the contract
(docs/design.md, "The contract suite").

A check takes a `Subject` (a variant class, its options and impl, at a small size) and
returns None when the promise holds. It raises `CheckFailed` with a message saying what
broke, where and by how much, or `CheckSkipped` naming the undeclared capability that
makes the check meaningless. Checks skip only by declared capability.

The promises about masks, batches and time are checked in the corners (`corners.py`):
at every length of `Subject.lengths` (1, 2, both sides of each special size, a long
one), in eval and in train mode, for batches of three whose masks differ per element, for
every declared mask combination, and for gradients as well as values.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch

from playground.contract import AttentionOutput, AttentionVariant
from playground.errors import InvalidInput, UnsupportedFeature
from playground.masks import allowed_keys
from playground.testing.corners import (
    CheckFailed,
    CheckSkipped,
    assert_batch_independent,
    assert_causal,
    assert_empty_rows_are_zero,
    assert_padding_invariant,
    max_difference,
    running,
    tolerance_for,
    where,
)
from playground.testing.decoding_checks import DECODING_CHECKS
from playground.testing.flops import check_flops_match_the_counter
from playground.testing.hooks import check_learned_summary
from playground.testing.low_precision import LOW_PRECISION_CHECKS
from playground.testing.properties import check_property_search
from playground.testing.subject import LONG_LENGTH, MODES, Subject, describe

TOLERANCE = 1e-5  # fp32: fast vs reference
GRADIENT_TOLERANCE = 1e-4
"""fp32: fast vs reference gradients, relative to the largest reference gradient when
that is above 1 (a parameter's gradient sums over every query, key and batch element)."""


# --- what comes back --------------------------------------------------------------
def check_output_shape_and_dtype(subject: Subject) -> None:
    """Self-attention returns (B, N, d_model) in the input dtype, finite, at every
    length; weights only on request, (B, H, N, N)."""
    for n in subject.lengths:
        module, x = subject.build(), subject.tokens(n)
        with torch.no_grad():
            result = module(x)
        if not isinstance(result, AttentionOutput):
            raise CheckFailed(f"forward returned {type(result).__name__}, not AttentionOutput")
        if tuple(result.output.shape) != tuple(x.shape) or result.output.dtype != x.dtype:
            raise CheckFailed(
                f"output is {tuple(result.output.shape)} {result.output.dtype} at n={n}; "
                f"expected {tuple(x.shape)} {x.dtype}"
            )
        if result.weights is not None:
            raise CheckFailed("weights returned although need_weights=False")
        if not torch.isfinite(result.output).all():
            raise CheckFailed(_non_finite_output(subject, result.output, n))
        if subject.caps.need_weights:
            with torch.no_grad():
                weights = module(x, need_weights=True).weights
            expected = (subject.batch, subject.num_heads, n, n)
            if weights is None or tuple(weights.shape) != expected:
                got = None if weights is None else tuple(weights.shape)
                raise CheckFailed(
                    f"need_weights=True gave weights of shape {got} at n={n}; expected {expected}"
                )


def _non_finite_output(subject: Subject, output: torch.Tensor, n: int) -> str:
    """What a non-finite output on random inputs says, and its likely cause when whole
    query rows are NaN: every score of the row is -inf, so the softmax divides 0 by 0."""
    message = f"output has NaN or inf on ordinary (random, finite) inputs at n={n}"
    whole_rows = (~torch.isfinite(output)).all(dim=-1).nonzero().tolist()  # [[b, q], ...]
    if whole_rows and callable(getattr(subject.cls, "score_mod", None)):
        b, q = whole_rows[0]
        message += (
            f" ({len(whole_rows)} whole query row(s), the first at batch {b}, query {q}). "
            f"A score_mod that sets every score of a row to -inf leaves the softmax 0/0: "
            f"exclude keys with mask_mod instead (a query that may attend to no key "
            f"outputs zeros, as FlexAttention gives), or keep at least one score finite"
        )
    return message


def check_empty_inputs(subject: Subject) -> None:
    """A batch of 0, or no query (or no key), returns zeros of the contract's shape."""
    module = subject.build()
    x = subject.tokens()
    calls: dict[str, tuple[torch.Tensor, ...]] = {"batch 0": (x[:0],), "no query": (x[:, :0],)}
    if subject.caps.cross_attention:
        calls["no key"] = (x, x[:, :0], x[:, :0])
    for label, arguments in calls.items():
        try:
            with torch.no_grad():
                output = module(*arguments).output
        except Exception as error:
            raise CheckFailed(f"{label} raised {type(error).__name__}: {error}") from None
        expected = (arguments[0].shape[0], arguments[0].shape[1], subject.d_model)
        if tuple(output.shape) != expected or (output.numel() and output.abs().max() != 0):
            raise CheckFailed(f"{label} gave {tuple(output.shape)}; expected zeros of {expected}")


def check_key_value_default_to_query(subject: Subject) -> None:
    """forward(x) equals forward(x, x, x): key and value default to the query."""
    module, x = subject.build(), subject.tokens()
    with torch.no_grad():
        difference = max_difference(module(x).output, module(x, x, x).output)
    if difference > 0:
        raise CheckFailed(f"forward(x) and forward(x, x, x) differ by {difference:.3g}")


def check_cross_attention(subject: Subject) -> None:
    """Queries attend over a key/value sequence of another length, shorter or longer."""
    if not subject.caps.cross_attention:
        raise CheckSkipped("cross_attention not declared")
    module = subject.build()
    longest = subject.lengths[-1]
    for n_q, n_k in ((max(2, subject.seq_len // 2), subject.seq_len), (longest, 2), (1, longest)):
        query, memory = subject.tokens(n_q), subject.tokens(n_k, seed=2)
        with torch.no_grad():
            result = module(query, memory, memory, need_weights=subject.caps.need_weights)
            other = subject.tokens(n_k, seed=3)
            moved = module(query, other, other).output
        if tuple(result.output.shape) != (subject.batch, n_q, subject.d_model):
            raise CheckFailed(
                f"cross-attention output is {tuple(result.output.shape)} for Nq={n_q}, Nk={n_k}"
            )
        if result.weights is not None and tuple(result.weights.shape) != (
            subject.batch,
            subject.num_heads,
            n_q,
            n_k,
        ):
            raise CheckFailed(f"cross-attention weights are {tuple(result.weights.shape)}")
        if max_difference(result.output, moved) == 0:
            raise CheckFailed(
                f"the output does not depend on key/value (Nq={n_q}, Nk={n_k}): they are ignored"
            )


def cross_lengths(subject: Subject) -> list[tuple[int, int]]:
    """(Nq, Nk) pairs, queries shorter and longer than the keys, up to the longest suite
    length (so past every special size on the longer side)."""
    longest, n = subject.lengths[-1], subject.seq_len
    pairs = [(max(2, n // 2), n), (n, max(2, n // 4) + 1), (5, longest), (longest, 7)]
    return sorted(set(pairs), key=pairs.index)


def check_cross_attention_corners(subject: Subject) -> None:
    """Cross attention keeps the promises self attention does: queries shorter and longer
    than the keys, in eval and train mode, under every declared mask combination (the
    padding mask over the keys): each batch element is what it gets alone, padded keys
    and values change no output, and under is_causal query i sees no key j > i (values,
    and gradients in training)."""
    if not subject.caps.cross_attention:
        raise CheckSkipped("cross_attention not declared")
    for n_q, n_k in cross_lengths(subject):
        x, memory = subject.tokens(n_q), subject.tokens(n_k, seed=2)
        for mode in MODES:
            module = subject.build(mode=mode)
            for case in subject.mask_cases(n_k):
                assert_batch_independent(module, x, case, mode, memory)
                if "attention_mask" in case:
                    assert_padding_invariant(module, x, case, mode, memory)
                if case.get("is_causal"):
                    separate = {"query": x, "key": memory, "value": subject.tokens(n_k, seed=3)}
                    assert_causal(module, separate, case, mode, gradients=mode == "train")


# --- masks, batches and time, in the corners ---------------------------------------
def check_batch_independence(subject: Subject) -> None:
    """Each batch element's output is what it gets alone: every length, both modes,
    every mask combination, masks that differ per element."""
    for n, mode, case in subject.corners():
        assert_batch_independent(subject.build(mode=mode), subject.tokens(n), case, mode)


def check_padding_invariance(subject: Subject) -> None:
    """Changing a padded token (to noise, NaN or inf) never changes a real query's
    output: every length, both modes, with and without causal masking."""
    if not subject.caps.padding_mask:
        raise CheckSkipped("padding_mask not declared")
    for n, mode, case in subject.corners():
        if "attention_mask" in case:
            assert_padding_invariant(subject.build(mode=mode), subject.tokens(n), case, mode)


def check_padded_weights_are_zero(subject: Subject) -> None:
    """Padded keys get exactly zero attention weight, with and without causal masking."""
    if not (subject.caps.padding_mask and subject.caps.need_weights):
        raise CheckSkipped("needs padding_mask and need_weights")
    for n, mode, case in subject.corners():
        if "attention_mask" not in case:
            continue
        with running(mode):
            weights = subject.build(mode=mode)(subject.tokens(n), need_weights=True, **case).weights
        leaked = weights.masked_select(~case["attention_mask"][:, None, None, :])
        if leaked.numel() and leaked.abs().max().item() != 0:
            raise CheckFailed(
                f"a padded key got weight {leaked.abs().max().item():.3g} "
                f"({where(n, mode, case)}); it must be exactly 0"
            )


def check_causality(subject: Subject) -> None:
    """Under is_causal, output i depends on no token j > i: its value is unchanged by
    any future token (both modes), and in training its gradient with respect to every
    future query, key and value token is exactly zero. Every position, every length,
    with and without padding."""
    if not subject.caps.causal:
        raise CheckSkipped("causal not declared")
    for n, mode, case in subject.corners():
        if not case.get("is_causal"):
            continue
        module, x = subject.build(mode=mode), subject.tokens(n)
        training = mode == "train"
        assert_causal(module, {"query": x}, case, mode, gradients=training)
        if subject.caps.cross_attention and training and "attention_mask" in case:
            key, value = subject.tokens(n, seed=2), subject.tokens(n, seed=3)
            separate = {"query": x, "key": key, "value": value}
            assert_causal(module, separate, case, mode, gradients=True)
        if subject.caps.need_weights:
            with running(mode):
                weights = module(x, need_weights=True, **case).weights
            future = weights.triu(diagonal=1).abs().max().item()
            if future != 0:
                raise CheckFailed(f"a future key got weight {future:.3g} ({where(n, mode, case)})")


def check_weights_sum_to_one(subject: Subject) -> None:
    """Every real query that can see a key has non-negative weights summing to 1, or as
    much of that as the variant declares (`weights_sum_to_one`, `weights_nonnegative`)."""
    caps = subject.caps
    if not caps.need_weights:
        raise CheckSkipped("need_weights not declared")
    if not (caps.weights_sum_to_one or caps.weights_nonnegative):
        raise CheckSkipped("the weights are declared neither to sum to 1 nor non-negative")
    for n, mode, case in subject.corners():
        with running(mode):
            weights = subject.build(mode=mode)(subject.tokens(n), need_weights=True, **case).weights
        allowed = allowed_keys(case.get("attention_mask"), n, n, case.get("is_causal", False))
        rows = torch.ones(weights.shape[:-1], dtype=torch.bool)
        if allowed is not None:
            rows = allowed.any(dim=-1).expand_as(rows)
        if "attention_mask" in case:
            # A padded query's row is the variant's to define (Longformer, like HF, gives
            # it no weights at all); real queries must sum to 1.
            rows = rows & case["attention_mask"][:, None, :]
        error = (weights.sum(dim=-1)[rows] - 1).abs().max().item() if rows.any() else 0.0
        negative = weights.min().item() < 0
        if (caps.weights_sum_to_one and error > TOLERANCE) or (
            caps.weights_nonnegative and negative
        ):
            raise CheckFailed(
                f"weights rows sum to 1 ± {error:.3g} (min weight {weights.min().item():.3g}) "
                f"({where(n, mode, case)})"
            )


def check_fully_masked_rows_are_zero(subject: Subject) -> None:
    """A query with no visible key outputs exactly zero, never NaN, and stays trainable."""
    if not subject.caps.padding_mask:
        raise CheckSkipped("padding_mask not declared (no query can be fully masked)")
    for n in (subject.seq_len, subject.lengths[-1]):
        nothing = subject.padding_mask(n)
        nothing[0] = False  # element 0: every key is padding, so all its queries are empty
        cases: list[tuple[dict[str, Any], torch.Tensor]] = [
            ({"attention_mask": nothing}, ~nothing.any(dim=-1, keepdim=True).expand(-1, n))
        ]
        if subject.caps.causal:
            first_padded = subject.padding_mask(n)
            first_padded[:, 0] = False  # query 0 sees only key 0, which is padding
            empty = ~first_padded.cumsum(dim=-1).bool()  # no real key at or before i
            cases.append(({"attention_mask": first_padded, "is_causal": True}, empty))
        for mode in MODES:
            for case, empty in cases:
                module = subject.build(mode=mode)
                assert_empty_rows_are_zero(
                    module, subject.tokens(n), case, empty, mode, subject.caps.need_weights
                )


# --- training ----------------------------------------------------------------------
def check_gradients_reach_every_parameter(subject: Subject) -> None:
    """Backward gives a finite, non-zero gradient to every parameter and to the inputs."""
    for n in (subject.seq_len, subject.lengths[-1]):
        module = subject.build(mode="train")
        query = subject.tokens(n).requires_grad_(True)
        inputs = [query]
        output = module(query).output
        if subject.caps.cross_attention:
            memory = subject.tokens(n, seed=2).requires_grad_(True)
            inputs.append(memory)
            output = output + module(query, memory, memory).output
        (output * subject.tokens(n, seed=4)).sum().backward()
        for name, parameter in module.named_parameters():
            grad = parameter.grad
            if grad is None or not torch.isfinite(grad).all() or grad.abs().max().item() == 0:
                state = "no" if grad is None else "a zero or non-finite"
                raise CheckFailed(f"parameter {name!r} gets {state} gradient at n={n}")
        for tensor in inputs:
            if tensor.grad is None or tensor.grad.abs().max().item() == 0:
                raise CheckFailed(f"the inputs get no gradient at n={n}")


def check_eval_mode_is_deterministic(subject: Subject) -> None:
    """In eval mode two calls give identical outputs, dropout included."""
    overrides: dict[str, Any] = {"dropout": 0.5} if "dropout" in _option_names(subject) else {}
    module, x = subject.build(**overrides), subject.tokens()
    with torch.no_grad():
        difference = max_difference(module(x).output, module(x).output)
    if difference != 0:
        raise CheckFailed(f"two eval-mode calls differ by {difference:.3g}")


def check_training_randomness_is_declared(subject: Subject) -> None:
    """Training is as random as declared: two training-mode calls agree exactly when
    `deterministic_in_training`, and differ under different seeds when it is not."""
    module = subject.build().train()  # built for eval: no seeding hook
    x = subject.tokens()
    with torch.no_grad():
        torch.manual_seed(1)
        first = module(x).output
        torch.manual_seed(2)
        second = module(x).output
    difference = max_difference(first, second)
    if subject.caps.deterministic_in_training and difference != 0:
        raise CheckFailed(
            f"two training-mode calls differ by {difference:.3g}, but the variant does not "
            f"declare deterministic_in_training=False"
        )
    if not subject.caps.deterministic_in_training and difference == 0:
        raise CheckFailed(
            "declared random in training (deterministic_in_training=False), but two "
            "training-mode calls under different seeds agree exactly"
        )


def check_fast_matches_reference(subject: Subject) -> None:
    """impl="fast" equals impl="reference" (same weights) within 1e-5 in fp32 at every
    length, in both modes, for every mask combination the variant declares (and for
    cross-attention when declared): outputs, weights, and the gradients of the inputs and
    of every parameter."""
    if subject.cls.forward_fast is None:
        raise CheckSkipped("no fast path: impl='fast' runs the reference")
    for n, mode, case in subject.corners():
        fast, reference = (
            subject.build(impl="fast", mode=mode),
            subject.build(impl="reference", mode=mode),
        )
        reference.load_state_dict(fast.state_dict())
        _compare_paths(subject, fast, reference, (subject.tokens(n),), case, where(n, mode, case))
    if subject.caps.cross_attention:
        fast, reference = subject.build(impl="fast"), subject.build(impl="reference")
        reference.load_state_dict(fast.state_dict())
        longest = subject.lengths[-1]
        for n_q, n_k in ((longest, 2), (3, longest)):
            arguments = (
                subject.tokens(n_q),
                subject.tokens(n_k, seed=2),
                subject.tokens(n_k, seed=3),
            )
            _compare_paths(subject, fast, reference, arguments, {}, f"cross Nq={n_q}, Nk={n_k}")
    if _declared_cause(subject) and torch.float64 in subject.caps.dtypes:
        # In float32 the native kernels evaluate the mod's bias themselves, whatever the
        # class declares; float64 takes the path the declaration chooses.
        n = subject.lengths[-1]
        fast, reference = (
            subject.build(torch.float64, impl=impl) for impl in ("fast", "reference")
        )
        reference.load_state_dict(fast.state_dict())
        tokens = subject.tokens(n, dtype=torch.float64)
        _compare_paths(subject, fast, reference, (tokens,), {}, f"float64, n={n}")


DECLARATIONS = {
    "additive_score_mod": "score + f(b, h, q_idx, kv_idx)",
    "relative_score_mod": "score + g(h, kv_idx - q_idx)",
}
"""Promises a class may make about its score_mod that its fast path relies on; when fast
and reference disagree, a false one is the likely cause."""


def _declared_cause(subject: Subject) -> str:
    """The sentence a fast-versus-reference failure ends with when the class declares a
    promise the fast path relies on."""
    declared = [name for name in DECLARATIONS if getattr(subject.cls, name, False) is True]
    if not declared:
        return ""
    promises = " and ".join(
        f"{name} = True (score_mod is {DECLARATIONS[name]})" for name in declared
    )
    return (
        f"; the class declares {promises} and the fast path relies on it, so a score_mod "
        f"that is not of that form is the likely cause: remove the declaration, or make "
        f"score_mod keep that form"
    )


def _compare_paths(
    subject, fast, reference, arguments, case, label, gradient_tolerance=GRADIENT_TOLERANCE
) -> None:
    cause = _declared_cause(subject)

    def differ(what: str, difference: float, context: str) -> CheckFailed:
        return CheckFailed(
            f"fast and reference {what} differ by {difference:.3g} ({context}){cause}"
        )

    for need_weights in {False, subject.caps.need_weights}:
        inputs = [[a.clone().requires_grad_(True) for a in arguments] for _ in range(2)]
        results = [
            module(*tensors, need_weights=need_weights, **case)
            for module, tensors in zip((fast, reference), inputs, strict=True)
        ]
        context = f"{label}, need_weights={need_weights}"
        difference = max_difference(results[0].output, results[1].output)
        if not difference <= TOLERANCE:
            raise differ("outputs", difference, context)
        if need_weights:
            difference = max_difference(results[0].weights, results[1].weights)
            if not difference <= TOLERANCE:
                raise differ("weights", difference, context)
        upstream = torch.randn(results[0].output.shape, generator=torch.Generator().manual_seed(6))
        for module, result in zip((fast, reference), results, strict=True):
            module.zero_grad(set_to_none=True)
            (result.output * upstream).sum().backward()
        labels = ("query", "key", "value")
        for index, (fast_input, reference_input) in enumerate(zip(*inputs, strict=True)):
            # An input the output does not depend on (a variant that ignores key and
            # value, say) has no gradient on either path: that agrees, and other checks
            # judge whether it should.
            if (fast_input.grad is None) != (reference_input.grad is None):
                raise CheckFailed(
                    f"only one path gives the {labels[index]} input a gradient ({context}){cause}"
                )
            if fast_input.grad is None:
                continue
            difference = max_difference(fast_input.grad, reference_input.grad)
            if not difference <= tolerance_for(reference_input.grad, gradient_tolerance):
                raise differ("input gradients", difference, context)
        references = dict(reference.named_parameters())
        for name, parameter in fast.named_parameters():
            other = references[name].grad
            if (parameter.grad is None) != (other is None):
                raise CheckFailed(f"only one path gives {name!r} a gradient ({context}){cause}")
            if parameter.grad is not None:
                difference = max_difference(parameter.grad, other)
                if not difference <= tolerance_for(other, gradient_tolerance):
                    raise differ(f"gradients of {name!r}", difference, context)


# --- dtypes ------------------------------------------------------------------------
def _check_dtype(subject: Subject, dtype: torch.dtype, agreement: float) -> None:
    """Agreement with fp32 to `agreement` of the output scale, and the mask, batch and
    causality promises in that dtype too."""
    if dtype not in subject.caps.dtypes:
        raise CheckSkipped(f"{dtype} not declared")
    for n in (subject.seq_len, subject.lengths[-1]):
        x = subject.tokens(n)
        for case in subject.mask_cases(n):
            with torch.no_grad():
                expected = subject.build()(x, **case).output.double()
                output = subject.build(dtype=dtype)(x.to(dtype), **case).output
            if output.dtype != dtype or not torch.isfinite(output).all():
                raise CheckFailed(
                    f"{dtype} run gave dtype {output.dtype} or non-finite values at n={n}"
                )
            scale = max(expected.abs().max().item(), 1e-12)
            difference = max_difference(output, expected) / scale
            if difference > agreement:
                raise CheckFailed(
                    f"{dtype} output differs from float32 by {difference:.3g} of its scale "
                    f"(n={n}, {describe(case)}); allowed {agreement}"
                )
    for n, mode, case in subject.corners():
        if n == LONG_LENGTH or (mode == "train" and n != subject.seq_len):
            continue  # fp32 covers training at every length and the long one
        module, x = subject.build(dtype=dtype, mode=mode), subject.tokens(n, dtype=dtype)
        if mode == "train":
            _assert_finite_gradients(module, x, case, f"in {dtype}, {where(n, mode, case)}")
        try:
            assert_batch_independent(module, x, case, mode)
            if "attention_mask" in case:
                assert_padding_invariant(module, x, case, mode)
            if case.get("is_causal"):
                assert_causal(module, {"query": x}, case, mode, gradients=False)
        except CheckFailed as failed:
            raise CheckFailed(f"in {dtype}: {failed}") from None


def _assert_finite_gradients(module, x: torch.Tensor, case: dict, label: str) -> None:
    """One backward in the module's dtype runs and leaves finite gradients everywhere."""
    x = x.clone().requires_grad_(True)
    try:
        module(x, **case).output.sum().backward()
    except RuntimeError as error:
        raise CheckFailed(f"backward failed {label}: {error}") from None
    gradients = {"the input": x.grad} | {
        repr(name): parameter.grad for name, parameter in module.named_parameters()
    }
    for name, gradient in gradients.items():
        if gradient is not None and not torch.isfinite(gradient).all():
            raise CheckFailed(f"non-finite gradient of {name} {label}")


FLOAT64_GRADIENT_TOLERANCE = 1e-10
"""float64: fast vs reference gradients, relative as GRADIENT_TOLERANCE. Rounding is
about 1e−16 there, so an approximation in a fast path's backward that float32's
tolerance would let pass shows."""


def check_float64(subject: Subject) -> None:
    """Declared float64 works, agrees with float32 to 1e-4 of the output scale, keeps the
    mask, batch and causality promises, and its fast path's gradients equal the
    reference's to 1e-10 (relative) at the longest length, under every mask."""
    _check_dtype(subject, torch.float64, 1e-4)
    if subject.cls.forward_fast is None:
        return
    n = subject.lengths[-1]
    for case in subject.mask_cases(n):
        fast, reference = (
            subject.build(torch.float64, "train", impl=impl) for impl in ("fast", "reference")
        )
        reference.load_state_dict(fast.state_dict())
        tokens = (subject.tokens(n, dtype=torch.float64),)
        label = f"float64, {where(n, 'train', case)}"
        _compare_paths(subject, fast, reference, tokens, case, label, FLOAT64_GRADIENT_TOLERANCE)


def check_bfloat16(subject: Subject) -> None:
    """Declared bfloat16 works, agrees with float32 to 5e-2 of the output scale, and
    keeps the mask, batch and causality promises."""
    _check_dtype(subject, torch.bfloat16, 5e-2)


def check_float16(subject: Subject) -> None:
    """Declared float16 works, agrees with float32 to 1e-2 of the output scale, and
    keeps the mask, batch and causality promises."""
    _check_dtype(subject, torch.float16, 1e-2)


def check_large_magnitude_inputs(subject: Subject) -> None:
    """Inputs scaled by 1e3 give finite outputs (and weights) under every mask."""
    for n in (subject.seq_len, subject.lengths[-1]):
        module, x = subject.build(), 1e3 * subject.tokens(n)
        for case in subject.mask_cases(n):
            with torch.no_grad():
                result = module(x, need_weights=subject.caps.need_weights, **case)
            for label, tensor in (("output", result.output), ("weights", result.weights)):
                if tensor is not None and not torch.isfinite(tensor).all():
                    raise CheckFailed(
                        f"{label} has NaN/inf for inputs ×1e3 (n={n}, {describe(case)})"
                    )


# --- refusals ----------------------------------------------------------------------
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
        requests.append((str(dtype), functools.partial(_converted_forward, module, x, dtype)))
    if not requests:
        raise CheckSkipped("the variant declares every feature the suite can request")
    for feature, call in requests:
        try:
            call()
        except UnsupportedFeature:
            continue
        raise CheckFailed(f"asking for undeclared {feature} did not raise UnsupportedFeature")


def _converted_forward(
    module: AttentionVariant, x: torch.Tensor, dtype: torch.dtype
) -> AttentionOutput:
    """The forward of module and x, both converted to `dtype` when it runs: after the
    other requests, which need the module as built (`.to` converts it in place)."""
    return module.to(dtype)(x.to(dtype))


def check_rejects_malformed_inputs(subject: Subject) -> None:
    """Wrong rank, wrong width, a non-bool mask or flag, and an input in another dtype
    than the module's raise InvalidInput."""
    module, x = subject.build(), subject.tokens()
    # A declared dtype other than the module's: an undeclared one is refused earlier, as
    # UnsupportedFeature (check_undeclared_features_raise covers that).
    other_dtypes = [d for d in subject.caps.dtypes if d != x.dtype]
    bad_calls: list[tuple[str, Callable[[], object]]] = [
        ("a 2-D query", lambda: module(x[0])),
        ("a query of the wrong width", lambda: module(x[..., :-1])),
        ("need_weights='yes'", lambda: module(x, need_weights="yes")),
    ]
    if other_dtypes and any(p.is_floating_point() for p in module.parameters()):
        other = other_dtypes[0]
        bad_calls.append((f"a {other} input", lambda: module(x.to(other))))
    if subject.caps.causal:
        bad_calls.append(("is_causal='False'", lambda: module(x, is_causal="False")))
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
    check_empty_inputs,
    check_key_value_default_to_query,
    check_cross_attention,
    check_cross_attention_corners,
    check_batch_independence,
    check_padding_invariance,
    check_padded_weights_are_zero,
    check_causality,
    check_weights_sum_to_one,
    check_training_randomness_is_declared,
    check_fully_masked_rows_are_zero,
    check_gradients_reach_every_parameter,
    check_eval_mode_is_deterministic,
    check_fast_matches_reference,
    check_float64,
    check_bfloat16,
    check_float16,
    *LOW_PRECISION_CHECKS,
    check_large_magnitude_inputs,
    check_undeclared_features_raise,
    check_rejects_malformed_inputs,
    check_flops_match_the_counter,
    check_learned_summary,
    *DECODING_CHECKS,
    check_property_search,
)
"""Every check, in the order they run."""

IMPL_INDEPENDENT = {
    check_fast_matches_reference,
    *LOW_PRECISION_CHECKS,
    check_flops_match_the_counter,
    check_learned_summary,
}
"""Checks that compare the two paths themselves, or choose their path or none (the
FLOPs count runs the declared one), so they run once per variant."""

__all__ = ["CHECKS", "IMPL_INDEPENDENT", "CheckFailed", "CheckSkipped", "Subject"]
