"""What a mod program is made of (`mods.lowering` lowers a mod into one): the opcodes
of program.h (its native interpreter), `ModProgram` (the tensors the native kernels take),
`Slot` (one value inside it) and `Builder`, which allocates slots, leaves and constants
and emits instructions, with torch's promotion rules and the exact-integer bookkeeping
(integers within ±2^24 held as floats)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

# Opcodes, in the order of program.h's enum Opcode.
OPCODES = [
    "F_ADD",
    "F_SUB",
    "F_MUL",
    "F_DIV",
    "F_MIN",
    "F_MAX",
    "F_NEG",
    "F_ABS",
    "F_EXP",
    "F_LOG",
    "F_SQRT",
    "I_ADD",
    "I_SUB",
    "I_MUL",
    "I_FLOOR_DIV",
    "I_MOD",
    "I_MIN",
    "I_MAX",
    "I_NEG",
    "I_ABS",
    "F_LT",
    "F_LE",
    "F_EQ",
    "F_NE",
    "I_LT",
    "I_LE",
    "I_EQ",
    "I_NE",
    "I_AND",
    "I_OR",
    "I_XOR",
    "I_NOT",
    "TO_FLOAT",
    "TO_INT",
    "F_WHERE",
    "I_WHERE",
    "WRAP_INDEX",
    "F_GATHER",
    "I_GATHER",
    "F_CLAMP",
]
OP = {name: code for code, name in enumerate(OPCODES)}
FLOAT_VECTOR, INT_VECTOR, FLOAT_SCALAR, INT_SCALAR = range(4)
CONSTANT, QUERY, KEY, LEAF, BATCH, HEAD = range(6)


class NotLowered(Exception):
    """What the program cannot express; the caller keeps the torch path."""


@dataclass
class ModProgram:
    """The tensors `native.program_forward` takes (see program.h)."""

    code: torch.Tensor
    slot_types: torch.Tensor
    inputs: torch.Tensor
    constants: torch.Tensor
    leaves: list[torch.Tensor]
    """Each (B, H, Nq or 1, Nk or 1), as torch computed it (with its graph)."""
    tables: list[torch.Tensor]
    """Each flat and detached, as the gathers read it."""
    table_sources: list[torch.Tensor]
    """Each table as the mod indexed it (with its graph), for its gradient."""
    output: int
    differentiable: torch.Tensor
    """(slots,) int64: 1 where a gradient flows, from a float leaf or table that needs one
    to the output, in the native backward's reverse sweep."""

    @property
    def needs_grad(self) -> bool:
        """A leaf or table the bias reads needs a gradient."""
        return any(t.requires_grad for t in (*self.leaves, *self.table_sources))

    def gradient_inputs(self) -> list[torch.Tensor]:
        """The leaves, then the table sources, that need gradients, each once (a gradient
        is returned per tensor: one read twice must get the sum of both reads')."""
        found: list[torch.Tensor] = []
        for tensor in (*self.leaves, *self.table_sources):
            if tensor.requires_grad and not any(tensor is seen for seen in found):
                found.append(tensor)
        return found

    def arguments(self) -> tuple[Any, ...]:
        leaves = [leaf.detach() for leaf in self.leaves]
        tables = [table.detach() for table in self.tables]
        return (
            self.code,
            self.slot_types,
            self.inputs,
            self.constants,
            leaves,
            tables,
            self.output,
        )


@dataclass(frozen=True)
class Slot:
    """A value inside the program: a slot, float or int (bool as 0/1), scalar or vector."""

    index: int
    is_float: bool
    vector: bool
    dtype: torch.dtype
    bounds: tuple[int, int] | None = None
    """An integer held as a float32, exactly: its least and greatest values, within
    ±2^24. Index arithmetic (q_idx − kv_idx, its abs) then runs on 16 float lanes."""


