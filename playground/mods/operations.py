"""How each operation of a mod that reads both q_idx and kv_idx becomes instructions of a
mod program: arithmetic, comparisons, logic, where, clamp, casts, exp/log/sqrt and table
lookups, each with torch's promotion and integer semantics (`mods.lowering`).

A lowering table keyed by operation, as torch's inductor registers its lowerings
(`register_lowering(aten.add)`): each function below is registered for the targets a
traced graph names the operation by (the Python operator, the torch function, the
Tensor method's name) and for the keyword arguments it reads; `lower_node` looks the
target up, refuses a keyword no lowering reads, and calls it. An operation outside the
table is refused with its name, and the caller keeps torch's path.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import torch

from playground.mods.program import (
    EXACT,
    Builder,
    NotLowered,
    Slot,
    bounds_of,
    dtype_of,
    exact_integer_op,
    result_dtype,
    storage_dtype,
)
from playground.mods.tracing import describe

Lowering = Callable[[Builder, Any, tuple, dict], Slot]
"""lowering(builder, target, args, kwargs) -> the slot of the node's value; `args` in
torch's positional order (`mods.tracing.positional`), `kwargs` the keywords it reads."""
LOWERINGS: dict[Any, tuple[Lowering, frozenset[str]]] = {}
"""target -> (its lowering, the keyword arguments it reads)."""


def register_lowering(*targets: Any, keywords: frozenset[str] | set[str] = frozenset()):
    """Register the decorated function as the lowering of `targets`, reading `keywords`
    (any other keyword argument is refused, never ignored)."""

    def register(lowering: Lowering) -> Lowering:
        for target in targets:
            assert target not in LOWERINGS, f"two lowerings of {target!r}"
            LOWERINGS[target] = (lowering, frozenset(keywords))
        return lowering

    return register


def lower_node(builder: Builder, target: Any, args: tuple, kwargs: dict) -> Slot:
    """One instruction (or a few) for a node that reads both q_idx and kv_idx; `args` in
    torch's positional order."""
    entry = LOWERINGS.get(target)
    if entry is None:
        raise NotLowered(f"the operation {describe(target, args, kwargs)}")
    lowering, keywords = entry
    unread = set(kwargs) - keywords
    if unread:
        name = describe(target, args, kwargs)
        raise NotLowered(f"{name} with the keyword arguments {sorted(unread)}")
    return lowering(builder, target, args, dict(kwargs))


def _prefix(dtype: torch.dtype) -> str:
    """The opcode family of values of `dtype`: float lanes or integer lanes."""
    return "F_" if dtype.is_floating_point else "I_"


# --- arithmetic: +, −, ·, minimum, maximum ------------------------------------------------
ARITHMETIC = {
    operator.add: "ADD", torch.add: "ADD", "add": "ADD",
    operator.sub: "SUB", torch.sub: "SUB", "sub": "SUB",
    operator.mul: "MUL", torch.mul: "MUL", "mul": "MUL",
    torch.minimum: "MIN", "minimum": "MIN", torch.maximum: "MAX", "maximum": "MAX",
}  # fmt: skip
# How each operation promotes its operands (minimum and maximum take no Python numbers,
# but promote as add does).
PROMOTES: dict[str, Callable[..., Any]] = {"ADD": torch.add, "SUB": torch.sub, "MUL": torch.mul, "MIN": torch.add,
            "MAX": torch.add}  # fmt: skip


@register_lowering(*(t for t, op in ARITHMETIC.items() if op in ("ADD", "SUB")), keywords={"alpha"})
@register_lowering(*(t for t, op in ARITHMETIC.items() if op in ("MUL", "MIN", "MAX")))
def _lower_arithmetic(builder: Builder, target: Any, args: tuple, kwargs: dict) -> Slot:
    alpha = kwargs.pop("alpha", 1)
    if len(args) != 2 or isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        name = describe(target, args, kwargs)
        raise NotLowered(f"{name} with {len(args)} operands and alpha={alpha!r}")
    if alpha != 1:  # add(a, b, alpha=c) is a + c · b
        number = isinstance(args[1], (int, float))
        scaled: Any = (
            args[1] * alpha if number else lower_node(builder, operator.mul, (args[1], alpha), {})
        )
        args = (args[0], scaled)
    operation = ARITHMETIC[target]
    dtype = result_dtype(PROMOTES[operation], *args)
    if dtype == torch.bool:
        raise NotLowered(f"{describe(target, args, kwargs)} of two bools")
    if dtype == torch.int64 and (exact := exact_integer_op(builder, operation, *args)):
        return exact
    a, b = (builder.value(x, dtype) for x in args)
    return builder.emit(_prefix(dtype) + operation, dtype, a, b)


