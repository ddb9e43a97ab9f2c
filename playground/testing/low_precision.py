"""Low-precision numerics, FlashAttention's way: in bfloat16 and float16 a fast path may
be no less accurate than the plain computation in the same dtype.

FlashAttention's tests (Dao et al., `tests/test_flash_attn.py`) hold a kernel run in a
half-precision dtype to its error against a higher-precision reference: at most twice the
error of a plain PyTorch implementation run in that same dtype, plus a small absolute
slack for errors at the level of rounding itself. A bound relative to the dtype's own
achievable error, not a fixed tolerance, so it is as strict in float16 as in bfloat16 and
does not grow with what the variant computes. Here:

- exact: the variant's reference path in float64 (float32 where float64 is not declared),
  with the low-precision module's weights and inputs upcast, so that their rounding is
  nobody's error;
- naive: the same reference path run in the low dtype. It is the variant's own math
  written plainly, each operation on torch's kernels in that dtype: the dtype's fair
  error for that computation. Plain softmax attention would be another function for
  most variants (linear, low-rank, sigmoid, differential), so it is not the baseline;
- fast: `impl="fast"` in the low dtype, the path that runs.

Compared: the output, the gradient of every input and the gradient of every parameter
(a missing gradient counts as zeros), at the suite's ordinary length and its longest, for
every declared mask combination, for self attention and, where cross attention is
declared, for separate query, key and value tensors (FlashAttention's dq, dk, dv), in
eval mode (dropout would draw other numbers in each call). For each quantity, the
largest error of fast against exact over all those calls must be at most
`ERROR_FACTOR` times naive's largest, plus one rounding of the dtype (its unit roundoff,
half a unit in the last place) at the quantity's largest exact magnitude, at least 1:
what even a correctly rounded answer may be off by. (FlashAttention's slack, twice its
`ref + 0.3 - 0.3 - ref`, is of that size; the floor at 1 is the suite's scale, its
inputs being unit normal.) The errors are pooled over the calls because a quantity with
few independent entries, a learned scalar's gradient, is one draw of rounding per call,
and one draw against another is a coin toss; its largest over a dozen calls is not.

A quantity that is zero in exact arithmetic (a key bias's gradient under softmax, which
a constant shift of a query's scores does not change) is not compared: what each path
gives is rounding noise whose size is set by the order of its operations, not by their
precision (FlashAttention's own backward, which takes rowsum(dO ∘ O) from the rounded
output, makes about twice the plain computation's there). A variant without a fast path
has nothing to compare (its one path is the naive one) and is skipped, as
`check_fast_matches_reference` skips it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from playground.contract import AttentionVariant
from playground.testing.corners import CheckFailed, CheckSkipped
from playground.testing.subject import Subject, describe

ERROR_FACTOR = 2.0
"""How many times the naive path's error the fast path's may be (FlashAttention's 2)."""

EXACT_ZERO = 1e-10
"""An exact quantity no larger than this is zero (float64 rounds at about 1e-16 at the
suite's unit scale): its low-precision values are rounding noise only, see above."""

UPSTREAM_SEED = 6


def _exact_dtype(subject: Subject) -> torch.dtype:
    return torch.float64 if torch.float64 in subject.caps.dtypes else torch.float32


def _results(
    module: AttentionVariant,
    arguments: tuple[torch.Tensor, ...],
    upstream: torch.Tensor,
    case: dict[str, Any],
) -> dict[str, torch.Tensor]:
    """The output and the gradients of every input and parameter for one upstream
    gradient, each in float64 for comparison (a parameter the call leaves without a
    gradient gets zeros: the output does not depend on it)."""
    module.zero_grad(set_to_none=True)
    leaves = [argument.detach().clone().requires_grad_(True) for argument in arguments]
    output = module(*leaves, **case).output
    (output * upstream.to(output.dtype)).sum().backward()
    names = ("query", "key", "value")[: len(leaves)] if len(leaves) > 1 else ("input",)
    results = {"output": output.detach().double()}
    for name, leaf in zip(names, leaves, strict=True):
        gradient = leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)
        results[f"the gradient of the {name}"] = gradient.double()
    for name, parameter in module.named_parameters():
        gradient = parameter.grad if parameter.grad is not None else torch.zeros_like(parameter)
        results[f"the gradient of {name!r}"] = gradient.double()
    return results


def _largest_error(computed: torch.Tensor, exact: torch.Tensor) -> float:
    """max |computed − exact|, inf where computed is not finite (0 for empty tensors)."""
    if computed.numel() == 0:
        return 0.0
    return (computed - exact).abs().nan_to_num(float("inf")).max().item()