@dataclass
class Builder:
    batch: int
    heads: int
    n_q: int
    n_k: int
    device: torch.device
    grids: dict[str, torch.Tensor]
    slot_types: list[int] = field(default_factory=list)
    inputs: list[tuple[int, int, int]] = field(default_factory=list)
    constants: list[float] = field(default_factory=list)
    leaves: list[torch.Tensor] = field(default_factory=list)
    tables: list[torch.Tensor] = field(default_factory=list)
    table_sources: list[torch.Tensor] = field(default_factory=list)
    flows: list[bool] = field(default_factory=list)
    """Per slot: a gradient flows through it (see ModProgram.differentiable)."""
    code: list[tuple[int, int, int, int, int]] = field(default_factory=list)
    producers: dict[int, tuple[str, Slot, Slot]] = field(default_factory=dict)
    """Each instruction's result: its opcode and first two operands (for folding)."""
    _emitted: dict[tuple, Slot] = field(default_factory=dict)
    """Instructions by opcode and operands: the score_mod's and mask_mod's common parts
    (both often compute |q_idx − kv_idx|) are computed once."""
    _constant_slots: dict[tuple[str, torch.dtype], Slot] = field(default_factory=dict)
    """Constants by their exact value (repr: 2^53 + 1 is not 2^53, −0.0 is not 0.0)."""
    _materialized: dict[int, tuple[torch.Tensor, Slot]] = field(default_factory=dict)
    """Leaves by the id of the tensor they hold, which is kept alive with them (a freed
    tensor's id is reused)."""

    # --- slots --------------------------------------------------------------------------
    def slot(
        self,
        is_float: bool,
        vector: bool,
        dtype: torch.dtype,
        bounds: tuple[int, int] | None = None,
    ) -> Slot:
        kind = (
            (FLOAT_VECTOR if is_float else INT_VECTOR)
            if vector
            else (FLOAT_SCALAR if is_float else INT_SCALAR)
        )
        self.slot_types.append(kind)
        self.flows.append(False)
        return Slot(len(self.slot_types) - 1, is_float, vector, dtype, bounds)

    def constant(self, value: float | int | bool, dtype: torch.dtype) -> Slot:
        exact = float(value) if dtype.is_floating_point else int(value)
        key = (repr(exact), dtype)
        if key not in self._constant_slots:
            if isinstance(exact, int) and abs(exact) > 2**53:
                # The constants are float64, exact to 2^53: a larger integer is a leaf.
                slot = self.leaf(torch.tensor(exact, dtype=torch.int64, device=self.device))
            else:
                slot = self.slot(dtype.is_floating_point, False, dtype)
                self.inputs.append((slot.index, CONSTANT, len(self.constants)))
                self.constants.append(float(exact))
            self._constant_slots[key] = slot
        return self._constant_slots[key]

    def table_number(self, table: torch.Tensor) -> int:
        """The number of `table` among the gathered tables, added once however often the
        mods read it: its gradient then sums every read's, in one row."""
        for number, source in enumerate(self.table_sources):
            if source is table:
                return number
        self.tables.append(table.detach().reshape(-1).to(storage_dtype(table.dtype)).contiguous())
        self.table_sources.append(table)
        return len(self.tables) - 1

    def emit(
        self,
        opcode: str,
        dtype: torch.dtype,
        a: Slot,
        b: Slot | None = None,
        c: Slot | int | None = None,
        bounds: tuple[int, int] | None = None,
    ) -> Slot:
        c_index = c if isinstance(c, int) else (c.index if c is not None else a.index)
        operands = (OP[opcode], a.index, (b or a).index, c_index)
        key = (*operands, dtype, bounds)
        if key in self._emitted:  # the same operation on the same slots: computed once
            return self._emitted[key]
        # A result is per key when an operand is (a gather's table number is no operand).
        vector = a.vector or (b is not None and b.vector) or (isinstance(c, Slot) and c.vector)
        out = self.slot(dtype.is_floating_point or bounds is not None, vector, dtype, bounds)
        self.code.append((operands[0], out.index, *operands[1:]))
        self.producers[out.index] = (opcode, a, b or a)
        if dtype.is_floating_point and opcode != "F_GATHER":  # a gather's: lower_lookup's
            operand_slots = [a, b, c if isinstance(c, Slot) else None]
            self.flows[out.index] = any(
                x is not None and self.flows[x.index] for x in operand_slots
            )
        self._emitted[key] = out
        return out

    def value(self, value: Any, dtype: torch.dtype | None = None) -> Slot:
        """A slot holding `value`: an instruction's result, a Python number, or a tensor
        torch evaluated (a leaf), converted to `dtype` when given."""
        if isinstance(value, Slot):
            slot = value
        elif isinstance(value, (bool, int, float)):
            kind = (
                torch.bool
                if isinstance(value, bool)
                else (torch.int64 if isinstance(value, int) else torch.float32)
            )
            slot = self.constant(value, dtype or kind)
            return slot
        elif isinstance(value, torch.Tensor):
            slot = self.leaf(value)
        else:
            raise NotLowered(f"a value of type {type(value).__name__}")
        return slot if dtype is None else self.cast(slot, dtype)

    def leaf(self, tensor: torch.Tensor) -> Slot:
        key = id(tensor)
        if key in self._materialized:
            return self._materialized[key][1]
        if tensor is self.grids["q_idx"] or tensor is self.grids["kv_idx"]:
            source = QUERY if tensor is self.grids["q_idx"] else KEY
            size = self.n_q if source == QUERY else self.n_k
            exact = (0, size - 1) if size <= EXACT else None  # held as floats
            slot = self.slot(exact is not None, source == KEY, torch.int64, exact)
            self.inputs.append((slot.index, source, 0))
        else:
            if tensor.dim() > 4:
                raise NotLowered(f"a {tensor.dim()}-dimensional intermediate")
            shape = (1,) * (4 - tensor.dim()) + tuple(tensor.shape)
            fits = (
                shape[0] in (1, self.batch)
                and shape[1] in (1, self.heads)
                and shape[2] in (1, self.n_q)
                and shape[3] in (1, self.n_k)
                and not (shape[2] > 1 and shape[3] > 1)
            )
            if not fits:
                raise NotLowered(f"an intermediate of shape {tuple(tensor.shape)}")
            dtype = storage_dtype(tensor.dtype)
            bounds = None
            if tensor.dtype == torch.int64 and tensor.numel() > 0:  # exact as floats?
                low, high = int(tensor.min()), int(tensor.max())
                if max(abs(low), abs(high)) <= EXACT:
                    dtype, bounds = torch.float32, (low, high)
            data = tensor.reshape(shape).to(dtype)
            n_q = self.n_q if shape[2] > 1 else 1
            n_k = self.n_k if shape[3] > 1 else 1
            self.leaves.append(data.expand(self.batch, self.heads, n_q, n_k))
            slot = self.slot(dtype.is_floating_point, n_k > 1, tensor.dtype, bounds)
            self.flows[slot.index] = bool(tensor.requires_grad) and dtype == torch.float32
            self.inputs.append((slot.index, LEAF, len(self.leaves) - 1))
        self._materialized[key] = (tensor, slot)
        return slot

    def cast(self, slot: Slot, dtype: torch.dtype) -> Slot:
        if dtype.is_floating_point and dtype != torch.float32:
            raise NotLowered(f"a {dtype} value (the program computes in float32)")
        if not dtype.is_floating_point and dtype not in (torch.int64, torch.bool):
            raise NotLowered(f"a {dtype} value (the program holds float32, int64 and bool)")
        if slot.bounds is not None:  # an integer held as a float
            if dtype.is_floating_point:
                return Slot(slot.index, True, slot.vector, dtype)
            if dtype == torch.bool:
                return self.emit("F_NE", torch.bool, slot, self.constant(0.0, torch.float32))
            return self.emit("TO_INT", dtype, slot)
        if slot.is_float == dtype.is_floating_point:
            if dtype == torch.bool and slot.dtype != torch.bool:
                zero = self.constant(0, torch.int64)
                return self.emit("I_NE", torch.bool, slot, zero)
            return Slot(slot.index, slot.is_float, slot.vector, dtype)
        if dtype.is_floating_point:
            return self.emit("TO_FLOAT", dtype, slot)
        if dtype == torch.bool:
            zero = self.constant(0.0, torch.float32)
            return self.emit("F_NE", torch.bool, slot, zero)
        return self.emit("TO_INT", dtype, slot)