@register_lowering(
    operator.truediv, torch.div, torch.true_divide, "div", "true_divide",
    keywords={"rounding_mode"},
)  # fmt: skip
def _lower_division(builder: Builder, target: Any, args: tuple, kwargs: dict) -> Slot:
    mode = kwargs.pop("rounding_mode", None)
    if len(args) != 2 or mode not in (None, "floor"):
        raise NotLowered(f"{describe(target, args, kwargs)} with {kwargs or mode}")
    if mode == "floor":
        return lower_node(builder, operator.floordiv, args, {})
    dtype = result_dtype(torch.true_divide, *args)
    a, b = (builder.value(x, dtype) for x in args)
    return builder.emit("F_DIV", dtype, a, b)


FLOOR_DIVISIONS = (operator.floordiv, torch.floor_divide, "floor_divide", "__floordiv__")


@register_lowering(
    *FLOOR_DIVISIONS, operator.mod, torch.remainder, "remainder", "__mod__"
)  # fmt: skip
def _lower_integer_division(builder: Builder, target: Any, args: tuple, kwargs: dict) -> Slot:
    dtype = result_dtype(torch.floor_divide, *args)
    if dtype.is_floating_point or dtype == torch.bool:
        raise NotLowered(f"{describe(target, args, kwargs)} of {dtype} values")
    a, b = (builder.value(x, dtype) for x in args)
    return builder.emit("I_FLOOR_DIV" if target in FLOOR_DIVISIONS else "I_MOD", dtype, a, b)


# --- comparisons and logic ----------------------------------------------------------------
COMPARISONS = {
    operator.lt: "LT", torch.lt: "LT", "lt": "LT",
    operator.le: "LE", torch.le: "LE", "le": "LE",
    operator.gt: "GT", torch.gt: "GT", "gt": "GT",
    operator.ge: "GE", torch.ge: "GE", "ge": "GE",
    operator.eq: "EQ", torch.eq: "EQ", "eq": "EQ",
    operator.ne: "NE", torch.ne: "NE", "ne": "NE",
}  # fmt: skip


@register_lowering(*COMPARISONS)
def _lower_comparison(builder: Builder, target: Any, args: tuple, kwargs: dict) -> Slot:
    if len(args) != 2:
        raise NotLowered(f"{describe(target, args, kwargs)} with {len(args)} arguments")
    dtype = result_dtype(torch.add, *args)  # the type both are compared in
    dtype = torch.int64 if dtype == torch.bool else dtype
    args = tuple(builder.value(x) if isinstance(x, torch.Tensor) else x for x in args)
    known = [bounds_of(x) for x in args]
    if dtype == torch.int64 and all(e is not None and max(map(abs, e)) <= EXACT for e in known):
        dtype = torch.float32  # integers held as floats compare as floats, exactly
    relation = COMPARISONS[target]
    a, b = (builder.value(x, dtype) for x in args)
    if relation in ("GT", "GE"):
        relation, a, b = {"GT": "LT", "GE": "LE"}[relation], b, a
    return builder.emit(_prefix(dtype) + relation, torch.bool, a, b)


LOGICAL = {
    operator.and_: "I_AND", torch.logical_and: "I_AND", "logical_and": "I_AND",
    operator.or_: "I_OR", torch.logical_or: "I_OR", "logical_or": "I_OR",
    operator.xor: "I_XOR", torch.logical_xor: "I_XOR", "logical_xor": "I_XOR",
}  # fmt: skip


@register_lowering(*LOGICAL)
def _lower_logical(builder: Builder, target: Any, args: tuple, kwargs: dict) -> Slot:
    dtypes = {dtype_of(x) for x in args}
    if len(args) != 2 or not dtypes <= {torch.bool}:
        raise NotLowered(f"{describe(target, args, kwargs)} of {sorted(map(str, dtypes))} values")
    a, b = (builder.value(x) for x in args)
    return builder.emit(LOGICAL[target], torch.bool, a, b)


