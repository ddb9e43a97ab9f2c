"""A mod program evaluated by torch's operations: the bias of a block of queries over a span
of keys as a dense (B, H, rows, span) tensor, differentiable in the program's leaves and
tables. The oracle of the native interpreter (tests/mods/test_program.py), and
what `_ProgramBlocks` recomputes through under create_graph=True, where the native
backward's results would not be differentiable."""

from __future__ import annotations

from collections.abc import Callable

import torch

from playground.mods.program import (
    BATCH,
    CONSTANT,
    FLOAT_SCALAR,
    FLOAT_VECTOR,
    HEAD,
    KEY,
    LEAF,
    OPCODES,
    QUERY,
    ModProgram,
)

Value = torch.Tensor


def _floor_divide(a: Value, b: Value) -> Value:
    if bool((b == 0).any()):
        raise RuntimeError("ZeroDivisionError: integer division by zero in a mod")
    return torch.div(a, b, rounding_mode="floor")


def _remainder(a: Value, b: Value) -> Value:
    if bool((b == 0).any()):
        raise RuntimeError("ZeroDivisionError: integer division by zero in a mod")
    return torch.remainder(a, b)


def _compare(relation: Callable[[Value, Value], Value]) -> Callable[[Value, Value], Value]:
    return lambda a, b: relation(a, b).long()


BINARY: dict[str, Callable[[Value, Value], Value]] = {
    "ADD": torch.add,
    "SUB": torch.sub,
    "MUL": torch.mul,
    "MIN": torch.minimum,
    "MAX": torch.maximum,
    "LT": _compare(torch.lt),
    "LE": _compare(torch.le),
    "EQ": _compare(torch.eq),
    "NE": _compare(torch.ne),
}
OPERATIONS: dict[str, Callable[..., Value]] = {
    **{prefix + name: op for name, op in BINARY.items() for prefix in ("F_", "I_")},
    "F_DIV": torch.div,
    "I_FLOOR_DIV": _floor_divide,
    "I_MOD": _remainder,
    "F_NEG": torch.neg,
    "I_NEG": torch.neg,
    "F_ABS": torch.abs,
    "I_ABS": torch.abs,
    "F_EXP": torch.exp,
    "F_LOG": torch.log,
    "F_SQRT": torch.sqrt,
    "I_AND": torch.bitwise_and,
    "I_OR": torch.bitwise_or,
    "I_XOR": torch.bitwise_xor,
    "I_NOT": lambda a: 1 - a,
    "TO_FLOAT": lambda a: a.float(),
    "TO_INT": lambda a: a.long(),
    "F_WHERE": lambda c, a, b: torch.where(c != 0, a, b),
    "I_WHERE": lambda c, a, b: torch.where(c != 0, a, b),
    "F_CLAMP": torch.clamp,
}
UNARY = {"F_NEG", "I_NEG", "F_ABS", "I_ABS", "F_EXP", "F_LOG", "F_SQRT", "I_NOT", "TO_FLOAT",
         "TO_INT"}  # fmt: skip


def dense_program_bias(
    program: ModProgram, batch: int, heads: int, rows: range, keys: range
) -> torch.Tensor:
    """The program's bias for queries `rows` over keys `keys` (B, H, rows, keys), −inf where
    hidden, by torch's operations on the undetached leaves and tables."""
    device = program.code.device
    floats = {FLOAT_VECTOR, FLOAT_SCALAR}
    types = program.slot_types.tolist()
    slots: dict[int, Value] = {}
    query = torch.tensor(list(rows), device=device).view(1, 1, -1, 1)
    key = torch.tensor(list(keys), device=device).view(1, 1, 1, -1)
    for slot, source, index in program.inputs.tolist():
        as_float = types[slot] in floats
        if source == CONSTANT:
            value = program.constants[index]
            slots[slot] = value.float() if as_float else value.long()
        elif source in (QUERY, KEY):
            grid = query if source == QUERY else key
            slots[slot] = grid.float() if as_float else grid
        elif source == BATCH:
            slots[slot] = torch.arange(batch, device=device).view(-1, 1, 1, 1)
        elif source == HEAD:
            slots[slot] = torch.arange(heads, device=device).view(1, -1, 1, 1)
        else:
            assert source == LEAF
            leaf = program.leaves[index]
            leaf = leaf[:, :, rows.start : rows.stop] if leaf.shape[2] > 1 else leaf
            slots[slot] = leaf[..., keys.start : keys.stop] if leaf.shape[3] > 1 else leaf
    for opcode, out, a, b, c in program.code.tolist():
        name = OPCODES[opcode]
        if name == "WRAP_INDEX":
            index, size = slots[a], int(slots[b])
            wrapped = torch.where(index < 0, index + size, index)
            if bool(((wrapped < 0) | (wrapped >= size)).any()):
                raise IndexError(f"an index is out of bounds for a dimension of size {size}")
            slots[out] = wrapped
        elif name in ("F_GATHER", "I_GATHER"):
            source_table = program.table_sources[c].reshape(-1)
            table = source_table.float() if name == "F_GATHER" else source_table.long()
            slots[out] = table[slots[a]]
        elif name in ("F_WHERE", "I_WHERE", "F_CLAMP"):
            slots[out] = OPERATIONS[name](slots[a], slots[b], slots[c])
        elif name in UNARY:
            slots[out] = OPERATIONS[name](slots[a])
        else:
            slots[out] = OPERATIONS[name](slots[a], slots[b])
    bias = slots[program.output].float()
    shape = (batch, heads, len(rows), len(keys))
    return bias.broadcast_to(torch.broadcast_shapes(bias.shape, shape))
