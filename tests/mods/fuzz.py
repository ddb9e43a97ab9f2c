"""A seeded, bounded fuzzer of `SoftmaxAttention` mods: random score_mod / mask_mod pairs,
each run by the fast path (a mod program, the keys' fold, the Toeplitz bias, blocks of
torch operations: whichever the trace chooses) against the dense reference, outputs and
every gradient (inputs, projections, learned parameters), causal or not, self or cross
attention, padded or not, at several lengths, in float32 and float64, with plain
attributes and per-batch state changed between two calls.

    python -m tests.mods.fuzz --cases 10000 [--seed 0]

The grammar holds every class of mod issue 42 found wrong: keyword arguments (`other=`,
`alpha=`, `input=`, `x.where(...)`), casts of the score, integer constants past 2^24 and
2^53, a learned table read twice, ties (maximum, minimum, clamp at its bounds, where with
equal branches), abs and sqrt at 0, and attributes and per-batch state changed between
calls. Each case's source is printed with any mismatch, so it can be replayed by hand.

Inputs and projection weights are multiples of powers of two small enough that every
score is exact in float32 whatever order a kernel sums in: a cast or comparison of the
score then sees the same value on every path. Comparisons, ties and casts in the grammar
read only integers and exact products, never exp, whose last bit differs between
implementations.

A NaN gradient where the dense reference has one is required of the fast path only where
the reference evaluated at the allowed pairs alone has it too: the dense reference
evaluates the mod at masked pairs as well (their gradient is 0, and 0 · inf is NaN), which
no blocked path, FlexAttention's included, visits.
"""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from playground import SoftmaxAttention
from playground.masks import masked_softmax
from playground.mods.grid import allowed_pairs, index_grid
from playground.run.instruments import using_threads

D_MODEL, HEADS, BATCH, LONGEST, TABLE = 16, 4, 2, 80, 16
"""head_dim 4: scale 1/2, exact."""
LENGTHS = (1, 5, 17, 40, 70)
BIG = ("2**53 + 1", "(2**53 + 1)", "(2**24 + 1)", "2**62 + 3", "-(2**53 + 1)")
REQUIRED_FEATURES = {
    "keyword", "cast", "large constant", "table read twice", "tie", "abs at 0",
    "sqrt at 0", "attribute changed", "per-batch state changed", "causal", "cross", "padded",
    "float64", "table through a view",
}  # fmt: skip