@register_lowering(operator.invert, torch.logical_not, "logical_not", "bitwise_not")
def _lower_not(builder: Builder, target: Any, args: tuple, kwargs: dict) -> Slot:
    if dtype_of(args[0]) != torch.bool:
        raise NotLowered("~ of a value that is not bool")
    return builder.emit("I_NOT", torch.bool, builder.value(args[0]))


@register_lowering(torch.where, "where")
def _lower_where(builder: Builder, target: Any, args: tuple, kwargs: dict) -> Slot:
    if len(args) != 3 or dtype_of(args[0]) != torch.bool:
        raise NotLowered("where(condition, x, y) with a bool condition only")
    dtype = result_dtype(torch.add, args[1], args[2])
    condition = builder.value(args[0])
    x, y = builder.value(args[1], dtype), builder.value(args[2], dtype)
    return builder.emit(_prefix(dtype) + "WHERE", dtype, condition, x, y)


# --- one operand: −x, |x|, exp, log, sqrt, x ** 2, casts ------------------------------------
NEGATIONS = (operator.neg, torch.neg, "neg")


@register_lowering(*NEGATIONS, operator.abs, torch.abs, "abs")
def _lower_sign(builder: Builder, target: Any, args: tuple, kwargs: dict) -> Slot:
    dtype = dtype_of(args[0])
    if dtype == torch.bool:
        raise NotLowered(f"{describe(target, args, kwargs)} of a bool")
    which = "NEG" if target in NEGATIONS else "ABS"
    if dtype == torch.int64 and (exact := exact_integer_op(builder, which, args[0])):
        return exact
    return builder.emit(_prefix(dtype) + which, dtype, builder.value(args[0], dtype))


UNARY_FLOAT = {
    torch.exp: "F_EXP", "exp": "F_EXP", torch.log: "F_LOG", "log": "F_LOG",
    torch.sqrt: "F_SQRT", "sqrt": "F_SQRT",
}  # fmt: skip


@register_lowering(*UNARY_FLOAT)
def _lower_unary_float(builder: Builder, target: Any, args: tuple, kwargs: dict) -> Slot:
    dtype = result_dtype(torch.exp, args[0])
    return builder.emit(UNARY_FLOAT[target], dtype, builder.value(args[0], dtype))


@register_lowering(operator.pow, torch.pow, "pow", "__pow__")
def _lower_power(builder: Builder, target: Any, args: tuple, kwargs: dict) -> Slot:
    if len(args) == 2 and args[1] == 2 and not isinstance(args[1], bool):
        return lower_node(builder, operator.mul, (args[0], args[0]), {})  # x · x, as torch
    raise NotLowered(f"a power other than 2 ({args[1:]!r})")


NAMED_CASTS = {"float": torch.float32, "long": torch.int64, "bool": torch.bool}


@register_lowering(*NAMED_CASTS)
@register_lowering("to", "type", keywords={"dtype", "copy", "non_blocking"})
def _lower_cast(builder: Builder, target: Any, args: tuple, kwargs: dict) -> Slot:
    named = NAMED_CASTS.get(target)
    dtype = named if named is not None else kwargs.pop("dtype", args[1] if len(args) > 1 else None)
    if named is None and (not isinstance(dtype, torch.dtype) or kwargs or len(args) > 2):
        raise NotLowered(f".{target}() other than to a dtype")
    return builder.value(args[0], dtype)


# --- clamp and table lookups ----------------------------------------------------------------
@register_lowering(operator.getitem, "__getitem__")
def _lower_getitem(builder: Builder, target: Any, args: tuple, kwargs: dict) -> Slot:
    return lower_lookup(builder, args[0], args[1])


@register_lowering(torch.clamp, torch.clip, "clamp", "clip", keywords={"min", "max"})
def _lower_clamp(builder: Builder, target: Any, args: tuple, kwargs: dict) -> Slot:
    """clamp(x, min, max): one instruction with torch's subgradients (x's gradient where
    min <= x <= max, ties included, a bound's where it is the result); integers, which
    carry no gradient, as maximum then minimum."""
    value = args[0]
    low = kwargs.pop("min", args[1] if len(args) > 1 else None)
    high = kwargs.pop("max", args[2] if len(args) > 2 else None)
    if low is None and high is None:
        raise NotLowered("clamp without a bound")
    dtype = result_dtype(torch.add, value, low if low is not None else high)
    if low is not None and high is not None:
        dtype = torch.promote_types(dtype, result_dtype(torch.add, value, high))
    if not dtype.is_floating_point:
        if low is not None:
            value = lower_node(builder, torch.maximum, (value, low), {})
        if high is not None:
            value = lower_node(builder, torch.minimum, (value, high), {})
        return builder.value(value)
    # A missing bound is an infinite one: the same values and subgradients.
    lower_bound = builder.value(-math.inf if low is None else low, dtype)
    upper_bound = builder.value(math.inf if high is None else high, dtype)
    return builder.emit("F_CLAMP", dtype, builder.value(value, dtype), lower_bound, upper_bound)


