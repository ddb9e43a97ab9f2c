"""What the kernels' fast paths share: when to step aside for torch.func, additive masks,
the hand-over to torch's own operations for differentiable gradients, and the row layout
the flash and native kernels read."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch


def additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where allowed, −inf elsewhere."""
    return torch.zeros_like(allowed, dtype=dtype).masked_fill(~allowed, -math.inf)


def transforms_active() -> bool:
    """Whether a torch.func transform (grad, vmap, jacrev, …) is running. The autograd
    functions here are written for plain autograd (no setup_context, no vmap rule): under
    a transform the paths made of torch's own operations run instead."""
    return torch._C._functorch.peek_interpreter_stack() is not None


def differentiable_gradients(
    inputs: Sequence[torch.Tensor | None],
    grad_output: torch.Tensor,
    recompute: Callable[[], torch.Tensor],
) -> list[torch.Tensor | None]:
    """The gradients of recompute() at `inputs` (None where one needs none), themselves
    differentiable. A fused backward's results are not, so under create_graph=True (a
    gradient penalty, a Hessian-vector product) the autograd functions here hand over to
    torch's own operations, at the memory of an unfused attention."""
    wanted = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    with torch.enable_grad():
        output = recompute()
    grads = iter(
        torch.autograd.grad(output, wanted, grad_output, create_graph=True, allow_unused=True)
    )
    return [
        next(grads) if isinstance(t, torch.Tensor) and t.requires_grad else None for t in inputs
    ]


def rows_unit_stride(tensor: torch.Tensor) -> torch.Tensor:
    """tensor (B, H, N, d) as it is when its rows are unit-stride, else a contiguous copy
    (a gradient that autograd expanded, say)."""
    rows_apart = tensor.shape[-2] == 1 or tensor.stride(-2) >= tensor.shape[-1]
    return tensor if tensor.stride(-1) == 1 and rows_apart else tensor.contiguous()
