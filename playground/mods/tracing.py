"""A mod traced into a torch.fx graph, and how its operations are read.

`trace_mod` and `trace_mods` trace a `score_mod` (and a `mask_mod`) over symbolic
arguments, as FlexAttention traces its mods; the owner's parameters and buffers become the
root's attributes. The graph is the mod's code, so it holds for every length; it holds
only for the plain values the mod read while it was traced (a soft-cap switched on later
takes another branch), so callers trace again on every call. `positional`, `cast_dtype`
and `describe` read one operation of the graph the same way for the structure proof
(`mods.structure`) and for the lowering (`mods.lowering`).
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
import torch.fx

ARGUMENTS = ("score", "b", "h", "q_idx", "kv_idx")
ADDITIONS = {operator.add, torch.add, "add"}
SUBTRACTIONS = {operator.sub, torch.sub, "sub"}
CAST_METHODS = {
    "float": torch.float32, "double": torch.float64, "half": torch.float16,
    "bfloat16": torch.bfloat16, "long": torch.int64, "int": torch.int32,
    "short": torch.int16, "char": torch.int8, "byte": torch.uint8, "bool": torch.bool,
}  # fmt: skip
CASTS = {*CAST_METHODS, "to", "type", "type_as", torch.Tensor.to}
_OPERANDS: dict[Any, tuple[str, ...]] = {
    torch.where: ("condition", "input", "other"),
    "where": ("self", "condition", "other"),
    torch.pow: ("input", "exponent"),
    "pow": ("self", "exponent"),
}
_SYMBOLS = {
    operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/",
    operator.floordiv: "//", operator.mod: "%", operator.pow: "**", operator.neg: "unary -",
    operator.getitem: "indexing", operator.lt: "<", operator.le: "<=", operator.gt: ">",
    operator.ge: ">=", operator.eq: "==", operator.ne: "!=",
}  # fmt: skip


def positional(
    target: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """An operation's operands in torch's positional order, however the mod passed them:
    `torch.add(score, other=bias)` and `score.add(other=bias)` are add(score, bias), and
    `x.where(condition, y)` is where(condition, x, y). The keywords left (`alpha=`, `min=`,
    `dtype=`) are returned, for the caller to read or refuse."""
    method = isinstance(target, str)
    names = _OPERANDS.get(target, ("self", "other") if method else ("input", "other"))
    ordered, rest = list(args), dict(kwargs)
    for name in names[len(ordered) :]:
        if name not in rest:
            break
        ordered.append(rest.pop(name))
    if target == "where" and len(ordered) >= 2:  # x.where(condition, y)
        ordered[0], ordered[1] = ordered[1], ordered[0]
    return tuple(ordered), rest


def cast_dtype(target: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> torch.dtype | None:
    """The dtype a cast (`x.float()`, `x.to(torch.int64)`, `x.type_as(y)`) converts to;
    None when the call does not say (`x.to(other)`, a device alone)."""
    if target in CAST_METHODS:
        return CAST_METHODS[target]
    if target == "type_as":
        other = args[1] if len(args) > 1 else None
        return other.dtype if isinstance(other, torch.Tensor) else None
    dtypes = [x for x in (*args[1:], *kwargs.values()) if isinstance(x, torch.dtype)]
    return dtypes[0] if len(dtypes) == 1 else None


def keeps_every_value(source: torch.dtype, target: torch.dtype | None) -> bool:
    """A cast from `source` to `target` that changes no value: to a floating dtype that
    holds all of `source`'s (float32 to float64, bfloat16 to float32)."""
    return (
        target is not None
        and target.is_floating_point
        and torch.promote_types(source, target) == target
    )


