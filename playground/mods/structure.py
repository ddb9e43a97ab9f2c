"""What a `score_mod` is, proven by tracing it: relative, additive or general.

`SoftmaxAttention` has fast paths for two shapes of `score_mod(score, b, h, q_idx,
kv_idx)`: additive, `score + f(b, h, q_idx, kv_idx)` (the bias goes to fused SDPA), and
relative, `score + g(h, kv_idx − q_idx)` (the bias is one value per relative position, a
Toeplitz matrix). An author may declare either; without a declaration the core traces the
mod with `torch.fx` over symbolic arguments, as FlexAttention traces its mods, and reads
the structure from the graph rather than from samples, which a mod that changes past the
sampled lengths would fool:

- **additive** when the output is the score plus or minus terms that do not depend on the
  score (`score + a - b`, `torch.add(score, other=a)`, in any order of the additions),
  through casts that keep every value of the scores' dtype (`score.double()`);
- **relative** when, besides, no term reads b, and q_idx and kv_idx appear only as their
  difference (`kv_idx - q_idx` or `q_idx - kv_idx`, each index used nowhere else);
- **general** otherwise, with the reason: the operations the score passes through (`tanh`,
  a product, a cast that rounds it), or why the mod cannot be traced (Python control flow
  on a tensor).

A traced graph holds for every length: it is the mod's code, not its values. But it holds
only for the plain values the mod read while it was traced (a soft-cap switched on later,
a document mask set later, take another branch), so `analyse_mods` traces on every call,
as the spans are found on every call, and no verdict outlives its call. What cannot be
proven keeps the general path, which is correct for any mod.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.fx

from playground.mods.tracing import (
    ADDITIONS,
    ARGUMENTS,
    CASTS,
    SUBTRACTIONS,
    TracedMod,
    cast_dtype,
    describe,
    keeps_every_value,
    operation_target,
    positional,
    trace_mod,
    trace_mods,
)

Kind = Literal["relative", "additive", "general"]


@dataclass(frozen=True)
class ModStructure:
    """A mod's structure and why: "relative: proven by trace"."""

    kind: Kind
    reason: str
    bias_reads: frozenset[str] = frozenset(ARGUMENTS[1:])
    """What an additive mod's bias reads of b, h, q_idx and kv_idx (all of them, unless a
    trace proved less): a bias that never reads q_idx is one row per key."""

    def __str__(self) -> str:
        return f"{self.kind}: {self.reason}"

    @property
    def additive(self) -> bool:
        """score + f(b, h, q_idx, kv_idx), relative or not."""
        return self.kind in ("additive", "relative")

    @property
    def per_key(self) -> bool:
        """An additive bias that never reads q_idx: one row per key."""
        return self.kind == "additive" and "q_idx" not in self.bias_reads


NO_SCORE_MOD = ModStructure("general", "no score_mod")


@dataclass(frozen=True)
class ModAnalysis:
    """One call's verdicts on its score_mod and mask_mod, read from one trace of both."""

    score: ModStructure
    relative_mask: bool
    """The mask_mod is proven a function of h and kv_idx − q_idx: which keys a block of
    queries sees then follows from the offsets it allows, O(Nq + Nk) evaluations."""
    traced: TracedMod | None
    """The trace the verdicts come from (`trace_mods`), for `mods.lowering.lower`;
    None when there is no mod, or the pair could not be traced."""


def analyse_mods(
    score_mod: Callable[..., torch.Tensor] | None,
    mask_mod: Callable[..., torch.Tensor] | None,
    owner: torch.nn.Module | None,
    dtype: torch.dtype,
    declared: ModStructure | None = None,
) -> ModAnalysis:
    """The verdicts for a call whose scores are of `dtype`, traced now (module docstring):
    `declared` replaces the score_mod's, as a class's declaration does."""
    if score_mod is None and mask_mod is None:
        return ModAnalysis(NO_SCORE_MOD, False, None)
    try:
        traced = trace_mods(score_mod, mask_mod, owner)
    except Exception:  # one mod untraceable: the other may still be proven alone
        score = declared or (
            trace_structure(score_mod, owner, dtype) if score_mod is not None else NO_SCORE_MOD
        )
        return ModAnalysis(score, mask_mod is not None and relative_mask(mask_mod, owner), None)
    graph = traced.graph
    bias, allowed = next(node for node in graph.nodes if node.op == "output").args[0]
    score = declared or (_structure(graph, bias, dtype) if score_mod is not None else NO_SCORE_MOD)
    return ModAnalysis(score, mask_mod is not None and _relative_rule(graph, allowed), traced)