EXACT = 2**24
"""Integers up to this size are exact in float32, and so are their sums, differences and
products while they stay within it."""

INTERVALS: dict[str, Callable[[tuple[int, int], tuple[int, int]], tuple[int, int]]] = {
    "ADD": lambda a, b: (a[0] + b[0], a[1] + b[1]),
    "SUB": lambda a, b: (a[0] - b[1], a[1] - b[0]),
    "MUL": lambda a, b: (
        min(x * y for x in a for y in b),
        max(x * y for x in a for y in b),
    ),
    "MIN": lambda a, b: (min(a[0], b[0]), min(a[1], b[1])),
    "MAX": lambda a, b: (max(a[0], b[0]), max(a[1], b[1])),
    "NEG": lambda a, _: (-a[1], -a[0]),
    "ABS": lambda a, _: (0 if a[0] <= 0 <= a[1] else min(abs(a[0]), abs(a[1])),
                         max(abs(a[0]), abs(a[1]))),
}  # fmt: skip


def bounds_of(value: Any) -> tuple[int, int] | None:
    """An integer operand's least and greatest values, when known: a Python int, or an
    integer held as a float."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    return value.bounds if isinstance(value, Slot) else None


def exact_integer_op(builder: Builder, operation: str, *operands: Any) -> Slot | None:
    """An integer operation on float lanes, when every operand's bounds are known and the
    result stays within ±2^24 (then it is exact); None otherwise."""
    operands = tuple(builder.value(x) if isinstance(x, torch.Tensor) else x for x in operands)
    bounds = [bounds_of(x) for x in operands]
    # Every operand within ±2^24 (a constant too: 2^24 + 1 is 2^24 as a float32), and the
    # result: then each float32 operation is exact.
    if any(b is None or max(abs(b[0]), abs(b[1])) > EXACT for b in bounds):
        return None
    result = INTERVALS[operation](bounds[0], bounds[-1])  # type: ignore[arg-type]
    if max(abs(result[0]), abs(result[1])) > EXACT:
        return None
    slots = [
        x if isinstance(x, Slot) else builder.constant(float(x), torch.float32) for x in operands
    ]
    second = slots[-1] if len(slots) > 1 else None
    return builder.emit("F_" + operation, torch.int64, slots[0], second, bounds=result)


def storage_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype == torch.float32:
        return torch.float32
    if dtype in (torch.int64, torch.bool):
        return torch.int64
    raise NotLowered(f"a {dtype} value (the program holds float32, int64 and bool)")


def dtype_of(value: Any) -> torch.dtype:
    if isinstance(value, Slot):
        return value.dtype
    if isinstance(value, torch.Tensor):
        return value.dtype
    if isinstance(value, bool):
        return torch.bool
    return torch.int64 if isinstance(value, int) else torch.float32


def probe(value: Any) -> Any:
    """A one-element stand-in for `value` with its dtype, for torch's promotion rules."""
    if isinstance(value, Slot):
        return torch.ones(1, dtype=value.dtype)
    if isinstance(value, torch.Tensor):
        return (
            torch.ones((), dtype=value.dtype)
            if value.dim() == 0
            else torch.ones(1, dtype=value.dtype)
        )
    return value


def result_dtype(target: Callable[..., Any], *operands: Any) -> torch.dtype:
    return target(*map(probe, operands)).dtype
