"""What a `score_mod` is, proven by tracing it: relative, additive or general.

`SoftmaxAttention` has fast paths for two shapes of `score_mod(score, b, h, q_idx,
kv_idx)`: additive, `score + f(b, h, q_idx, kv_idx)` (the bias goes to fused SDPA), and
relative, `score + g(h, kv_idx − q_idx)` (the bias is one value per relative position, a
Toeplitz matrix). An author may declare either; without a declaration the core traces the
mod with `torch.fx` over symbolic arguments, as FlexAttention traces its mods, and reads
the structure from the graph rather than from samples, which a mod that changes past the
sampled lengths would fool:

- **additive** when the output is the score plus or minus terms that do not depend on the
  score (`score + a - b`, in any order of the additions);
- **relative** when, besides, no term reads b, and q_idx and kv_idx appear only as their
  difference (`kv_idx - q_idx` or `q_idx - kv_idx`, each index used nowhere else);
- **general** otherwise, with the reason: the score passes through another operation
  (`tanh`, a product), or the mod cannot be traced (Python control flow on a tensor).

A traced graph holds for every length: it is the mod's code, not its values. What cannot
be proven keeps the general path, which is correct for any mod.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import torch
import torch.fx

Kind = Literal["relative", "additive", "general"]
ARGUMENTS = ("score", "b", "h", "q_idx", "kv_idx")
ADDITIONS = {operator.add, torch.add, "add"}
SUBTRACTIONS = {operator.sub, torch.sub, "sub"}


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


class _Traced(torch.nn.Module):
    """The mod as a module's forward, its owner a submodule: the owner's parameters and
    buffers are then members of the traced root, which fx requires of parameters."""

    def __init__(self, score_mod: Callable[..., torch.Tensor], owner: torch.nn.Module | None):
        super().__init__()
        self.owner = owner
        self.score_mod = score_mod

    def forward(self, score, b, h, q_idx, kv_idx):
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

    def forward(self, score, b, h, q_idx, kv_idx):
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


class _TracedMask(_Traced):
    def forward(self, b, h, q_idx, kv_idx):
        return self.score_mod(b, h, q_idx, kv_idx)


def trace_structure(
    score_mod: Callable[..., torch.Tensor], owner: torch.nn.Module | None = None
) -> ModStructure:
    """The structure of `score_mod(score, b, h, q_idx, kv_idx)`, read from its fx graph;
    `owner`: the module whose parameters and buffers the mod reads (a bound method's)."""
    try:
        graph = trace_mod(score_mod, owner).graph
    except Exception as error:  # Python control flow on a tensor, an untraceable call
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return ModStructure("general", f"not traceable ({type(error).__name__}: {first[:80]})")
    inputs = {node.name: node for node in graph.nodes if node.op == "placeholder"}
    output = next(node for node in graph.nodes if node.op == "output").args[0]
    if not isinstance(output, torch.fx.Node):
        return ModStructure("general", "the mod returns a constant")
    reads = _reads(graph)
    score = inputs["score"]
    blocker = _not_added(output, score, reads)
    if blocker is not None:
        return ModStructure("general", f"the score enters through {blocker}")
    if output is score:
        return ModStructure("general", "the mod returns the score unchanged")
    bias_reads = _bias_reads(output, score, reads)
    if "b" in bias_reads:
        return ModStructure("additive", "proven by trace; not relative: it reads b", bias_reads)
    difference = _only_as_difference(inputs["q_idx"], inputs["kv_idx"])
    if not difference:
        reason = "proven by trace; not relative: q_idx and kv_idx appear apart"
        return ModStructure("additive", reason, bias_reads)
    return ModStructure("relative", "proven by trace", bias_reads)


def relative_mask(
    mask_mod: Callable[..., torch.Tensor], owner: torch.nn.Module | None = None
) -> bool:
    """Whether `mask_mod(b, h, q_idx, kv_idx)` is proven, by its trace, a function of h and
    kv_idx − q_idx only: it never reads b, and q_idx and kv_idx appear only as their
    difference. Then which keys a block of queries sees follows from the offsets the rule
    allows, O(Nq + Nk) evaluations instead of O(Nq · Nk). False when it cannot be traced."""
    try:
        graph = trace_mod(mask_mod, owner).graph
    except Exception:  # Python control flow on a tensor, an untraceable call
        return False
    inputs = {node.name: node for node in graph.nodes if node.op == "placeholder"}
    if set(inputs) != {"b", "h", "q_idx", "kv_idx"} or inputs["b"].users:
        return False
    return _only_as_difference(inputs["q_idx"], inputs["kv_idx"])


def _reads(graph: torch.fx.Graph) -> dict[torch.fx.Node, frozenset[str]]:
    """Each node's arguments among ARGUMENTS, through every node it depends on."""
    reads: dict[torch.fx.Node, frozenset[str]] = {}
    for node in graph.nodes:
        found: set[str] = {node.name} if node.op == "placeholder" else set()
        for parent in node.all_input_nodes:
            found |= reads[parent]
        reads[node] = frozenset(found)
    return reads


def _target(node: torch.fx.Node) -> Any:
    return node.target if node.op != "call_method" else str(node.target)


def _describe(node: torch.fx.Node) -> str:
    target = node.target
    return getattr(target, "__name__", str(target))


def _not_added(
    node: torch.fx.Node, score: torch.fx.Node, reads: dict[torch.fx.Node, frozenset[str]]
) -> str | None:
    """None when `node` is the score plus or minus score-free terms; otherwise the first
    operation the score passes through that is not such an addition."""
    if node is score:
        return None
    if "score" not in reads[node]:
        return "nothing: the output does not depend on the score"
    target = _target(node)
    arguments = [a for a in node.args if isinstance(a, torch.fx.Node)]
    if target in ADDITIONS or target in SUBTRACTIONS:
        with_score = [a for a in arguments if "score" in reads[a]]
        if len(with_score) != 1 or node.kwargs.get("alpha") is not None:
            return f"{_describe(node)} of two terms that both depend on it"
        if target in SUBTRACTIONS and node.args[0] is not with_score[0]:
            return "a subtraction from another term (its sign flips)"
        return _not_added(with_score[0], score, reads)
    if target in ("to", "type_as", "float", "double") or target is torch.Tensor.to:
        return _not_added(arguments[0], score, reads) if arguments else _describe(node)
    return _describe(node)


def _bias_reads(
    node: torch.fx.Node, score: torch.fx.Node, reads: dict[torch.fx.Node, frozenset[str]]
) -> frozenset[str]:
    """What the terms added to the score read."""
    found: set[str] = set()
    while node is not score:
        arguments = [a for a in node.args if isinstance(a, torch.fx.Node)]
        for argument in arguments:
            if "score" not in reads[argument]:
                found |= reads[argument]
        node = next(a for a in arguments if "score" in reads[a])
    return frozenset(found)


def _only_as_difference(q_idx: torch.fx.Node, kv_idx: torch.fx.Node) -> bool:
    """Whether every use of q_idx and of kv_idx is one subtraction of the two."""
    uses = set(q_idx.users) | set(kv_idx.users)
    if not uses:
        return True  # the bias reads neither: relative trivially (a per-head constant)
    return all(
        _target(use) in SUBTRACTIONS
        and {a for a in use.args if isinstance(a, torch.fx.Node)} == {q_idx, kv_idx}
        and not use.kwargs
        for use in uses
    )