class Grammar:
    """Random mod sources; `features` collects the classes of issue 42 each one holds."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.features: set[str] = set()

    def pick(self, *options: str) -> str:
        return self.rng.choice(options)

    def integer(self, depth: int) -> str:
        atom = self.pick("q", "kv", "(q - kv)", "(kv - q)", "h", "b", "self.doc[b, kv]")
        if depth <= 0 or self.rng.random() < 0.3:
            return atom
        i, j, c = self.integer(depth - 1), self.integer(depth - 1), self.rng.randint(-4, 4)
        options = [
            f"({i} + {c})", f"({i} - {j})", f"({i} * {c})", f"({i} // {self.pick('2', '3', '7', '-3')})",
            f"({i} % {self.pick('2', '5', '-3')})", f"({i}).abs()", f"torch.maximum({i}, {j})",
            f"torch.minimum({i}, {j})", f"({i}).clamp({-abs(c) - 2}, {abs(c) + 3})",
            f"torch.clamp({i}, min={c})", f"torch.where({self.condition(depth - 1)}, {i}, {j})",
        ]  # fmt: skip
        return self.rng.choice(options)

    def condition(self, depth: int) -> str:
        i, j = self.integer(depth - 1), self.integer(depth - 1)
        options = [
            f"{i} <= {j}", f"{i} == {j}", f"{i} != {self.rng.randint(-2, 2)}", "q >= kv",
            f"({i}) % {self.pick('2', '3')} == 0", "self.doc[b, q] == self.doc[b, kv]",
            "(q - kv).abs() <= self.window", f"torch.le({i}, other={j})",
            f"(({i}) + {self.pick(*BIG)}) % 2 == 0",
        ]  # fmt: skip
        if depth > 0:
            a, b = self.condition(depth - 1), self.condition(depth - 1)
            options += [f"({a}) & ({b})", f"({a}) | ({b})", f"~({a})"]
        found = self.rng.choice(options)
        self.features |= {"keyword"} if "other=" in found else set()
        self.features |= {"large constant"} if "2**" in found else set()
        self.features |= {"per-batch state changed"} if "self.doc" in found else set()
        self.features |= {"attribute changed"} if "self.window" in found else set()
        return found

    def exact(self, depth: int) -> str:
        """A float bias whose every operation is correctly rounded (no exp)."""
        i = self.integer(depth)
        atoms = [
            f"self.slopes[h] * {i}", f"self.steps[h] * {i}", f"({i}).float() * 0.25",
            f"self.table[h, ({i}).clamp(0, {TABLE - 1})]", f"self.table[h, ({i}) % {TABLE}]",
            "self.key_table[kv]", "self.key_table[q]",
            f"self.stored_by_key.t()[h, ({i}).clamp(0, {TABLE - 1})]",
            f"self.wide[:, ::2][h, ({i}).clamp(0, {TABLE - 1})]",
            f"torch.where(q >= kv, self.table[h, (q - kv).clamp(0, {TABLE - 1})], "
            f"self.table[h, (kv - q).clamp(0, {TABLE - 1})])",
            f"torch.maximum(self.slopes[h] * {i}, self.twin[h] * {i})",
            f"torch.minimum(self.twin[h] * {i}, self.slopes[h] * {i})",
            f"torch.sqrt(torch.abs(self.steps[h] * {i}))", f"(self.steps[h] * {i}).abs()",
            f"torch.clamp(self.steps[h] * {i}, -2.0, 2.0)",
            f"torch.clamp(self.slopes[h] * {i}, min=-self.twin[h] * 3, max=self.twin[h] * 2)",
        ]  # fmt: skip
        found = self.rng.choice(atoms)
        if depth > 0 and self.rng.random() < 0.5:
            e, f, c = found, self.exact(depth - 1), self.condition(depth - 1)
            equal_branches = f"torch.where({c}, {e}, {e})"
            found = self.rng.choice([
                f"({e} + {f})", f"({e} - {f})", f"({e} * 0.5)", f"torch.where({c}, {e}, {f})",
                equal_branches, f"torch.add({e}, other={f})", f"torch.sub({e}, {f}, alpha=0.5)",
                f"({e}).add(other={f})", f"({e}).where({c}, {f})",
                f"torch.where(condition={c}, input={e}, other={f})", f"({e}) / (1 + ({f}).abs())",
            ])  # fmt: skip
            self.features |= {"tie"} if found == equal_branches else set()
        self._tag(found)
        return found

    def _tag(self, source: str) -> None:
        tags = {
            "other=": "keyword", "alpha=": "keyword", ").where(": "keyword", "self.twin": "tie",
            ", -2.0, 2.0)": "tie", "torch.sqrt(torch.abs(": "sqrt at 0", ").abs()": "abs at 0",
            "self.table[h, (kv - q)": "table read twice", "self.doc": "per-batch state changed",
            ".t()[h": "table through a view", "[:, ::2][h": "table through a view",
        }  # fmt: skip
        self.features |= {tag for key, tag in tags.items() if key in source}

    def bias(self) -> str:
        e = self.exact(2)
        return self.pick(e, e, f"torch.exp(-({e}).abs())", f"{e} + torch.exp(-({e}).abs())")

    def score_mod(self) -> str:
        f = self.bias()
        forms = [
            f"score + {f}", f"score - {f}", f"torch.add(score, other={f})",
            f"score.add(other={f})", f"torch.sub(score, {f}, alpha=2)", f"torch.add({f}, score)",
            f"score.float() + {f}", f"score.double() + {f}", f"torch.tanh(score / 4) * 4 + {f}",
            f"score.to(torch.int64) + {f}", f"score.to(torch.bfloat16).float() + {f}",
            f"score * (1 + 0.1 * h) + {f}", f"torch.maximum(score, {f})",
            f"torch.where({self.condition(1)}, score, score - 1.0)",
            f"torch.add({f}, score, alpha=2)",
        ]  # fmt: skip
        # −inf hides keys; added last, never negated into a +inf score (NaN on every path).
        hidden = f" + torch.where({self.condition(1)}, 0.0, -math.inf)"
        body = f"    return {self.rng.choice(forms)}{hidden if self.rng.random() < 0.2 else ''}\n"
        self.features |= {"keyword"} if "other=" in body or "alpha=" in body else set()
        self.features |= {"cast"} if ".to(" in body or "score.float" in body else set()
        if self.rng.random() < 0.3:  # a soft-cap a plain attribute switches
            self.features.add("attribute changed")
            body = (
                "    if self.flag:\n        score = torch.tanh(score / self.cap) * self.cap\n"
                + body
            )
        return "def score_mod(self, score, b, h, q, kv):\n" + body

    def mask_mod(self) -> str:
        body = f"    return {self.condition(2)}\n"
        if self.rng.random() < 0.3:  # a document mask a plain attribute switches on
            self.features |= {"attribute changed", "per-batch state changed"}
            body = (
                "    if self.doc_mask:\n        return self.doc[b, q] == self.doc[b, kv]\n" + body
            )
        return "def mask_mod(self, b, h, q, kv):\n" + body


class FuzzedBase(SoftmaxAttention):
    """What the generated mods read: learned slopes (and their twin, for ties), exact
    steps, a relative table, a table per key, per-batch document ids, plain attributes."""

    name, summary, paper = "fuzzed_mod", "a generated mod", "-"

    def __init__(self, generator: torch.Generator, **options: object):
        super().__init__(D_MODEL, HEADS, **options)
        for parameter in self.parameters():  # exact scores on every path (module docstring)
            parameter.data = torch.randint(-4, 5, parameter.shape, generator=generator) / 16
        slopes = 0.1 + 0.9 * torch.rand(HEADS, generator=generator)
        self.slopes = torch.nn.Parameter(slopes)
        self.twin = torch.nn.Parameter(slopes.clone())
        steps = torch.tensor([0.25, 0.5, 1.0, -0.5])[torch.randperm(4, generator=generator)]
        self.steps = torch.nn.Parameter(steps)
        self.table = torch.nn.Parameter(0.5 * torch.randn(HEADS, TABLE, generator=generator))
        self.key_table = torch.nn.Parameter(0.5 * torch.randn(LONGEST, generator=generator))
        # Tables read through views whose strides are not the row-major copy's.
        self.stored_by_key = torch.nn.Parameter(
            0.5 * torch.randn(TABLE, HEADS, generator=generator)
        )
        self.wide = torch.nn.Parameter(0.5 * torch.randn(HEADS, 2 * TABLE, generator=generator))
        self.register_buffer("doc", torch.zeros(BATCH, LONGEST, dtype=torch.long))
        self.flag, self.cap, self.window, self.doc_mask = False, 2.0, 3, False
        self.change_state(generator)

    def change_state(self, generator: torch.Generator) -> None:
        """New plain attributes and document ids, as a training loop sets them per batch."""
        self.flag = not self.flag
        self.cap = float(torch.tensor([0.5, 2.0, 8.0])[torch.randint(3, (1,), generator=generator)])
        self.window = int(torch.randint(0, 12, (1,), generator=generator))
        self.doc_mask = not self.doc_mask
        documents = torch.randint(0, 4, (BATCH, LONGEST), generator=generator)
        self.doc.copy_(documents.sort(dim=1).values)


@dataclass
class Case:
    """One generated pair and the calls it is run on."""

    number: int
    source: str
    features: set[str]
    dtype: torch.dtype
    n_q: int
    n_k: int
    cross: bool
    causal: bool
    padded: bool
    train: bool
    block_size: int

    def __str__(self) -> str:
        setting = (
            f"case {self.number}: {self.dtype}, n_q {self.n_q}, n_k {self.n_k}, cross "
            f"{self.cross}, causal {self.causal}, padded {self.padded}, train {self.train}, "
            f"block_size {self.block_size}"
        )
        return f"{setting}\n{self.source}"


def generate(number: int, seed: int = 0) -> Case:
    rng = random.Random(f"{seed}:{number}")
    grammar = Grammar(rng)
    sources = []
    if rng.random() < 0.85:
        sources.append(grammar.score_mod())
    if not sources or rng.random() < 0.5:
        sources.append(grammar.mask_mod())
    cross, dtype = rng.random() < 0.3, torch.float64 if rng.random() < 0.25 else torch.float32
    n_q = rng.choice(LENGTHS)
    case = Case(
        number, "\n".join(sources), grammar.features, dtype, n_q,
        rng.choice(LENGTHS) if cross else n_q, cross, rng.random() < 0.4,
        rng.random() < 0.3, rng.random() < 0.7, rng.choice((4, 16, 64)),
    )  # fmt: skip
    case.features |= {name for name in ("cross", "causal", "padded") if getattr(case, name)}
    case.features |= {"float64"} if dtype == torch.float64 else set()
    return case


@dataclass
class Report:
    cases: int = 0
    features: set[str] = field(default_factory=set)
    mismatches: list[str] = field(default_factory=list)


def _differs(
    fast: torch.Tensor,
    reference: torch.Tensor,
    exact_reference: Callable[[], torch.Tensor],
    tolerance: float,
) -> str | None:
    """Why `fast` is not `reference` (None when it is): values within `tolerance` of the
    reference's largest, infinities equal, and a NaN where the reference has one, unless
    only the dense evaluation at masked pairs made it (`exact_reference()`, module
    docstring)."""
    fast, reference = fast.detach(), reference.detach()
    scale = max(1.0, float(reference.nan_to_num(0, 0, 0).abs().max()) if reference.numel() else 1)
    finite = reference.isfinite()
    error = (fast[finite] - reference[finite]).abs()
    if error.numel() and not float(error.max()) <= tolerance * scale:
        return f"differs by {float(error.nan_to_num(math.inf).max()):.3g}"
    infinite = reference.isinf()
    if not torch.equal(fast[infinite], reference[infinite]):
        return "differs where the reference is infinite"
    unmatched = reference.isnan() & ~fast.isnan()
    if bool(unmatched.any()):
        exact = exact_reference()
        if bool(exact[unmatched].isnan().any()):
            return "is finite where the reference is NaN at an allowed pair"
        if not bool(((fast - exact)[unmatched].abs() <= tolerance * scale).all()):
            return "differs where only masked pairs make the reference NaN"
    return None


def _allowed_only_reference(module, query, key, value, keep, is_causal):
    """The reference, with the score_mod evaluated at the allowed pairs only (the mods are
    element-wise: they take flat index tensors as well as broadcast ones)."""
    q, k, v = module._projected(query, key, value)  # (B, H, N, d)
    b, h, q_idx, kv_idx = index_grid(*q.shape[:2], torch.arange(q.shape[2]), torch.arange(k.shape[2]))  # fmt: skip
    scores = q @ k.transpose(-2, -1) * module.scale
    mask_mod = module._mask if module._has_mask_mod else None
    allowed = allowed_pairs(mask_mod, b, h, q_idx, kv_idx, keep, is_causal)
    allowed = torch.ones_like(scores, dtype=torch.bool) if allowed is None else allowed
    pairs = allowed.expand(scores.shape).nonzero(as_tuple=True)
    changed = module.score_mod(scores[pairs], *pairs).to(q.dtype).broadcast_to(pairs[0].shape)
    scores = torch.full_like(scores, -math.inf).index_put(pairs, changed)
    empty = torch.isneginf(scores.amax(dim=-1)).all(dim=1)[..., None]
    return module._output(masked_softmax(scores, None) @ v, query, empty)


def run_case(case: Case) -> str | None:
    """A mismatch between the fast path and the reference in either call, or None."""
    generator = torch.Generator().manual_seed(case.number)
    namespace = {"torch": torch, "math": math}
    exec(case.source, namespace)
    mods = {name: namespace[name] for name in ("score_mod", "mask_mod") if name in namespace}
    module = type("Fuzzed", (FuzzedBase,), mods)(generator, block_size=case.block_size)
    module = module.to(case.dtype).train(case.train)
    for call in (1, 2):
        problem = _check_call(module, case, generator)
        if problem is not None:
            return f"call {call}: the {problem}\n{case}"
        module.change_state(generator)
    return None


def _check_call(module: FuzzedBase, case: Case, generator: torch.Generator) -> str | None:
    """One call on fresh inputs: what differs (the output, or which gradient), or None."""

    def tokens(n: int) -> torch.Tensor:
        exact = torch.randint(-8, 9, (BATCH, n, D_MODEL), generator=generator) / 8
        return exact.to(case.dtype).requires_grad_(case.train)

    query = tokens(case.n_q)
    key, value = (tokens(case.n_k), tokens(case.n_k)) if case.cross else (query, query)
    keep = torch.rand(BATCH, case.n_k, generator=generator) > 0.3 if case.padded else None
    arguments = (query, key, value, keep, case.causal)
    # A mod's constants and `.float()` are float32 in float64 calls too, and torch's exp
    # may round them differently by the shape it is given: float32's precision either way.
    tolerance = 2e-4 if case.dtype == torch.float32 else 1e-6
    with torch.set_grad_enabled(case.train):
        fast = module(query, key, value, attention_mask=keep, is_causal=case.causal).output
        reference = module.forward_reference(*arguments, False).output
    problem = _differs(fast, reference, lambda: reference, tolerance)
    if problem is not None or not case.train:
        return None if problem is None else f"output {problem}"
    inputs = list(dict.fromkeys([query, key, value, *module.parameters()]))
    names = ["query", "key", "value"][: len(inputs) - len(list(module.parameters()))]
    names += [name for name, _ in module.named_parameters()]
    weights = torch.randn(reference.shape, generator=generator, dtype=case.dtype)

    def gradients(output: torch.Tensor) -> list[torch.Tensor]:
        found = torch.autograd.grad((output * weights).sum(), inputs, allow_unused=True)
        return [torch.zeros_like(t) if g is None else g for t, g in zip(inputs, found, strict=True)]

    at_allowed_pairs: list[torch.Tensor] = []

    def exact_gradient(index: int) -> torch.Tensor:
        if not at_allowed_pairs:
            at_allowed_pairs.extend(gradients(_allowed_only_reference(module, *arguments)))
        return at_allowed_pairs[index]

    expected = gradients(reference)
    for index, ours in enumerate(gradients(fast)):
        problem = _differs(ours, expected[index], lambda i=index: exact_gradient(i), tolerance)
        if problem is not None:
            return f"gradient of {names[index]} {problem}"
    return None


def fuzz(cases: int, seed: int = 0, stop_at_first: bool = False) -> Report:
    """Cases 0 … cases − 1 of `seed`, on one thread (on tiny tensors, more threads only
    spin: eight times the CPU time on a shared machine)."""
    report = Report()
    with using_threads(1):
        for number in range(cases):
            case = generate(number, seed)
            report.cases += 1
            report.features |= case.features
            problem = run_case(case)
            if problem is not None:
                report.mismatches.append(problem)
                if stop_at_first:
                    break
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    arguments = parser.parse_args()
    report = fuzz(arguments.cases, arguments.seed)
    for mismatch in report.mismatches:
        print(mismatch, end="\n\n")
    print(f"{report.cases} cases, {len(report.mismatches)} mismatches")
    raise SystemExit(1 if report.mismatches else 0)


if __name__ == "__main__":
    main()