def trace_structure(
    score_mod: Callable[..., torch.Tensor],
    owner: torch.nn.Module | None = None,
    dtype: torch.dtype = torch.float32,
) -> ModStructure:
    """The structure of `score_mod(score, b, h, q_idx, kv_idx)` on scores of `dtype`, read
    from its fx graph; `owner`: the module whose parameters and buffers the mod reads (a
    bound method's)."""
    try:
        graph = trace_mod(score_mod, owner).graph
    except Exception as error:  # Python control flow on a tensor, an untraceable call
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return ModStructure("general", f"not traceable ({type(error).__name__}: {first[:80]})")
    return _structure(graph, next(n for n in graph.nodes if n.op == "output").args[0], dtype)


def _structure(graph: torch.fx.Graph, output: Any, dtype: torch.dtype) -> ModStructure:
    """The structure of the score_mod whose result is `output` in `graph`."""
    inputs = {node.name: node for node in graph.nodes if node.op == "placeholder"}
    if not isinstance(output, torch.fx.Node):
        return ModStructure("general", "the mod returns a constant")
    reads = _reads(graph)
    score = inputs["score"]
    blocker = _not_added(output, score, reads, dtype)
    if blocker is not None:
        return ModStructure("general", blocker)
    if output is score:
        return ModStructure("general", "the mod returns the score unchanged")
    bias_reads = _bias_reads(output, score, reads)
    if "b" in bias_reads:
        return ModStructure("additive", "proven by trace; not relative: it reads b", bias_reads)
    if not _only_as_difference(inputs["q_idx"], inputs["kv_idx"], _ancestors(output)):
        reason = "proven by trace; not relative: q_idx and kv_idx appear apart"
        return ModStructure("additive", reason, bias_reads)
    return ModStructure("relative", "proven by trace", bias_reads)


def relative_mask(
    mask_mod: Callable[..., torch.Tensor], owner: torch.nn.Module | None = None
) -> bool:
    """Whether `mask_mod(b, h, q_idx, kv_idx)` is proven, by its trace, a function of h and
    kv_idx − q_idx only: it never reads b, and q_idx and kv_idx appear only as their
    difference. Then which keys a block of queries sees follows from the offsets the rule
    allows, O(Nq + Nk) evaluations instead of O(Nq · Nk). False when it cannot be traced.
    A verdict for the plain values the mod reads now (module docstring)."""
    try:
        graph = trace_mod(mask_mod, owner).graph
    except Exception:  # Python control flow on a tensor, an untraceable call
        return False
    inputs = {node.name for node in graph.nodes if node.op == "placeholder"}
    output = next(node for node in graph.nodes if node.op == "output").args[0]
    return inputs == {"b", "h", "q_idx", "kv_idx"} and _relative_rule(graph, output)


def _relative_rule(graph: torch.fx.Graph, allowed: Any) -> bool:
    """Whether the mask whose result is `allowed` reads no b, and q_idx and kv_idx only as
    their difference."""
    if not isinstance(allowed, torch.fx.Node):
        return False
    inputs = {node.name: node for node in graph.nodes if node.op == "placeholder"}
    within = _ancestors(allowed)
    if inputs["b"] in within:
        return False
    return _only_as_difference(inputs["q_idx"], inputs["kv_idx"], within)


def _ancestors(node: torch.fx.Node) -> set[torch.fx.Node]:
    """`node` and every node it depends on: one mod's part of a pair's graph."""
    found: set[torch.fx.Node] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if current not in found:
            found.add(current)
            stack.extend(current.all_input_nodes)
    return found


