"""`flops()` checked independently: every efficiency figure divides a variant's own
`flops()` by a time, so the suite holds that formula to torch's
`torch.utils.flop_counter.FlopCounterMode`, which counts the matrix products a forward
pass really runs (mm, addmm, bmm, baddbmm, convolution, fused attention).

Counted: one forward in eval mode under no_grad, batch 1, of the path the variant says
its `flops()` describes (`flops_counted_path`: the reference by default), at every length
the suite tests from 2 (both sides of each special size, and 130 past them all), for self
attention and, where declared, cross attention with fewer and with more queries than
keys, at the suite's width (d_model 32, 4 heads) and at COUNTED_SHAPES where the variant
builds. The claim must lie within `flops_tolerance` of the count, as a share of it.

Which path: the reference by default, the math as written. A variant whose reference
does work its algorithm does not need declares "fast": linear attention and Performer
form the (Nq, Nk) matrix there, sliding-window attention and Longformer score every pair
and then mask, and Nyströmformer multiplies F̃ Ã⁺ first, m² more per query than its
paper's order. Their fast paths run exactly the products `flops()` claims.

What the counter sees, and what it does not:
- it counts matrix products only, each multiply-add as 2 (the convention of `flops()`).
  Softmax, exp, sums, masks, feature maps and every other elementwise operation are not
  counted; a `flops()` that claims products only matches the count exactly, and one that
  adds elementwise work (a gate, rotations, a bias or a sigmoid per score) declares it in
  `flops_uncounted`, within `flops_tolerance`;
- torch's counter has no formula for the CPU flash kernel that `scaled_dot_product_attention`
  runs on; COUNTED_ATTENTION gives it torch's own SDPA formula (Q Kᵀ and P V), counting only
  the (query, key) pairs the call's mask lets through: the useful work, what a block-sparse
  kernel (FlexAttention) does, where torch's formula counts every pair of every SDPA call;
- the playground's native CPU kernels (an extension module, float32 only) are invisible to
  it, so the count runs in float64 where the variant declares it, on torch's kernels.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from playground.contract import AttentionVariant
from playground.errors import ConfigError
from playground.testing.corners import CheckFailed
from playground.testing.subject import Subject

COUNTED_PATHS = ("reference", "fast")

COUNTED_SHAPES = ((64, 2), (64, 8))
"""(d_model, num_heads) counted besides the suite's own, where the variant builds at them:
a wider head, and more heads (so a per-head term shows)."""


def _flash_cpu_flops(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    attn_mask: torch.Tensor | None = None,
    out_val: Any = None,
    **_: Any,
) -> int:
    """Q Kᵀ and P V of `aten._scaled_dot_product_flash_attention_for_cpu` over the pairs it
    attends to: those its mask allows (a bool True, or an additive value above −inf), the
    lower triangle under is_causal, else every pair of (B, H, Nq, Nk)."""
    *batch, n_q, width = query.shape
    n_k, value_width = key.shape[-2], value.shape[-1]
    shape = (*batch, n_q, n_k)
    if attn_mask is not None:
        allowed = attn_mask if attn_mask.dtype == torch.bool else attn_mask > -math.inf
        pairs = int(allowed.expand(shape).sum())
    elif is_causal:
        pairs = math.prod(batch) * int(torch.ones(n_q, n_k, dtype=torch.bool).tril().sum())
    else:
        pairs = math.prod(shape)
    return 2 * pairs * width + 2 * pairs * value_width


_flash_cpu_flops._get_raw = True  # type: ignore[attr-defined]  # FlopCounterMode: tensors, not shapes

COUNTED_ATTENTION = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _flash_cpu_flops}
"""FlopCounterMode's `custom_mapping`: what it lacks for the CPU flash kernel."""


def counted_flops(
    module: AttentionVariant, n_q: int, n_k: int, cross: bool, dtype: torch.dtype
) -> int:
    """FlopCounterMode's total over one forward of `module` (eval, no_grad, batch 1):
    self attention on n_q = n_k tokens, or n_q queries over n_k keys and values."""
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, n_q, module.d_model, generator=generator).to(dtype)
    memory = torch.randn(1, n_k, module.d_model, generator=generator).to(dtype)
    arguments = (query, memory, memory) if cross else (query,)
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=COUNTED_ATTENTION) as mode:
        module(*arguments)
    return mode.get_total_flops()