def lower_lookup(builder: Builder, table: Any, index: Any) -> Slot:
    """table[i, j, …] with indices read per element: a gather from the table's flat data."""
    if not isinstance(table, torch.Tensor):
        raise NotLowered("indexing a value computed per (query, key)")
    indices = index if isinstance(index, tuple) else (index,)
    if len(indices) != table.dim() or not all(
        isinstance(i, (int, Slot, torch.Tensor)) and not isinstance(i, bool) for i in indices
    ):
        raise NotLowered("indexing other than one integer index per dimension of a table")
    if table.numel() == 0:
        raise NotLowered("indexing an empty table")
    flat = _exact_flat_index(builder, table, indices)
    stride = 1
    for position in reversed(range(table.dim()) if flat is None else ()):
        index_value = indices[position]
        if dtype_of(index_value) != torch.int64:
            raise NotLowered(f"an index of dtype {dtype_of(index_value)}")
        size = builder.constant(table.shape[position], torch.int64)
        index_slot = builder.value(index_value, torch.int64)
        wrapped = builder.emit("WRAP_INDEX", torch.int64, index_slot, size)
        term = wrapped
        if stride != 1:
            term = builder.emit(
                "I_MUL", torch.int64, wrapped, builder.constant(stride, torch.int64)
            )
        flat = term if flat is None else builder.emit("I_ADD", torch.int64, flat, term)
        stride *= table.shape[position]
    dtype = storage_dtype(table.dtype)
    opcode = "F_GATHER" if dtype.is_floating_point else "I_GATHER"
    assert flat is not None
    out = builder.emit(opcode, table.dtype, flat, flat, builder.table_number(table))
    builder.flows[out.index] = dtype.is_floating_point and bool(table.requires_grad)
    return out


def _exact_flat_index(builder: Builder, table: torch.Tensor, indices: tuple) -> Slot | None:
    """The flat index of table[indices] computed on float lanes, exactly, when every index
    is known to lie within its dimension (no wrapping, nothing out of range) and the table
    is within ±2^24 entries; None otherwise."""
    if table.numel() > EXACT:
        return None
    values = [builder.value(i) if isinstance(i, torch.Tensor) else i for i in indices]
    for value, size in zip(values, table.shape, strict=True):
        bounds = bounds_of(value)
        if bounds is None or bounds[0] < 0 or bounds[1] >= size:
            return None
    # The strides of the row-major copy the builder gathers from (`table_number`), not the
    # table's own: a transposed, permuted or sliced view has other strides.
    strides = [math.prod(table.shape[position + 1 :]) for position in range(table.dim())]
    flat: Any = 0
    for value, stride in zip(values, strides, strict=True):
        term = value if stride == 1 else exact_integer_op(builder, "MUL", value, stride)
        flat = (
            term
            if isinstance(flat, int) and flat == 0
            else exact_integer_op(builder, "ADD", flat, term)
        )
        if flat is None or term is None:
            return None
    if not isinstance(flat, Slot):
        return None
    return builder.value(flat, torch.int64)  # converted once, for the gather


def negate(builder: Builder, slot: Slot) -> Slot:
    """−slot (float), folded where it costs no pass over the keys: −(s · v) for a per-row
    scalar s is (−s) · v, −(a − b) is b − a."""
    producer = builder.producers.get(slot.index)
    if producer is not None:
        opcode, a, b = producer
        if opcode == "F_MUL" and not a.vector and b.vector:
            return builder.emit("F_MUL", torch.float32, builder.emit("F_NEG", a.dtype, a), b)
        if opcode == "F_MUL" and a.vector and not b.vector:
            return builder.emit("F_MUL", torch.float32, a, builder.emit("F_NEG", b.dtype, b))
        if opcode == "F_SUB":
            return builder.emit("F_SUB", torch.float32, b, a)
    return builder.emit("F_NEG", torch.float32, slot)