def _reads(graph: torch.fx.Graph) -> dict[torch.fx.Node, frozenset[str]]:
    """Each node's arguments among ARGUMENTS, through every node it depends on (keyword
    arguments too)."""
    reads: dict[torch.fx.Node, frozenset[str]] = {}
    for node in graph.nodes:
        found: set[str] = {node.name} if node.op == "placeholder" else set()
        for parent in node.all_input_nodes:
            found |= reads[parent]
        reads[node] = frozenset(found)
    return reads


def _score_path(node: torch.fx.Node, reads: dict[torch.fx.Node, frozenset[str]], dtype) -> str:
    """The operations the score passes through on its way to `node` (itself included),
    from the score outwards, leaving out additions and casts that keep its value: a tanh
    soft-cap is "/, tanh, *"."""
    names: list[str] = []
    within = _ancestors(node)
    for current in node.graph.nodes:
        if current not in within or "score" not in reads[current]:
            continue
        if current.op not in ("call_function", "call_method"):
            continue
        target = operation_target(current)
        args, kwargs = positional(target, current.args, current.kwargs)
        if target in ADDITIONS | SUBTRACTIONS and not set(kwargs) - {"alpha"}:
            continue
        if target in CASTS and keeps_every_value(dtype, cast_dtype(target, args, kwargs)):
            continue
        name = describe(target, args, kwargs)
        if name not in names:
            names.append(name)
    return ", ".join(names)


def _not_added(
    node: torch.fx.Node,
    score: torch.fx.Node,
    reads: dict[torch.fx.Node, frozenset[str]],
    dtype: torch.dtype,
) -> str | None:
    """None when `node` is the score plus or minus score-free terms (through casts that
    keep its values); otherwise why not, naming the operations the score passes through."""
    if node is score:
        return None
    if "score" not in reads[node]:
        return "nothing: the output does not depend on the score"
    target = operation_target(node)
    args, kwargs = positional(target, node.args, node.kwargs)
    if target in ADDITIONS or target in SUBTRACTIONS:
        name = getattr(target, "__name__", target)
        alpha = kwargs.pop("alpha", 1)
        with_score = [
            i for i, x in enumerate(args) if isinstance(x, torch.fx.Node) and "score" in reads[x]
        ]
        if len(args) != 2 or kwargs or isinstance(alpha, (bool, torch.fx.Node)):
            return f"{name} with arguments the trace cannot read ({node.format_node()})"
        if len(with_score) != 1:
            return f"{name} of two terms that both depend on it"
        if with_score == [1] and target in SUBTRACTIONS:
            return "a subtraction from another term (its sign flips)"
        if with_score == [1] and alpha != 1:
            return f"{name} with alpha={alpha} scaling it"
        return _not_added(args[with_score[0]], score, reads, dtype)
    if target in CASTS and keeps_every_value(dtype, cast_dtype(target, args, kwargs)):
        return _not_added(args[0], score, reads, dtype)
    return f"the score enters through {_score_path(node, reads, dtype)}"


def _bias_reads(
    node: torch.fx.Node, score: torch.fx.Node, reads: dict[torch.fx.Node, frozenset[str]]
) -> frozenset[str]:
    """What the terms added to the score read (`_not_added` proved the chain)."""
    found: set[str] = set()
    while node is not score:
        arguments = node.all_input_nodes  # keyword arguments too
        for argument in arguments:
            if "score" not in reads[argument]:
                found |= reads[argument]
        node = next(a for a in arguments if "score" in reads[a])
    return frozenset(found)


def _only_as_difference(
    q_idx: torch.fx.Node, kv_idx: torch.fx.Node, within: set[torch.fx.Node]
) -> bool:
    """Whether every use of q_idx and of kv_idx among `within` (one mod's nodes) is one
    subtraction of the two."""
    uses = {use for use in (*q_idx.users, *kv_idx.users) if use in within}
    if not uses:
        return True  # the bias reads neither: relative trivially (a per-head constant)
    for use in uses:
        args, kwargs = positional(operation_target(use), use.args, use.kwargs)
        pair = len(args) == 2 and args[0] is not args[1]
        if not (operation_target(use) in SUBTRACTIONS and not kwargs and pair):
            return False
        if not all(any(x is index for index in (q_idx, kv_idx)) for x in args):
            return False
    return True
