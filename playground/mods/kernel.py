"""A mod program run by the native blocked kernels: blocks of queries over their spans of
keys (as `kernels.blocked_attention`), each row's additive bias, −inf where hidden,
evaluated from the program while the row is in cache, forward and backward; the backward
sweeps the program in reverse for the gradients of its learned leaves and tables."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import torch

from playground.kernels import native
from playground.kernels.blocked import Block, check_blocks, native_blocks
from playground.kernels.common import differentiable_gradients, rows_unit_stride
from playground.kernels.reference import dense_attention
from playground.mods.program import ModProgram
from playground.mods.reference import dense_program_bias


class _ProgramBlocks(torch.autograd.Function):
    """`program_attention` on CPU: the native blocked forward and backward with each row's
    bias from a mod program, evaluated per row in cache; the backward also sweeps the
    program in reverse for the gradients of its leaves and tables (`sources`). Under
    create_graph=True, the program evaluated by torch instead
    (`mods.reference.dense_program_bias`, `differentiable_gradients`)."""

    # ctx: torch's FunctionCtx, carrying this Function's own attributes (blocks, program, ...).
    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        blocks: tuple[Block, ...],
        program: ModProgram,
        scale: float,
        *sources: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        kernels = native.load()
        assert kernels is not None, "program_attention runs only where the kernels are built"
        blocks_tensor = native_blocks(blocks)
        out, log_sum_exp = kernels.program_forward(
            q, k, v, blocks_tensor, *program.arguments(), scale
        )
        ctx.save_for_backward(q, k, v, out, log_sum_exp)
        ctx.kernels, ctx.blocks, ctx.program, ctx.scale = kernels, blocks, program, scale
        ctx.sources = sources
        ctx.mark_non_differentiable(log_sum_exp)
        return out, log_sum_exp

    @staticmethod
    def backward(
        ctx: Any, grad_out: torch.Tensor, _: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, log_sum_exp = ctx.saved_tensors
        program: ModProgram = ctx.program
        sources: tuple[torch.Tensor, ...] = ctx.sources
        blocks: tuple[Block, ...] = ctx.blocks
        scale: float = ctx.scale
        if torch.is_grad_enabled():  # create_graph=True

            def recompute() -> torch.Tensor:
                context = torch.zeros_like(q)
                for start, stop, key_start, key_stop in blocks:
                    if key_stop > key_start and stop > start:
                        rows, keys = range(start, stop), range(key_start, key_stop)
                        bias = dense_program_bias(program, q.shape[0], q.shape[1], rows, keys)
                        context[:, :, start:stop] = dense_attention(
                            q[:, :, start:stop], k[:, :, key_start:key_stop],
                            v[:, :, key_start:key_stop], bias, scale,
                        )  # fmt: skip
                return context

            gradients = differentiable_gradients((q, k, v, *sources), grad_out, recompute)
            return (*gradients[:3], None, None, None, *gradients[3:])
        grad_k = torch.zeros(k.shape, dtype=k.dtype)
        grad_v = torch.zeros(v.shape, dtype=v.dtype)
        wanted = [t.requires_grad and ctx.needs_input_grad[6 + i] for i, t in enumerate(sources)]
        flags = iter(wanted)
        by_source = {id(t): next(flags) for t in sources}
        leaf_wanted = torch.tensor([by_source.get(id(t), False) for t in program.leaves])
        table_wanted = torch.tensor([by_source.get(id(t), False) for t in program.table_sources])
        kernels: ModuleType = ctx.kernels
        grad_q, *grads = kernels.program_backward(
            q, k, v, out, log_sum_exp, rows_unit_stride(grad_out), grad_k, grad_v,
            native_blocks(blocks), *program.arguments(), scale,
            program.differentiable, leaf_wanted.long(), table_wanted.long(),
        )  # fmt: skip
        leaf_grads = dict(zip(map(id, program.leaves), grads[: len(program.leaves)], strict=True))
        table_grads = dict(
            zip(map(id, program.table_sources), grads[len(program.leaves) :], strict=True)
        )
        source_grads: list[torch.Tensor | None] = []
        for source, want in zip(sources, wanted, strict=True):
            if not want:
                source_grads.append(None)
            elif id(source) in leaf_grads:
                source_grads.append(leaf_grads[id(source)])
            else:
                source_grads.append(table_grads[id(source)].view(source.shape).to(source.dtype))
        return (grad_q, grad_k, grad_v, None, None, None, *source_grads)


# torch leaves Function.apply unannotated; its signature is the forward's, less ctx: q, k,
# v, blocks, program, scale, then the sources (the program's tensors that need gradients).
_program_blocks: Callable[..., tuple[torch.Tensor, torch.Tensor]] = _ProgramBlocks.apply


def program_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    blocks: Sequence[Block],
    program: ModProgram,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks of queries over their spans of keys (as `blocked_attention`), each row's
    additive bias, −inf where hidden, from `program` (`mods.lowering.lower`), evaluated in
    the native kernels while the row is in cache: no bias is ever stored. -> (context
    (B, H, Nq, d), log-sum-exp (B, H, Nq), −inf for a query that sees no key, whose
    context is 0). float32 on CPU with the native kernels built (`native.load()`). The
    program's leaves and tables that need gradients get them (a reverse sweep of the
    program in the native backward)."""
    if native.load() is None or q.dtype != torch.float32 or q.device.type != "cpu":
        raise ValueError("program_attention runs float32 on CPU with the native kernels built")
    check_blocks(blocks, q.shape[2], k.shape[2])
    q, k, v = (rows_unit_stride(t) for t in (q, k, v))
    sources = program.gradient_inputs() if torch.is_grad_enabled() else []
    return _program_blocks(q, k, v, tuple(blocks), program, scale, *sources)
