"""`SoftmaxAttention`: softmax attention whose scores or mask a variant changes, written
as FlexAttention's `score_mod` and `mask_mod` (torch.nn.attention.flex_attention):

    score_mod(score, b, h, q_idx, kv_idx) -> score     the scaled score q·k/√d, changed
    mask_mod(b, h, q_idx, kv_idx) -> bool               True where query q_idx may see kv_idx

A variant subclasses it, sets name/summary/paper, and overrides one or both methods; the
same methods can be handed to `flex_attention`. The base owns the projections, heads, the
call's padding mask and `is_causal` (AND-ed with `mask_mod`), queries that see nothing
(zero output, as in FlexAttention: a query with no finite score, masked out or given −inf
by `score_mod`, gets a zero context, and in every head a zero output), FLOPs, and three
paths. What the mods and `project`/`context_mod` return is checked (a HookError names
the hook), so a wrong layout fails with a message instead of deep inside a kernel:

- reference: dense (B, H, Nq, Nk) scores; the mods are evaluated on broadcast index
  tensors (b (B,1,1,1), h (1,H,1,1), q_idx (1,1,Nq,1), kv_idx (1,1,1,Nk)), so a mod written
  with torch operations (`score - slope[h] * (q_idx - kv_idx).abs()`) works unchanged; then
  a masked softmax. The oracle.
- Structure. Whether a `score_mod` is relative (score + g(h, kv − q)) or additive
  (score + f(b, h, q, kv)) is proven by tracing it on every call (`mods.structure.
  analyse_mods`, a torch.fx graph read, not sampled values: a plain attribute the mod
  branches on may change between calls), or declared (`relative_score_mod`,
  `additive_score_mod`, which override the trace); `score_mod_structure()` says which and
  why. A mod that cannot be proven either keeps the general path.
- CPU fast path. With no mods and no padding, one SDPA call. A relative `score_mod`
  without a `mask_mod` is evaluated once per relative position and
  run by `kernels.relative_bias_attention` (a Toeplitz view; a fused backward for g),
  unless g is −inf somewhere (a query may then see no key: the blocked path finds it).
  Otherwise `mods.scheduler` runs blocks of queries: on every call, as
  FlexAttention builds its block mask, `mask_mod` (with causality) gives the span of keys
  each block can see (a mod may read state that changes between calls: document ids, a
  scheduled window), and keys outside it are never touched, so a window of w costs
  O(n·(w + block)) attention time and memory, plus O(n²) cheap evaluations of the rule
  itself. An additive bias that never reads q_idx (one row per key) skips the blocks:
  `kernels.key_bias_attention` folds it into the keys, one fused call. In float32 with
  the native kernels built, an additive `score_mod` and `mask_mod` are lowered to a
  program (`mods.lowering`) that the native blocked kernels evaluate per row, in
  cache, forward and backward (its learned parameters get their gradients there): no
  bias is stored, and a relative one needs no Toeplitz view. Otherwise, within a span, an
  additive `score_mod` is turned into a bias for fused SDPA; any other is applied to explicit
  block scores. Training memory stays O(n · block), and parameters used in `score_mod`
  get their gradients. FlexAttention has no CPU backward, which is why this path exists.
- CUDA: `flex_attention` with `create_block_mask`, compiled, with the same methods
  (`kernels.flex`).

`need_weights=True` runs the reference (the weights are dense anyway).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from playground.config import VariantConfig
from playground.contract import AttentionOutput, AttentionVariant, Capabilities
from playground.decoding import TokenCache, cached_attention
from playground.errors import HookError, UnsupportedFeature
from playground.heads import (
    add_projections,
    attention_flops,
    project_heads,
    project_output,
    projection_flops,
)
from playground.kernels import relative_bias_attention
from playground.kernels.flex import flex_mod_attention
from playground.kernels.key_bias import key_bias_attention
from playground.masks import masked_softmax, queries_without_keys
from playground.mods.dispatch import CallFacts, CpuDispatch, CpuPath, cpu_path
from playground.mods.grid import allowed_pairs, index_grid, score_per_offset
from playground.mods.lowering import program_for_call
from playground.mods.program import ModProgram
from playground.mods.scheduler import ModScheduler
from playground.mods.structure import ModAnalysis, ModStructure, analyse_mods
from playground.validation import hook_error


@dataclass(frozen=True)
class SoftmaxConfig(VariantConfig):
    bias: bool = True
    """Add a bias to the q/k/v/out projections."""
    block_size: int = 256
    """Queries per block of the CPU fast path: bounds its working memory to
    (B, H, block_size, span). Results do not depend on it."""

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be a positive integer; got {self.block_size}")


def _broadcasts(shape: torch.Size, target: torch.Size | tuple[int, ...]) -> bool:
    """Whether a tensor of `shape` broadcasts to `target` without growing it."""
    try:
        return torch.broadcast_shapes(shape, target) == torch.Size(target)
    except RuntimeError:  # sizes that do not broadcast
        return False


def _described(value: object) -> str:
    """A hook's result, for an error message: its kind, and a tensor's dtype and shape."""
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        return f"a tensor of dtype {dtype} and shape {tuple(value.shape)}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}: " + ", ".join(map(_described, value))
    return f"{type(value).__name__} {value!r}"


class SoftmaxAttention(AttentionVariant):
    """Softmax attention with FlexAttention-style `score_mod` / `mask_mod` (module
    docstring). Subclass it, set `name`, `summary`, `paper`, and override a mod."""

    Config = SoftmaxConfig
    capabilities = Capabilities(
        causal=True,
        padding_mask=True,
        cross_attention=True,
        need_weights=True,
        dtypes=(torch.float32, torch.float64, torch.bfloat16),
    )
    suite_options: ClassVar[dict[str, Any]] = {"block_size": 32}  # partial and several blocks
    additive_score_mod: ClassVar[bool] = False
    """True when `score_mod(score, …)` is `score + f(b, h, q_idx, kv_idx)`: the CPU fast
    path then hands f to fused SDPA as a bias instead of forming the scores itself. The
    contract suite's fast-versus-reference check catches a wrong declaration."""
    relative_score_mod: ClassVar[bool] = False
    """True when `score_mod(score, b, h, q_idx, kv_idx)` is `score + g(h, kv_idx − q_idx)`:
    additive, the same for every batch element, and a function of the relative position
    only. The CPU fast path then evaluates g once per relative position, O(H · (Nq + Nk)),
    and reads it as a Toeplitz bias (`kernels.relative_bias_attention`), never forming a
    (blk, Nk) bias per block. Checked like `additive_score_mod`."""

    @staticmethod
    def flops(n_q: int, n_k: int, d_model: int, num_heads: int, **options: object) -> float:
        return projection_flops(n_q, n_k, d_model) + attention_flops(n_q * n_k, d_model)

    # add_projections' layers, declared: torch types a module's attributes `Tensor | Module`.
    q_proj: torch.nn.Linear
    k_proj: torch.nn.Linear
    v_proj: torch.nn.Linear
    out_proj: torch.nn.Linear

    def __init__(self, d_model: int = 512, num_heads: int = 8, **options: object) -> None:
        super().__init__(d_model, num_heads, **options)
        add_projections(self, d_model, bias=self.config.bias)
        self.scale = 1 / math.sqrt(self.head_dim)

    # --- what a variant overrides ----------------------------------------------------
    def score_mod(
        self,
        score: torch.Tensor,
        b: torch.Tensor,
        h: torch.Tensor,
        q_idx: torch.Tensor,
        kv_idx: torch.Tensor,
    ) -> torch.Tensor:
        """The scaled score q·k/√d of query q_idx and key kv_idx in head h of batch
        element b, changed; the default leaves it as it is."""
        return score

    def mask_mod(
        self, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> torch.Tensor:
        """True where query q_idx may attend to key kv_idx; the default allows all."""
        return torch.ones_like(q_idx >= kv_idx)

    def project(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, H, Nq, d), k and v (B, H, Nk, d) from the inputs: the contract's
        projections, split into heads. Override to change queries and keys before they
        meet (rotate them by position, normalise them), calling this first; every path
        uses it."""
        return project_heads(self, query, key, value)

    def position_mod(
        self, q: torch.Tensor, k: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """q (B, H, Nq, d) and k (B, H, Nk, d) changed by their positions q_idx (Nq,) and
        kv_idx (Nk,) int64 (rotated, say); the default leaves them as they are. Every
        path uses it, and decoding gives it each new token's own position, so `project`
        must not depend on positions: they come in here."""
        return q, k

    def decoding_window(self) -> int | None:
        """How many of the latest keys a query can still see in causal decoding (its
        `mask_mod`'s reach back), so that the cache keeps only those, in a rolling buffer;
        None (the default): every key. The contract suite's decoding check catches a
        window shorter than the mask's."""
        return None

    def context_mod(self, context: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """Each head's output (B, H, Nq, d) before the output projection, changed by a
        function of the query input (B, Nq, d_model) (an output gate, say); the default
        leaves it as it is. Every path uses it."""
        return context

    def logit_bias(self, n_q: int, n_k: int) -> torch.Tensor | None:
        """An additive `score_mod`'s f(b, h, q_idx, kv_idx) for batch element 0: the
        bias figure draws it. None for a score_mod that is not additive, or none."""
        if not (self._has_score_mod and self._mods().score.additive):
            return None
        device = next(self.parameters()).device
        b, h, q_idx, kv_idx = index_grid(
            1, self.num_heads, torch.arange(n_q, device=device), torch.arange(n_k, device=device)
        )
        zero = torch.zeros((), device=device)
        return self._scores(zero, b, h, q_idx, kv_idx).broadcast_to(1, self.num_heads, n_q, n_k)

    @property
    def _has_score_mod(self) -> bool:
        return type(self).score_mod is not SoftmaxAttention.score_mod

    def score_mod_structure(self, dtype: torch.dtype | None = None) -> ModStructure:
        """Which path the `score_mod` takes on scores of `dtype` (the module's, by default)
        and why: declared, or proven by a trace made now; "general" for a mod that is
        neither, or none."""
        return self._mods(dtype).score

    def _mods(self, dtype: torch.dtype | None = None) -> ModAnalysis:
        """This call's verdicts on the mods, from one trace of both made now: a mod may
        branch on a plain attribute set since the last call (a soft-cap switched on, a
        document mask set), so no verdict is kept from an earlier call, as no span is."""
        declared = None
        if self.relative_score_mod:
            declared = ModStructure("relative", "declared (relative_score_mod = True)")
        elif self.additive_score_mod:
            declared = ModStructure("additive", "declared (additive_score_mod = True)")
        return analyse_mods(
            self.score_mod if self._has_score_mod else None,
            self.mask_mod if self._has_mask_mod else None,
            self,
            dtype or self.q_proj.weight.dtype,
            declared if self._has_score_mod else None,
        )

    def cpu_kernel(self, n: int = 4096) -> CpuDispatch:
        """The path the float32 CPU fast path takes on n tokens of self-attention without
        padding, in inference and training alike, and why (`mods.dispatch`): decided as
        a call decides it. `playground info` prints it; a run's rows print the path their
        own calls took (`cpu_path_taken`)."""
        like = torch.zeros((), device=self.q_proj.weight.device)
        return self._cpu_dispatch(self._mods(torch.float32), (1, n, n), None, True, like)[0]

    @property
    def _has_mask_mod(self) -> bool:
        return type(self).mask_mod is not SoftmaxAttention.mask_mod

    def _output(
        self, context: torch.Tensor, query: torch.Tensor, empty: torch.Tensor | None
    ) -> torch.Tensor:
        """context (B, H, Nq, d) -> output (B, Nq, d_model): `context_mod`, then the output
        projection (queries that see nothing output zero)."""
        changed = self.context_mod(context, query)
        if not isinstance(changed, torch.Tensor) or changed.shape != context.shape:
            raise self._hook_problem(
                "context_mod(context, query)",
                f"returned {_described(changed)}; it must return each head's output "
                f"(B, H, Nq, d) = {tuple(context.shape)}, the shape of the context it is "
                "given (the query input is (B, Nq, d_model): apply a gate to the context, "
                "do not return it)",
            )
        return project_output(self, changed, empty)

    # --- calling the hooks: a result of the wrong kind is refused, naming the hook -------
    def _hook_problem(self, hook: str, problem: str) -> HookError:
        return hook_error(self, f"{type(self).__name__}.{hook}", problem)

    def _projected(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        position: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """`project`'s q, k, v, checked against the layout every path reads: q (B, H, Nq,
        d), k and v (B, H, Nk, ·), q and k of one width. A wrong layout would otherwise
        fail deep inside a kernel, or broadcast into wrong outputs."""
        projected = self.project(query, key, value)
        batch, n_q, n_k, heads = query.shape[0], query.shape[1], key.shape[1], self.num_heads
        expected = (
            f"q (B, H, Nq, d) = ({batch}, {heads}, {n_q}, d), k and v (B, H, Nk, d) = "
            f"({batch}, {heads}, {n_k}, d), q and k of one width d (split the heads with "
            "playground.heads.split_heads, (B, N, H·d) -> (B, H, N, d))"
        )
        if not (
            isinstance(projected, (tuple, list))
            and len(projected) == 3
            and all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in projected)
        ):
            raise self._hook_problem(
                "project(query, key, value)",
                f"returned {_described(projected)}; it must return three tensors: {expected}",
            )
        q_k_v = q, k, v = projected
        if not (
            q.shape[:3] == (batch, heads, n_q)
            and k.shape[:3] == v.shape[:3] == (batch, heads, n_k)
            and q.shape[-1] == k.shape[-1]
        ):
            shapes = ", ".join(
                f"{name} {tuple(t.shape)}" for name, t in zip("qkv", q_k_v, strict=True)
            )
            raise self._hook_problem(
                "project(query, key, value)", f"returned {shapes}; expected {expected}"
            )
        # Positions 0 … N − 1, or a decoded token's own (one query, one key).
        q_idx = torch.arange(n_q, device=q.device) if position is None else position
        kv_idx = torch.arange(n_k, device=q.device) if position is None else position
        return (*self._positioned(q, k, q_idx, kv_idx), v)

    def _positioned(
        self, q: torch.Tensor, k: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`position_mod(q, k, q_idx, kv_idx)`, checked: q and k of their shapes."""
        if type(self).position_mod is SoftmaxAttention.position_mod:
            return q, k
        moved = self.position_mod(q, k, q_idx, kv_idx)
        if (
            isinstance(moved, (tuple, list))
            and len(moved) == 2
            and all(isinstance(t, torch.Tensor) for t in moved)
            and moved[0].shape == q.shape
            and moved[1].shape == k.shape
        ):
            return moved[0], moved[1]
        raise self._hook_problem(
            "position_mod(q, k, q_idx, kv_idx)",
            f"returned {_described(moved)}; it must return (q, k) of the shapes it is given, "
            f"q {tuple(q.shape)} and k {tuple(k.shape)}",
        )

    def _scores(
        self,
        score: torch.Tensor,
        b: torch.Tensor,
        h: torch.Tensor,
        q_idx: torch.Tensor,
        kv_idx: torch.Tensor,
    ) -> torch.Tensor:
        """`score_mod(score, b, h, q_idx, kv_idx)`, checked: a floating tensor that
        broadcasts to the shape of its arguments together (a constant, 0-dimensional, is
        one score for every pair, as in FlexAttention). Returned as it is; callers
        broadcast it."""
        result = self.score_mod(score, b, h, q_idx, kv_idx)
        shape = torch.broadcast_shapes(score.shape, b.shape, h.shape, q_idx.shape, kv_idx.shape)
        fits = isinstance(result, torch.Tensor) and result.is_floating_point()
        if fits and _broadcasts(result.shape, shape):
            return result
        raise self._hook_problem(
            "score_mod(score, b, h, q_idx, kv_idx)",
            f"returned {_described(result)}; it must return a floating-point tensor that "
            f"broadcasts to its arguments' shape {tuple(shape)}: the score changed by torch "
            "operations on it and on the index tensors (b (B,1,1,1), h (1,H,1,1), q_idx "
            "(1,1,Nq,1), kv_idx (1,1,1,Nk))",
        )

    def _mask(
        self, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> torch.Tensor:
        """`mask_mod(b, h, q_idx, kv_idx)` as a bool tensor (B or 1, H or 1, Nq, Nk). A
        rule that ignores kv_idx or q_idx (a per-query or per-head rule) gives size-1
        dimensions there, which every caller needs at full size; the batch and head
        dimensions stay 1 where the rule does not depend on them, so no copy is made per
        batch element or head. Anything else, an int tensor or a Python bool, is refused."""
        allowed = self.mask_mod(b, h, q_idx, kv_idx)
        shape = (b.shape[0], h.shape[1], q_idx.shape[2], kv_idx.shape[3])
        is_mask = isinstance(allowed, torch.Tensor) and allowed.dtype == torch.bool
        if is_mask and _broadcasts(allowed.shape, shape):
            lead = (1,) * (4 - allowed.dim()) + tuple(allowed.shape)  # (B?, H?, ·, ·)
            return allowed.broadcast_to((lead[0], lead[1], shape[2], shape[3]))
        raise self._hook_problem(
            "mask_mod(b, h, q_idx, kv_idx)",
            f"returned {_described(allowed)}; it must return a bool tensor that broadcasts "
            f"to the index tensors' shape (B, H, queries, keys), {shape} in this call, True "
            "where query q_idx may see key kv_idx: a "
            "comparison of the index tensors (b (B,1,1,1), h (1,H,1,1), q_idx (1,1,Nq,1), "
            "kv_idx (1,1,1,Nk)) such as `(q_idx - kv_idx).abs() < w` (`!= 0` makes an int "
            "tensor bool; `torch.ones_like(q_idx >= kv_idx)` allows every key)",
        )

    # --- reference ---------------------------------------------------------------------
    def forward_reference(
        self, query, key, value, attention_mask, is_causal, need_weights
    ) -> AttentionOutput:
        q, k, v = self._projected(query, key, value)  # (B, H, N, d)
        batch, heads, n_q, n_k = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        b, h, q_idx, kv_idx = index_grid(
            batch, heads, torch.arange(n_q, device=q.device), torch.arange(n_k, device=q.device)
        )
        scores = q @ k.transpose(-2, -1) * self.scale  # (B, H, Nq, Nk)
        # A mod's float32 constants must not promote bf16 scores.
        scores = self._scores(scores, b, h, q_idx, kv_idx).to(q.dtype).broadcast_to(scores.shape)
        mask_mod = self._mask if self._has_mask_mod else None
        allowed = allowed_pairs(mask_mod, b, h, q_idx, kv_idx, attention_mask, is_causal)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, -math.inf)
        weights = masked_softmax(scores, None)  # (B, H, Nq, Nk); 0 on rows with no score
        # A query with no finite score in any head outputs exactly zero, as FlexAttention's
        # path does (a −inf log-sum-exp in every head): masked out, or −inf from score_mod.
        empty = torch.isneginf(scores.amax(dim=-1)).all(dim=1)[..., None]  # (B, Nq, 1)
        output = self._output(weights @ v, query, empty)
        return AttentionOutput(
            output, weights.expand(batch, heads, n_q, n_k) if need_weights else None
        )

    # --- fast paths --------------------------------------------------------------------
    cpu_path_taken: CpuDispatch | None = None
    """The CPU path the last fast call took, and why (`mods.dispatch`): what the run's rows
    report of the calls they time."""

    def forward_fast(
        self, query, key, value, attention_mask, is_causal, need_weights
    ) -> AttentionOutput:
        if query.is_cuda:
            return self._forward_flex(query, key, value, attention_mask, is_causal)
        n_q, n_k = query.shape[1], key.shape[1]
        mods = self._mods(query.dtype)  # traced now: verdicts as fresh as the spans
        shape = (query.shape[0], n_q, n_k)
        dispatch, bias = self._cpu_dispatch(mods, shape, attention_mask, is_causal, query)
        # Kept without its program, whose leaves hold this call's graph.
        self.cpu_path_taken = replace(dispatch, program=None)
        q, k, v = self._projected(query, key, value)  # (B, H, N, d)
        empty: torch.Tensor | None  # (B, Nq, 1): the queries that see no key
        if dispatch.path in (CpuPath.TOEPLITZ, CpuPath.KEY_BIAS):
            assert bias is not None, "these paths come with their evaluated bias"
            if dispatch.path is CpuPath.TOEPLITZ:  # bias (H, Nq + Nk − 1)
                context = relative_bias_attention(
                    q, k, v, bias, attention_mask, is_causal, self.scale, self.config.block_size
                )
            else:  # bias (B or 1, H or 1, 1, Nk)
                context = key_bias_attention(q, k, v, bias, attention_mask, is_causal, self.scale)
            empty = queries_without_keys(attention_mask, n_q, n_k, is_causal)
        else:
            scheduler = ModScheduler(
                score_mod=self._scores if self._has_score_mod else None,
                mask_mod=self._mask if self._has_mask_mod else None,
                path=dispatch.path,
                scale=self.scale,
                block_size=self.config.block_size,
                program=dispatch.program,
                relative_mask=mods.relative_mask,
            )
            context, empty = scheduler.attend(q, k, v, attention_mask, is_causal)
        return AttentionOutput(self._output(context, query, empty), None)

    def _cpu_dispatch(
        self,
        mods: ModAnalysis,
        shape: tuple[int, int, int],
        attention_mask: torch.Tensor | None,
        is_causal: bool,
        like: torch.Tensor,
    ) -> tuple[CpuDispatch, torch.Tensor | None]:
        """This call's CPU path (`mods.dispatch.cpu_path`) for `shape` (B, Nq, Nk) and
        `mods` (this call's verdicts), and the bias the `KEY_BIAS` and `TOEPLITZ` paths
        run on, evaluated in `like`'s dtype: only its values can show that it hides keys,
        and then the decision is asked again."""
        batch, n_q, n_k = shape
        score = mods.score if self._has_score_mod else None
        score_mod = self.score_mod if self._has_score_mod else None
        mask_mod = self.mask_mod if self._has_mask_mod else None

        @functools.cache  # lowered once, if the decision gets that far
        def program() -> ModProgram | str:
            call = (batch, self.num_heads, n_q, n_k)
            return program_for_call(
                score_mod, mask_mod, self, score, call, attention_mask, is_causal, like, mods.traced
            )

        facts = CallFacts(score, self._has_mask_mod, attention_mask is not None, program)
        dispatch = cpu_path(facts)
        if dispatch.path is CpuPath.TOEPLITZ:  # g(h, kv − q) once per offset
            bias = score_per_offset(self._scores, self.num_heads, n_q, n_k, like)
            hides_keys = bool(torch.isneginf(bias).any())
        elif dispatch.path is CpuPath.KEY_BIAS:  # f(b, h, kv): one row per key
            b, h, q_idx, kv_idx = index_grid(
                batch,
                self.num_heads,
                torch.zeros(1, dtype=torch.long, device=like.device),
                torch.arange(n_k, device=like.device),
            )
            zero = torch.zeros((), dtype=like.dtype, device=like.device)  # the scores' dtype
            bias = self._scores(zero, b, h, q_idx, kv_idx)
            hides_keys = not bool(bias.isfinite().all())
        else:
            return dispatch, None
        if hides_keys:  # a query may see no key, which these kernels cannot tell
            again = cpu_path(replace(facts, bias_hides_keys=True))
            return again, bias if again.path is dispatch.path else None
        return dispatch, bias

    def _forward_flex(self, query, key, value, attention_mask, is_causal) -> AttentionOutput:
        """FlexAttention given the variant's own methods: compiled on CUDA (the fast path
        there), eager on the CPU (how the test suite runs it without a GPU)."""
        q, k, v = self._projected(query, key, value)  # (B, H, N, d)
        context, empty = flex_mod_attention(
            q,
            k,
            v,
            self.score_mod if self._has_score_mod else None,
            self.mask_mod if self._has_mask_mod else None,
            attention_mask,
            is_causal,
            self.scale,
        )
        return AttentionOutput(self._output(context, query, empty), None)

    # --- decoding: a key/value cache, the mods evaluated at the kept positions ----------
    def prefill_state(self, prompt, attention_mask, max_length, **extra):
        output = self(prompt, attention_mask=attention_mask, is_causal=True, **extra).output
        _, k, v = self._projected(prompt, prompt, prompt)  # (B, H, P, d), positioned
        cache = TokenCache.of_prompt(
            prompt, attention_mask, max_length, window=self._checked_window(), keys=k, values=v
        )
        return output, cache

    def step_state(self, token, state) -> torch.Tensor:
        position = torch.tensor([state.length], device=token.device)
        q, k, v = self._projected(token, token, token, position)  # (B, H, 1, d)
        batch = token.shape[0]
        state.append(keys=k, values=v)
        kept = state.kept_entries()
        keys, values = kept["keys"], kept["values"]  # (B, H, L, d): the cache, new token included
        allowed = state.kept_real()[:, None, None, :]  # (B, 1, 1, L)
        if not (self._has_score_mod or self._has_mask_mod):
            context, empty = cached_attention(q, keys, values, allowed, self.scale)
            return self._output(context, token, empty)
        b, h, q_idx, kv_idx = index_grid(batch, self.num_heads, position, state.kept_positions())
        if not self._has_score_mod:  # a mask alone: one fused call over the allowed keys
            allowed = allowed & self._mask(b, h, q_idx, kv_idx)
            context, empty = cached_attention(q, keys, values, allowed, self.scale)
            return self._output(context, token, empty)
        scores = q @ keys.transpose(-2, -1) * self.scale  # (B, H, 1, L)
        scores = self._scores(scores, b, h, q_idx, kv_idx).to(q.dtype).broadcast_to(scores.shape)
        if self._has_mask_mod:
            allowed = allowed & self._mask(b, h, q_idx, kv_idx)
        scores = scores.masked_fill(~allowed, -math.inf)
        weights = masked_softmax(scores, None)  # (B, H, 1, L)
        empty = torch.isneginf(scores.amax(dim=-1)).all(dim=1)[..., None]  # (B, 1, 1)
        return self._output(weights @ values, token, empty)

    # --- attention on heads projected elsewhere (playground.hf's kernel-level bridge) -----
    def attend_heads(self, q, k, v, allowed, *, scale, q_idx, kv_idx, dropout=0.0):
        """The mods on another model's q, k and v (`AttentionVariant.attend_heads`):
        `position_mod` at q_idx and kv_idx, `mask_mod` and `score_mod` on the index grid,
        grouped key/value heads read by their query heads. A `context_mod` reads the
        layer's input, which an attention function is not given: refused."""
        if type(self).context_mod is not SoftmaxAttention.context_mod:
            raise UnsupportedFeature(
                self.name,
                "attention on heads projected elsewhere (transformers' AttentionInterface)",
                "its context_mod changes each head's output by the layer's input, which an "
                "attention function is not given; swap the whole attention module instead: "
                f"playground.hf.swap_attention(model, {self.name!r})",
            )
        q, k = self._positioned(q, k, q_idx, kv_idx)
        b, h, q_grid, kv_grid = index_grid(q.shape[0], q.shape[1], q_idx, kv_idx)
        if self._has_mask_mod:
            rule = self._mask(b, h, q_grid, kv_grid)  # (B or 1, H or 1, Nq, Nk)
            allowed = rule if allowed is None else allowed & rule
        if not self._has_score_mod:  # one fused call, the groups read in place
            return cached_attention(q, k, v, allowed, scale, dropout)[0]
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scores = q @ k.transpose(-2, -1) * scale  # (B, H, Nq, Nk)
        scores = self._scores(scores, b, h, q_grid, kv_grid).to(q.dtype).broadcast_to(scores.shape)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, -math.inf)
        weights = masked_softmax(scores, None)  # 0 on a row that sees no key
        weights = F.dropout(weights, dropout, training=dropout > 0)
        return weights @ v

    def _checked_window(self) -> int | None:
        window = self.decoding_window()
        if window is None or (
            isinstance(window, int) and not isinstance(window, bool) and window >= 1
        ):
            return window
        raise self._hook_problem(
            "decoding_window()",
            f"returned {_described(window)}; it must return how many of the latest keys a "
            "query can still see (a positive integer), or None for all of them",
        )


class ExactAttention(SoftmaxAttention):
    """Softmax attention with nothing changed: what fidelity and the patterns figure
    compare every variant against. Part of the core, not a registered variant, so that
    the comparison does not depend on which plugins are installed."""

    name = "exact"
    summary = "exact multi-head softmax attention"
    paper = "Vaswani et al. 2017, Attention Is All You Need, §3.2"
