"""Which CPU path a call of `SoftmaxAttention` takes, decided once, with the reason.

`cpu_path(facts)` is the one decision: a pure function of what is known about the call
(`CallFacts`: the score_mod's proven structure, whether there is a mask_mod or padding,
the call's mod program or why there is none, and whether an evaluated bias hides keys;
the program is lowered only if the decision gets that far).
`SoftmaxAttention.forward_fast` dispatches on the `CpuPath` it returns; `cpu_kernel()`,
`playground info` and the run's rows print the same `CpuDispatch`. The paths, in the
order they are preferred:

- `SDPA`: no mods and no padding, one fused SDPA call;
- `KEY_BIAS`: an additive bias that never reads q_idx, folded into the keys (one fused
  call), unless it is −inf somewhere (a query may then see no key);
- `SCORE_BLOCKS`: a score_mod that is not additive, applied to explicit block scores;
- `PROGRAM`: the mods lowered into a program the native kernels run per row
  (`mods.lowering`): float32, native kernels built, no torch.func transform;
- `TOEPLITZ`: a relative bias without a mask_mod, evaluated once per offset and read as a
  Toeplitz matrix (`kernels.relative_bias_attention`), unless it is −inf somewhere;
- `MASKED_BLOCKS`: everything else, blocks of queries over their spans of keys, the mask
  and any additive bias handed to fused SDPA per block.

Only a bias's values can show that it hides keys, so the caller evaluates the bias of
`KEY_BIAS` or `TOEPLITZ`, and, when it is −inf somewhere, asks again with
`bias_hides_keys=True`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from playground.mods.program import ModProgram
from playground.mods.structure import ModStructure


class CpuPath(enum.Enum):
    """A CPU path of `SoftmaxAttention`'s fast forward; the value is how reports name it."""

    SDPA = "one fused SDPA call"
    KEY_BIAS = "the bias folded into the keys: one fused SDPA call"
    SCORE_BLOCKS = "blocks of explicit scores on torch's operations"
    PROGRAM = "per row in the native kernels (a mod program)"
    TOEPLITZ = "a Toeplitz bias (relative_bias_attention)"
    MASKED_BLOCKS = "blocks on torch's operations"


@dataclass(frozen=True)
class CallFacts:
    """What the decision reads about one call."""

    score: ModStructure | None
    """The score_mod's structure for this call (declared, or proven by its trace); None
    when the variant has no score_mod."""
    mask_mod: bool
    """The variant has a mask_mod."""
    padding: bool
    """The call has a padding mask."""
    program: Callable[[], ModProgram | str]
    """The call's mods as a program the native kernels run, or why there is none; called
    only when no earlier path applies (lowering walks the mods' graph), so give a cached
    one when the decision may be asked again."""
    bias_hides_keys: bool = False
    """The bias of `KEY_BIAS` or `TOEPLITZ`, evaluated, is −inf somewhere."""


@dataclass(frozen=True)
class CpuDispatch:
    """The path a call takes, and why."""

    path: CpuPath
    reason: str
    program: ModProgram | None = field(default=None, compare=False)
    """The program, on the `PROGRAM` path (not compared: two decisions are equal when
    their paths and reasons are)."""

    def __str__(self) -> str:
        return f"{self.path.value}: {self.reason}"


HIDES_KEYS = "its bias is −inf somewhere, so a query may see no key"


def cpu_path(facts: CallFacts) -> CpuDispatch:
    """The path of the call `facts` describe (module docstring)."""
    score = facts.score
    if score is None and not facts.mask_mod:
        if facts.padding:
            return CpuDispatch(CpuPath.MASKED_BLOCKS, "no mods, but a padding mask")
        return CpuDispatch(CpuPath.SDPA, "no mods")
    if score is not None and score.per_key and not facts.mask_mod:
        if not facts.bias_hides_keys:
            return CpuDispatch(CpuPath.KEY_BIAS, "the bias never reads q_idx: one row per key")
        return _fallback(facts, f"not folded into the keys: {HIDES_KEYS}")
    if score is not None and not score.additive:
        return CpuDispatch(CpuPath.SCORE_BLOCKS, f"the score_mod is not additive: {score.reason}")
    return _fallback(facts, "")


def _fallback(facts: CallFacts, why_not_earlier: str) -> CpuDispatch:
    """An additive score_mod or a mask alone: the program where there is one, else a
    Toeplitz bias for a relative score_mod without a mask_mod, else blocks."""
    program = facts.program()
    if isinstance(program, ModProgram):
        reason = why_not_earlier or "the mods lower to a program"
        return CpuDispatch(CpuPath.PROGRAM, reason, program)
    reasons = [reason for reason in (why_not_earlier, f"no program: {program}") if reason]
    relative = facts.score is not None and facts.score.kind == "relative"
    if relative and not facts.mask_mod and not facts.bias_hides_keys:
        return CpuDispatch(CpuPath.TOEPLITZ, "; ".join(reasons))
    if relative and facts.bias_hides_keys:
        reasons.append(f"no Toeplitz bias: {HIDES_KEYS}")
    return CpuDispatch(CpuPath.MASKED_BLOCKS, "; ".join(reasons))
