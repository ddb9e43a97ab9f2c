"""Linear layers on the faster of torch's two float32 CPU matrix-product libraries.

torch computes a float32 `F.linear` on CPU with its BLAS (Intel MKL in the PyPI builds).
MKL picks its kernels by CPU vendor: on an AMD CPU it runs its AVX2 code even where the
CPU has full-width AVX-512 (Zen 5), which is about half of what that CPU can do. torch
also ships oneDNN, which picks kernels by instruction set and so runs AVX-512 there. This
module gives `nn.Linear` layers a forward and backward on oneDNN's linear
(`torch.ops.mkldnn._linear_pointwise`) where that pays: float32 tensors on a CPU that is
not Intel's. Elsewhere, and for every other dtype and device, it is `F.linear` unchanged.

The choice is made once per process, from the CPU vendor (not by timing, so that a seed's
numbers do not depend on a noisy race), and can be forced with PLAYGROUND_LINEAR=onednn
or PLAYGROUND_LINEAR=blas. The two libraries round differently (sums in another order),
so a run's numbers are reproducible with the same backend; `backend()` says which is in
use and `env.json` records it. The GEMM ceiling every efficiency is measured against
(`playground.run.instruments.gemm_flops_per_second`) is the faster of the two libraries, and
`env.json` records both rates.

`use_fast_linears(module)` turns every plain `nn.Linear` of a module into a `FastLinear`
(same parameters, same state_dict, still an `nn.Linear`): the classifier model does this
for its own layers and its attention's projections.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Literal, cast

import torch
import torch.nn.functional as F
from torch import nn

from playground.model.cpu_detection import cpuinfo_field

Backend = Literal["onednn", "blas"]
VARIABLE = "PLAYGROUND_LINEAR"

_backend: Backend | None = None


def _cpu_vendor() -> str:
    """The CPU's vendor id (`GenuineIntel`, `AuthenticAMD`, …) on Linux; "" elsewhere."""
    return cpuinfo_field("vendor_id")


def _onednn_op_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def _default_backend() -> Backend:
    chosen = os.environ.get(VARIABLE, "").strip().lower()
    if chosen not in ("", "onednn", "blas"):
        raise ValueError(
            f"{VARIABLE}={chosen!r} is not a backend: use onednn or blas, or unset it to "
            "let the playground choose by CPU"
        )
    if not _onednn_op_available():
        return "blas"
    if chosen:
        return "onednn" if chosen == "onednn" else "blas"  # `chosen` is one of them (above)
    vendor = _cpu_vendor()
    return "onednn" if vendor and vendor != "GenuineIntel" else "blas"


def backend() -> Backend:
    """The library float32 CPU `FastLinear`s use in this process."""
    global _backend
    if _backend is None:
        _backend = _default_backend()
    return _backend


def set_backend(name: Backend | None) -> None:
    """Use `name` from now on in this process (None: choose again, from the environment
    and the CPU). For measuring one against the other; layers need not be rebuilt."""
    global _backend
    if name not in (None, "onednn", "blas"):
        raise ValueError(f"unknown linear backend {name!r}: use 'onednn' or 'blas'")
    if name == "onednn" and not _onednn_op_available():
        raise RuntimeError("this torch has no oneDNN linear (torch.ops.mkldnn._linear_pointwise)")
    _backend = name


def onednn_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x (M, in) @ weightᵀ (+ bias) -> (M, out) on oneDNN. x and weight may have any
    strides (oneDNN reads them, copying where it must); bias must be contiguous (its
    strides are ignored). The GEMM ceiling (`playground.run.instruments`) times it too."""
    # torch.ops are looked up at run time, so untyped: this one returns a tensor.
    return cast(torch.Tensor, torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], ""))


def onednn_computes(device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether `FastLinear` can put products of this device and dtype on oneDNN (float32
    CPU tensors, in a torch that has its linear), whichever backend is chosen."""
    return torch.device(device).type == "cpu" and dtype == torch.float32 and _onednn_op_available()


class _OneDNNLinear(torch.autograd.Function):
    """y = x Wᵀ + b with every product on oneDNN: dx = dy W, dW = dyᵀ x, db = Σ dy.

    Under `create_graph` (a gradient of a gradient) the backward is written in torch's
    own differentiable operations instead, so second-order gradients are right."""

    # ctx: torch's FunctionCtx, carrying this Function's own attributes (input_shape, ...).
    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])  # (M, in)
        # Each is kept only for the gradient that reads it: x for dW, W for dx.
        ctx.save_for_backward(
            rows if ctx.needs_input_grad[1] else None,
            weight if ctx.needs_input_grad[0] else None,
        )
        ctx.input_shape, ctx.out_features = x.shape, weight.shape[0]
        ctx.has_bias = bias is not None
        return onednn_linear(rows, weight, bias).reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(
        ctx: Any, grad_out: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        rows, weight = ctx.saved_tensors
        grad_rows = grad_out.reshape(-1, ctx.out_features)  # (M, out)
        differentiable = torch.is_grad_enabled()  # create_graph=True
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            product = grad_rows @ weight if differentiable else onednn_linear(grad_rows, weight.t())
            grad_x = product.reshape(ctx.input_shape)
        if ctx.needs_input_grad[1]:
            # oneDNN reads the transposes through copies, and is still the faster here.
            grad_weight = (
                grad_rows.t() @ rows if differentiable else onednn_linear(grad_rows.t(), rows.t())
            )  # (out, in)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad_rows.sum(dim=0)
        return grad_x, grad_weight, grad_bias


# torch leaves Function.apply unannotated; its signature is the forward's, less ctx.
_onednn_linear_function: Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor
] = _OneDNNLinear.apply


def _applies(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether oneDNN computes this product: float32 CPU tensors of matching shapes, at
    least one row, outside autocast, tracing and torch.func transforms (which need
    torch's own operations); everything else is F.linear's, errors included."""
    return (
        not torch.jit.is_tracing()  # first: a traced shape comparison would be a tensor
        and backend() == "onednn"
        and x.device.type == "cpu"
        and x.dtype == weight.dtype == torch.float32
        and weight.dim() == 2
        and x.dim() >= 1
        and x.shape[-1] == weight.shape[1]
        and (bias is None or (bias.dtype == torch.float32 and bias.shape == weight.shape[:1]))
        and x.numel() > 0
        and weight.numel() > 0
        and not (x.is_mkldnn or weight.is_mkldnn)
        and not torch.is_autocast_enabled("cpu")  # autocast casts inside F.linear
        and torch._C._functorch.peek_interpreter_stack() is None
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)`, on oneDNN where `backend()` says so and it applies."""
    if _applies(x, weight, bias):
        # oneDNN reads a bias as contiguous whatever its strides: give it one that is.
        return _onednn_linear_function(x, weight, None if bias is None else bias.contiguous())
    return F.linear(x, weight, bias)


class FastLinear(nn.Linear):
    """An `nn.Linear` whose forward is `playground.model.linear_layers.linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def use_fast_linears(module: nn.Module) -> int:
    """Make every plain `nn.Linear` in `module` a `FastLinear`, in place (its parameters,
    hooks and state_dict are kept); returns how many. Subclasses of nn.Linear are left
    alone: their forward may be their own."""
    count = 0
    for each in module.modules():
        if type(each) is nn.Linear:
            each.__class__ = FastLinear
            count += 1
    return count