class _Traced(torch.nn.Module):
    """The mod as a module's forward, its owner a submodule: the owner's parameters and
    buffers are then members of the traced root, which fx requires of parameters."""

    def __init__(self, score_mod: Callable[..., torch.Tensor], owner: torch.nn.Module | None):
        super().__init__()
        self.owner = owner
        self.score_mod = score_mod

    def forward(
        self,
        score: torch.Tensor,
        b: torch.Tensor,
        h: torch.Tensor,
        q_idx: torch.Tensor,
        kv_idx: torch.Tensor,
    ) -> torch.Tensor:
        return self.score_mod(score, b, h, q_idx, kv_idx)


class TracedMod(NamedTuple):
    """A mod's torch.fx graph, and the module its `get_attr` nodes name attributes of."""

    graph: torch.fx.Graph
    root: torch.nn.Module


def trace_mod(mod: Callable[..., torch.Tensor], owner: torch.nn.Module | None = None) -> TracedMod:
    """`mod` (a score_mod, or a mask_mod: its arguments are then b, h, q_idx and kv_idx)
    as a torch.fx graph over symbolic arguments; `owner`'s parameters and buffers are the
    root's attributes. Plain values the mod reads (a float option, an int attribute) are
    constants of this trace: trace again when they may have changed. (No GraphModule is
    built: its generated code, a third of a trace's time, is never run.)"""
    root = _TracedMask(mod, owner) if _arity(mod) == 4 else _Traced(mod, owner)
    return TracedMod(torch.fx.Tracer().trace(root), root)


class _TracedPair(torch.nn.Module):
    """A score_mod and a mask_mod (either may be None) as one forward: one trace."""

    def __init__(
        self,
        score_mod: Callable[..., torch.Tensor] | None,
        mask_mod: Callable[..., torch.Tensor] | None,
        owner: torch.nn.Module | None,
    ):
        super().__init__()
        self.owner = owner
        self.score_mod, self.mask_mod = score_mod, mask_mod

    def forward(
        self,
        score: torch.Tensor,
        b: torch.Tensor,
        h: torch.Tensor,
        q_idx: torch.Tensor,
        kv_idx: torch.Tensor,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        bias = None if self.score_mod is None else self.score_mod(score, b, h, q_idx, kv_idx)
        allowed = None if self.mask_mod is None else self.mask_mod(b, h, q_idx, kv_idx)
        return bias, allowed


def trace_mods(
    score_mod: Callable[..., torch.Tensor] | None,
    mask_mod: Callable[..., torch.Tensor] | None,
    owner: torch.nn.Module | None = None,
) -> TracedMod:
    """A score_mod and a mask_mod traced together (a trace's fixed cost paid once): the
    graph's output is (score_mod's, mask_mod's), None for a mod not given."""
    root = _TracedPair(score_mod, mask_mod, owner)
    return TracedMod(torch.fx.Tracer().trace(root), root)


def _arity(mod: Callable[..., torch.Tensor]) -> int:
    try:
        return len(inspect.signature(mod).parameters)
    except (TypeError, ValueError):
        return len(ARGUMENTS)


class _TracedMask(torch.nn.Module):
    """A mask_mod as `_Traced` holds a score_mod: its arguments are b, h, q_idx, kv_idx."""

    def __init__(self, mask_mod: Callable[..., torch.Tensor], owner: torch.nn.Module | None):
        super().__init__()
        self.owner = owner
        self.mask_mod = mask_mod

    def forward(
        self, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> torch.Tensor:
        return self.mask_mod(b, h, q_idx, kv_idx)


def operation_target(node: torch.fx.Node) -> Any:
    return node.target if node.op != "call_method" else str(node.target)


def describe(
    target: Any, args: tuple[Any, ...] = (), kwargs: Mapping[str, Any] | None = None
) -> str:
    """An operation as a reason names it: `tanh`, `*`, `a cast to torch.int64`."""
    if target in CASTS:
        dtype = cast_dtype(target, args, kwargs or {})
        return f"a cast to {dtype}" if dtype is not None else f"{target}() to an unread dtype"
    if target in _SYMBOLS:
        return _SYMBOLS[target]
    return str(getattr(target, "__name__", target))