@dataclass
class _LargestErrors:
    """For one quantity (the output, or one gradient), over every call of the check: the
    largest error of each path, where the fast path's was made, and the largest exact
    magnitude."""

    fast: float = 0.0
    naive: float = 0.0
    magnitude: float = 0.0
    where: str = ""

    def add(self, fast: float, naive: float, magnitude: float, label: str) -> None:
        if not fast <= self.fast:  # a NaN error is kept: it is the one to report
            self.fast, self.where = fast, label
        self.naive = max(self.naive, naive)
        self.magnitude = max(self.magnitude, magnitude)


def _compare_call(
    modules: dict[str, AttentionVariant],
    arguments: tuple[torch.Tensor, ...],
    case: dict[str, Any],
    label: str,
    errors: dict[str, _LargestErrors],
) -> None:
    """One call of the fast, naive and exact modules on the same values (`arguments` in
    the low dtype, upcast for exact), its errors added to `errors` by quantity."""
    dtype = arguments[0].dtype
    generator = torch.Generator().manual_seed(UPSTREAM_SEED)
    upstream = torch.randn(arguments[0].shape, generator=generator).to(dtype)  # (B, Nq, E)
    exact_dtype = next(modules["exact"].parameters()).dtype
    exact = _results(modules["exact"], tuple(a.to(exact_dtype) for a in arguments), upstream, case)
    fast = _results(modules["fast"], arguments, upstream, case)
    naive = _results(modules["naive"], arguments, upstream, case)
    for name, truth in exact.items():
        magnitude = truth.abs().max().item() if truth.numel() else 0.0
        errors.setdefault(name, _LargestErrors()).add(
            _largest_error(fast[name], truth), _largest_error(naive[name], truth), magnitude, label
        )


def _assert_error_within_naive(
    errors: dict[str, _LargestErrors], dtype: torch.dtype, exact_dtype: torch.dtype
) -> None:
    """Each quantity's largest fast error is within ERROR_FACTOR times the naive one plus
    one rounding of `dtype` at its largest exact magnitude (at least 1); a quantity that
    is zero in exact arithmetic is not compared."""
    rounding = torch.finfo(dtype).eps / 2  # the unit roundoff: half a unit in the last place
    for name, largest in errors.items():
        if largest.magnitude <= EXACT_ZERO:
            continue
        slack = rounding * max(1.0, largest.magnitude)
        if not largest.fast <= ERROR_FACTOR * largest.naive + slack:
            raise CheckFailed(
                f"in {dtype}, the fast path's error in {name} reaches {largest.fast:.3g} "
                f"against the {exact_dtype} reference ({largest.where}), above "
                f"{ERROR_FACTOR:g} × the reference path's own largest error in {dtype} "
                f"({largest.naive:.3g}) + {slack:.3g} of rounding: the fast path loses "
                f"precision that the plain computation keeps (accumulate in float32, as "
                f"torch's kernels do)"
            )


def _check_error_within_naive(subject: Subject, dtype: torch.dtype) -> None:
    if dtype not in subject.caps.dtypes:
        raise CheckSkipped(f"{dtype} not declared")
    if subject.cls.forward_fast is None:
        raise CheckSkipped("no fast path: impl='fast' runs the reference, the naive path itself")
    exact_dtype = _exact_dtype(subject)
    modules = {
        "fast": subject.build(dtype, impl="fast"),
        "naive": subject.build(dtype, impl="reference"),
        "exact": subject.build(exact_dtype, impl="reference"),
    }
    for other in ("naive", "exact"):  # the low dtype's weights, upcast for exact
        modules[other].load_state_dict(modules["fast"].state_dict())
    errors: dict[str, _LargestErrors] = {}
    for n in sorted({subject.seq_len, subject.lengths[-1]}):
        x = subject.tokens(n, dtype=dtype)
        forms: dict[str, tuple[torch.Tensor, ...]] = {"self attention": (x,)}
        if subject.caps.cross_attention:
            key, value = (subject.tokens(n, seed=seed, dtype=dtype) for seed in (2, 3))
            forms["separate query, key and value"] = (x, key, value)
        for form, arguments in forms.items():
            for case in subject.mask_cases(n):
                label = f"n={n}, {form}, {describe(case)}"
                _compare_call(modules, arguments, case, label, errors)
    _assert_error_within_naive(errors, dtype, exact_dtype)


def check_bfloat16_error_within_naive(subject: Subject) -> None:
    """In declared bfloat16, the fast path's error against float64 is at most twice the
    reference path's own error in bfloat16 (plus rounding): output and every gradient."""
    _check_error_within_naive(subject, torch.bfloat16)


def check_float16_error_within_naive(subject: Subject) -> None:
    """In declared float16, the fast path's error against float64 is at most twice the
    reference path's own error in float16 (plus rounding): output and every gradient."""
    _check_error_within_naive(subject, torch.float16)


LOW_PRECISION_CHECKS = (check_bfloat16_error_within_naive, check_float16_error_within_naive)
