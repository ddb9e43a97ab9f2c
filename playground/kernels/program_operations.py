"""How each operation of a mod that reads both q_idx and kv_idx becomes instructions of a
mod program: arithmetic, comparisons, logic, where, clamp, casts, exp/log/sqrt and table
lookups, each with torch's promotion and integer semantics (`kernels.mod_program`)."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import torch

from playground.kernels.program_builder import (
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
from playground.mod_structure import describe

ARITHMETIC = {
    operator.add: "ADD", torch.add: "ADD", "add": "ADD",
    operator.sub: "SUB", torch.sub: "SUB", "sub": "SUB",
    operator.mul: "MUL", torch.mul: "MUL", "mul": "MUL",
    torch.minimum: "MIN", "minimum": "MIN", torch.maximum: "MAX", "maximum": "MAX",
}  # fmt: skip
COMPARISONS = {
    operator.lt: "LT", torch.lt: "LT", "lt": "LT",
    operator.le: "LE", torch.le: "LE", "le": "LE",
    operator.gt: "GT", torch.gt: "GT", "gt": "GT",
    operator.ge: "GE", torch.ge: "GE", "ge": "GE",
    operator.eq: "EQ", torch.eq: "EQ", "eq": "EQ",
    operator.ne: "NE", torch.ne: "NE", "ne": "NE",
}  # fmt: skip
LOGICAL = {
    operator.and_: "I_AND", torch.logical_and: "I_AND", "logical_and": "I_AND",
    operator.or_: "I_OR", torch.logical_or: "I_OR", "logical_or": "I_OR",
    operator.xor: "I_XOR", torch.logical_xor: "I_XOR", "logical_xor": "I_XOR",
}  # fmt: skip
UNARY_FLOAT = {
    torch.exp: "F_EXP", "exp": "F_EXP", torch.log: "F_LOG", "log": "F_LOG",
    torch.sqrt: "F_SQRT", "sqrt": "F_SQRT",
}  # fmt: skip
# How each operation promotes its operands (minimum and maximum take no Python numbers,
# but promote as add does).
PROMOTES: dict[str, Callable[..., Any]] = {"ADD": torch.add, "SUB": torch.sub, "MUL": torch.mul, "MIN": torch.add,
            "MAX": torch.add}  # fmt: skip


KEYWORDS: dict[str, set[str]] = {"ADD": {"alpha"}, "SUB": {"alpha"}, "DIV": {"rounding_mode"},
            "CLAMP": {"min", "max"}, "CAST": {"dtype", "copy", "non_blocking"}}  # fmt: skip
"""The keyword arguments each operation reads (its operands come positionally,
`mod_structure.positional`); any other keyword is refused, never ignored."""


def _family(target: Any) -> str:
    if target in ARITHMETIC:
        return ARITHMETIC[target]
    if target in (operator.truediv, torch.div, torch.true_divide, "div", "true_divide"):
        return "DIV"
    if target in (torch.clamp, torch.clip, "clamp", "clip"):
        return "CLAMP"
    return "CAST" if target in ("to", "type") else ""


def lower_node(builder: Builder, target: Any, args: tuple, kwargs: dict) -> Slot:
    """One instruction (or a few) for a node that reads both q_idx and kv_idx; `args` in
    torch's positional order."""
    name = describe(target, args, kwargs)
    unread = set(kwargs) - KEYWORDS.get(_family(target), set())
    if unread:
        raise NotLowered(f"{name} with the keyword arguments {sorted(unread)}")
    if target in ARITHMETIC:
        alpha = kwargs.pop("alpha", 1)
        if len(args) != 2 or isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
            raise NotLowered(f"{name} with {len(args)} operands and alpha={alpha!r}")
        if alpha != 1:  # add(a, b, alpha=c) is a + c · b
            number = isinstance(args[1], (int, float))
            scaled: Any = (
                args[1] * alpha
                if number
                else lower_node(builder, operator.mul, (args[1], alpha), {})
            )
            args = (args[0], scaled)
        dtype = result_dtype(PROMOTES[ARITHMETIC[target]], *args)
        if dtype == torch.bool:
            raise NotLowered(f"{name} of two bools")
        if dtype == torch.int64 and (exact := exact_integer_op(builder, ARITHMETIC[target], *args)):
            return exact
        prefix = "F_" if dtype.is_floating_point else "I_"
        a, b = (builder.value(x, dtype) for x in args)
        return builder.emit(prefix + ARITHMETIC[target], dtype, a, b)
    if _family(target) == "DIV":
        mode = kwargs.pop("rounding_mode", None)
        if len(args) != 2 or mode not in (None, "floor"):
            raise NotLowered(f"{name} with {kwargs or mode}")
        if mode == "floor":
            return lower_node(builder, operator.floordiv, args, {})
        dtype = result_dtype(torch.true_divide, *args)
        a, b = (builder.value(x, dtype) for x in args)
        return builder.emit("F_DIV", dtype, a, b)
    if target in (
        operator.floordiv,
        operator.mod,
        torch.floor_divide,
        torch.remainder,
        "floor_divide",
        "remainder",
        "__floordiv__",
        "__mod__",
    ):
        dtype = result_dtype(torch.floor_divide, *args)
        if dtype.is_floating_point or dtype == torch.bool or kwargs:
            raise NotLowered(f"{name} of {dtype} values")
        a, b = (builder.value(x, dtype) for x in args)
        floor = target in (operator.floordiv, torch.floor_divide, "floor_divide", "__floordiv__")
        return builder.emit("I_FLOOR_DIV" if floor else "I_MOD", dtype, a, b)
    if target in COMPARISONS:
        if kwargs or len(args) != 2:
            raise NotLowered(f"{name} with {kwargs or len(args)} arguments")
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
        prefix = "F_" if dtype.is_floating_point else "I_"
        return builder.emit(prefix + relation, torch.bool, a, b)
    if target in LOGICAL:
        dtypes = {dtype_of(x) for x in args}
        if kwargs or len(args) != 2 or not dtypes <= {torch.bool}:
            raise NotLowered(f"{name} of {sorted(map(str, dtypes))} values")
        a, b = (builder.value(x) for x in args)
        return builder.emit(LOGICAL[target], torch.bool, a, b)
    if target in (operator.invert, torch.logical_not, "logical_not", "bitwise_not"):
        if dtype_of(args[0]) != torch.bool:
            raise NotLowered("~ of a value that is not bool")
        return builder.emit("I_NOT", torch.bool, builder.value(args[0]))
    if target in (operator.neg, torch.neg, "neg", operator.abs, torch.abs, "abs"):
        dtype = dtype_of(args[0])
        if dtype == torch.bool:
            raise NotLowered(f"{name} of a bool")
        which = "NEG" if target in (operator.neg, torch.neg, "neg") else "ABS"
        if dtype == torch.int64 and (exact := exact_integer_op(builder, which, args[0])):
            return exact
        prefix = "F_" if dtype.is_floating_point else "I_"
        return builder.emit(prefix + which, dtype, builder.value(args[0], dtype))
    if target in UNARY_FLOAT:
        dtype = result_dtype(torch.exp, args[0])
        return builder.emit(UNARY_FLOAT[target], dtype, builder.value(args[0], dtype))
    if target in (torch.where, "where"):
        if kwargs or len(args) != 3 or dtype_of(args[0]) != torch.bool:
            raise NotLowered("where(condition, x, y) with a bool condition only")
        dtype = result_dtype(torch.add, args[1], args[2])
        condition = builder.value(args[0])
        x, y = builder.value(args[1], dtype), builder.value(args[2], dtype)
        opcode = "F_WHERE" if dtype.is_floating_point else "I_WHERE"
        return builder.emit(opcode, dtype, condition, x, y)
    if _family(target) == "CLAMP":
        return _lower_clamp(builder, args, kwargs)
    if target in ("float", "long", "bool", "to", "type"):
        named = {"float": torch.float32, "long": torch.int64, "bool": torch.bool}.get(target)
        dtype = (
            named if named is not None else kwargs.pop("dtype", args[1] if len(args) > 1 else None)
        )
        if named is None and (not isinstance(dtype, torch.dtype) or kwargs or len(args) > 2):
            raise NotLowered(f".{target}() other than to a dtype")
        return builder.value(args[0], dtype)
    if target in (operator.pow, torch.pow, "pow", "__pow__") and not kwargs and len(args) == 2:
        if args[1] == 2 and not isinstance(args[1], bool):  # x ** 2: x · x, as torch computes it
            return lower_node(builder, operator.mul, (args[0], args[0]), {})
        raise NotLowered(f"a power other than 2 ({args[1]!r})")
    if target in (operator.getitem, "__getitem__"):
        return lower_lookup(builder, args[0], args[1])
    raise NotLowered(f"the operation {name}")


def _lower_clamp(builder: Builder, args: tuple, kwargs: dict) -> Slot:
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