def _declarations(cls: type[AttentionVariant]) -> tuple[str, float]:
    """The class's `flops_counted_path` and `flops_tolerance`, refused unless valid."""
    path, tolerance = cls.flops_counted_path, cls.flops_tolerance
    if path not in COUNTED_PATHS:
        raise CheckFailed(
            f"flops_counted_path is {path!r}; declare one of {COUNTED_PATHS}: the path whose "
            f"matrix products flops() claims"
        )
    if (
        isinstance(tolerance, bool)
        or not isinstance(tolerance, numbers.Real)
        or not 0 <= tolerance < 1
    ):
        raise CheckFailed(
            f"flops_tolerance is {tolerance!r}; declare a share of the count in [0, 1), such "
            f"as 0.05, for the work flops() includes that is no matrix product"
        )
    return path, float(tolerance)


def _counted_subjects(subject: Subject) -> list[Subject]:
    """The suite's subject and one per COUNTED_SHAPES that the variant builds at."""
    subjects = [subject]
    for d_model, num_heads in COUNTED_SHAPES:
        try:
            subjects.append(dataclasses.replace(subject, d_model=d_model, num_heads=num_heads))
        except (ConfigError, ValueError):
            continue  # a width or head count the variant refuses (an odd head, say)
    return subjects


def _calls(subject: Subject) -> list[tuple[int, int, bool]]:
    """(n_q, n_k, cross): self attention at every suite length from 2 (a product over one
    key is an outer product, which torch's einsum runs as an elementwise multiply that the
    counter does not see, and whose n_k = 1 multiplies are not multiply-adds); cross
    attention, where declared, with fewer and with more queries than keys, up to the
    longest length."""
    calls = [(n, n, False) for n in subject.lengths if n >= 2]
    if subject.caps.cross_attention:
        longest, few = subject.lengths[-1], max(2, subject.seq_len // 2)
        calls += [(few, longest, True), (longest, few + 1, True)]
    return calls


def check_flops_match_the_counter(subject: Subject) -> None:
    """`flops()` lies within the declared `flops_tolerance` of torch's FlopCounterMode
    over the declared path (eval, no_grad, batch 1), at every suite length, for self and
    cross attention, at several widths and head counts."""
    cls = subject.cls
    path, tolerance = _declarations(cls)
    dtype = torch.float64 if torch.float64 in subject.caps.dtypes else torch.float32
    uncounted = f" ({cls.flops_uncounted})" if cls.flops_uncounted else ""
    for shape in _counted_subjects(subject):
        module = shape.build(dtype, impl=path)
        for n_q, n_k, cross in _calls(shape):
            where = (
                f"n_q={n_q}, n_k={n_k}, {'cross' if cross else 'self'} attention, "
                f"d_model={shape.d_model}, num_heads={shape.num_heads}"
            )
            claimed = module.count_flops(n_q, n_k)
            if not isinstance(claimed, numbers.Real) or not math.isfinite(claimed):
                raise CheckFailed(f"flops() returned {claimed!r} ({where}); it must be finite")
            counted = counted_flops(module, n_q, n_k, cross, dtype)
            if counted == 0:
                raise CheckFailed(
                    f"FlopCounterMode counts no matrix product on the {path} path ({where}), "
                    f"so flops() ({claimed:.6g}) cannot be checked: a kernel the counter "
                    f"cannot see (a C++ extension) runs there; declare the path that runs "
                    f"torch's operations as flops_counted_path"
                )
            if abs(claimed - counted) > tolerance * counted:
                raise CheckFailed(
                    f"flops() claims {claimed:.6g} but FlopCounterMode counts {counted:.6g} "
                    f"over the {path} path ({where}): {claimed / counted:.3g} times the "
                    f"count, outside the declared flops_tolerance of ±{tolerance:g}"
                    f"{uncounted}. Fix flops(), or declare flops_counted_path as the path "
                    f"whose work it claims"
                )
