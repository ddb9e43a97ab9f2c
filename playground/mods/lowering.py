"""A mod's bias as a program the native blocked kernels run per row, while the tile is in
cache: the additive bias of a `score_mod` (score + f(b, h, q_idx, kv_idx)), −inf where
`mask_mod`, causality or padding hide a key.

Evaluated by torch over a block, an element-wise bias costs one pass through memory per
operation, each over B·H·block·span values, and then SDPA reads it once more: at n = 4096
that is more time than the attention. Here the mods are traced on every call, since a
plain value they read (a window, an option) may change between calls (one trace gives the
call's verdicts and its program: `mods.structure.analyse_mods`), and partially evaluated:

- a node that does not read both q_idx and kv_idx is evaluated by torch, over (B, H, Nq, 1)
  or (B, H, 1, Nk) at most (`slopes[h]`, `doc[kv_idx]`, `q_idx // 64`): a leaf of the
  program, O(Nq + Nk);
- a node that reads both becomes an instruction (`native/mod_program.h`): arithmetic,
  comparisons, `where`, `clamp`, casts, exp/log/sqrt, and table lookups (`table[q_idx -
  kv_idx]`, T5's buckets), with torch's promotion and integer semantics (floor division,
  remainders, negative indices; an index out of range fails as torch's does; integer
  constants exact at any size), and torch's subgradients (a tie split, NaN kept);
  keyword operands are read (`other=`, `alpha=`), an unknown keyword refused.

`lower` returns the reason (a str) for whatever it does not know (another dtype, an
operation outside that list, a leaf larger than a row or a column): the caller keeps the
path made of torch operations, which is correct for any mod. Learned leaves and tables
get their gradients from the native backward's reverse sweep of the program.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from playground.kernels import native
from playground.kernels.common import transforms_active
from playground.mods.operations import lower_node, negate
from playground.mods.program import (
    OPCODES,
    Builder,
    ModProgram,
    NotLowered,
    Slot,
    dtype_of,
)
from playground.mods.structure import ModStructure
from playground.mods.tracing import (
    ADDITIONS,
    CASTS,
    SUBTRACTIONS,
    TracedMod,
    cast_dtype,
    describe,
    positional,
    trace_mods,
)

__all__ = ["ModProgram", "lower", "program_for_call"]


def _run_graph(builder: Builder, traced: TracedMod, arguments: dict[str, Any]) -> Any:
    """The graph's output: a slot where it reads q_idx and kv_idx together, else torch's
    value. Each node is evaluated by torch when its reads allow, else lowered."""
    values: dict[torch.fx.Node, Any] = {}
    reads: dict[torch.fx.Node, frozenset[str]] = {}

    def substitute(argument: Any) -> Any:
        return torch.fx.node.map_arg(argument, lambda node: values[node])

    for node in traced.graph.nodes:
        parents = frozenset().union(*(reads[p] for p in node.all_input_nodes))
        reads[node] = parents | ({node.target} if node.op == "placeholder" else set())
        if node.op == "placeholder":
            values[node] = arguments[node.target]
        elif node.op == "get_attr":
            value: Any = traced.root
            for part in str(node.target).split("."):
                value = getattr(value, part)
            values[node] = value
        elif node.op == "output":
            return substitute(node.args[0])
        else:
            target = node.target if node.op == "call_function" else str(node.target)
            args, kwargs = substitute(node.args), dict(substitute(node.kwargs))
            if not ("score" in reads[node] or {"q_idx", "kv_idx"} <= reads[node]):
                values[node] = _eager(node, args, kwargs)
                continue
            # Lowered: operands in torch's positional order (torch.add(x, other=y): x, y).
            args, kwargs = positional(target, args, kwargs)
            if "score" in reads[node]:
                values[node] = _lower_score_term(builder, target, args, kwargs)
            else:
                values[node] = lower_node(builder, target, args, kwargs)
    raise NotLowered("a graph without an output")


class _Score:
    """The score a score_mod is given, standing for 0: an additive mod's output is then
    its bias, with no instruction spent adding or subtracting the zero."""


SCORE = _Score()


def _lower_score_term(builder: Builder, target: Any, args: tuple, kwargs: dict) -> Any:
    """A node that reads the score: score ± a term (the term, or its negation; `alpha=`
    scales the term), or a cast of the score that keeps its float32 value (the score).
    Anything else (the score scaled, through tanh, rounded by a cast) is not additive,
    whatever the class declares."""
    scores = [x is SCORE for x in args]
    if not any(scores):  # (score + a) + b: the score already absorbed, into a slot
        return lower_node(builder, target, args, kwargs)
    if target in CASTS and scores[0]:
        if cast_dtype(target, args, kwargs) in (torch.float32, torch.float64):
            return SCORE  # the program's scores are float32: these casts change nothing
        raise NotLowered(f"the score through {describe(target, args, kwargs)}")
    alpha = kwargs.pop("alpha", 1)
    if target in ADDITIONS | SUBTRACTIONS and not kwargs and len(args) == 2 and sum(scores) == 1:
        term = args[1] if scores[0] else args[0]
        if alpha != 1 and not scores[0]:
            raise NotLowered(f"the score scaled by alpha={alpha!r}")
        if alpha != 1:
            term = lower_node(builder, operator.mul, (term, alpha), {})
        term = builder.value(term, torch.float32)
        if target in ADDITIONS:  # score + t, t + score
            return term
        if scores[0]:  # score − t
            return negate(builder, term)
        raise NotLowered("a subtraction of the score (its sign flips)")
    raise NotLowered(f"the score through {describe(target, args, kwargs)}")


def _eager(node: torch.fx.Node, args: tuple, kwargs: dict) -> Any:
    """A node that reads at most one of q_idx and kv_idx, evaluated by torch (its
    arguments are then torch's values too: reads pass to every node that depends on one)."""
    if node.op == "call_function" and callable(node.target):
        return node.target(*args, **kwargs)
    if node.op == "call_method":
        return getattr(args[0], str(node.target))(*args[1:], **kwargs)
    raise NotLowered(f"a node of kind {node.op}")


def lower(
    score_mod: Callable[..., torch.Tensor] | None,
    mask_mod: Callable[..., torch.Tensor] | None,
    owner: torch.nn.Module | None,
    batch: int,
    heads: int,
    n_q: int,
    n_k: int,
    keep: torch.Tensor | None,
    is_causal: bool,
    device: torch.device,
    traced: TracedMod | None = None,
) -> ModProgram | str:
    """The program of this call's bias: score_mod(0, b, h, q, kv) (an additive score_mod:
    the caller knows it is), −inf where mask_mod, causality (q < kv) or padding (`keep`
    (B, Nk) bool, False: hidden) hide a key. `traced`: the mods' trace made for this call
    (`mods.structure.analyse_mods`), traced here when not given. A reason (str) instead
    when it cannot be lowered (module docstring)."""
    grids = {
        "b": torch.arange(batch, device=device).view(-1, 1, 1, 1),
        "h": torch.arange(heads, device=device).view(1, -1, 1, 1),
        "q_idx": torch.arange(n_q, device=device).view(1, 1, -1, 1),
        "kv_idx": torch.arange(n_k, device=device).view(1, 1, 1, -1),
    }
    builder = Builder(batch, heads, n_q, n_k, device, grids)
    try:
        traced = traced or trace_mods(score_mod, mask_mod, owner)
        bias, allowed = _run_graph(builder, traced, {**grids, "score": SCORE})
        bias = 0.0 if bias is None or bias is SCORE else bias
        if not dtype_of(bias).is_floating_point:
            raise NotLowered("a score_mod whose bias is not floating point")
        if allowed is not None and dtype_of(allowed) != torch.bool:
            raise NotLowered("a mask_mod that does not return bool")
        if is_causal:
            causal = lower_node(builder, operator.le, (grids["kv_idx"], grids["q_idx"]), {})
            allowed = causal if allowed is None else _and(builder, allowed, causal)
        if keep is not None:
            padding = keep[:, None, None, :]
            allowed = padding if allowed is None else _and(builder, allowed, padding)
        if allowed is not None:
            hidden = builder.constant(-math.inf, torch.float32)
            output = builder.emit(
                "F_WHERE",
                torch.float32,
                builder.value(allowed),
                builder.value(bias, torch.float32),
                hidden,
            )
        else:
            output = builder.value(bias, torch.float32)
    except NotLowered as reason:
        return str(reason)
    except Exception as error:  # untraceable (Python control flow on a tensor), a probe refused
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return f"{type(error).__name__}: {first[:80]}"
    _drop_unused(builder, output.index)
    return ModProgram(
        code=torch.tensor(builder.code, dtype=torch.long).view(-1, 5),
        slot_types=torch.tensor(builder.slot_types, dtype=torch.long),
        inputs=torch.tensor(builder.inputs, dtype=torch.long).view(-1, 3),
        constants=torch.tensor(builder.constants, dtype=torch.float64),
        leaves=builder.leaves,
        tables=builder.tables,
        table_sources=builder.table_sources,
        output=output.index,
        differentiable=torch.tensor(builder.flows, dtype=torch.long),
    )


def program_for_call(
    score_mod: Callable[..., torch.Tensor] | None,
    mask_mod: Callable[..., torch.Tensor] | None,
    owner: torch.nn.Module | None,
    score: ModStructure | None,
    shape: tuple[int, int, int, int],
    keep: torch.Tensor | None,
    is_causal: bool,
    like: torch.Tensor,
    traced: TracedMod | None,
) -> ModProgram | str:
    """The program of one call (`lower`) where the native kernels can run it, else why
    not: mods to run, a score_mod (`score`, its structure) that is additive, float32
    (`like`'s dtype) on the CPU, no torch.func transform, the native kernels built.
    `shape`: (batch, heads, Nq, Nk)."""
    if score_mod is None and mask_mod is None:
        return "no mods"
    if score is not None and not score.additive:
        return "the score_mod is not additive"
    if like.dtype != torch.float32:
        return f"programs run in float32, not {str(like.dtype).removeprefix('torch.')}"
    if like.device.type != "cpu":
        return f"programs run on the CPU, not {like.device.type}"
    if transforms_active():
        return "a torch.func transform is running"
    if native.load() is None:
        return f"the native kernels are not built ({native.build_state().reason})"
    batch, heads, n_q, n_k = shape
    return lower(
        score_mod,
        mask_mod,
        owner,
        batch,
        heads,
        n_q,
        n_k,
        keep,
        is_causal,
        like.device,
        traced=traced,
    )


def _and(builder: Builder, a: Any, b: Any) -> Slot:
    """a ∧ b in the program (a per-query rule and a per-key one would make, by torch, a
    whole (Nq, Nk) grid)."""
    return builder.emit("I_AND", torch.bool, builder.value(a), builder.value(b))


def _drop_unused(builder: Builder, output: int) -> None:
    """Instructions and inputs the output does not depend on, removed (a folded negation
    leaves the product it replaced behind)."""
    needed = {output}
    kept = []
    for instruction in reversed(builder.code):
        opcode, out, a, b, c = instruction
        if out in needed:
            gather = OPCODES[opcode] in ("F_GATHER", "I_GATHER")
            needed |= {a, b} if gather else {a, b, c}
            kept.append(instruction)
    builder.code = kept[::-1]
    builder.inputs = [entry for entry in builder.inputs if entry[0] in needed]
