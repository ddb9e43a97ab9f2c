"""`biased_attention`: softmax(scale · q kᵀ + bias) v on the CPU flash kernel, with a fused
backward that gives the bias its gradient too (SDPA gives none for a mask), and
`hankel_biased_attention` for a bias given by its anti-diagonals, never formed as a matrix.
Also what `relative.py` builds on: the Hankel mask view, the native Hankel backward and the
second-order hand-over."""

from __future__ import annotations

import math

import torch

from playground.kernels import native
from playground.kernels.common import differentiable_gradients, rows_unit_stride, transforms_active
from playground.kernels.reference import dense_attention


class BackwardScratch:
    """Memory that the backward passes of the blocks of one call share.

    A fresh tensor of tens of MiB is new pages to the allocator, and the page faults of
    writing it cost about as much as the matrix product that fills it; the blocks of one
    call are differentiated one after another, so they can take turns with one buffer.
    Hold one per call (never across calls): it is freed with the autograd graph, so peak
    memory counts it.
    """

    def __init__(self) -> None:
        self._memory: dict[str, torch.Tensor] = {}
        self._zeroed: tuple | None = None  # (layout, address) of the zeroed Hankel buffer

    def matrix(self, name: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """A buffer of `shape` (contents undefined) in like's dtype and device."""
        size = math.prod(shape)
        memory = self._memory.get(name)
        if (
            memory is None
            or memory.numel() < size
            or memory.dtype != like.dtype
            or memory.device != like.device
        ):
            memory = self._memory[name] = like.new_empty(size)
        return memory[:size].view(shape)

    def hankel(
        self, shape: tuple[int, int, int, int], like: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(skew (B, H, Nq, Nq + Nk − 1), view (B, H, Nq, Nk)) with view[b, h, i, j] =
        skew[b, h, i, i + j] and skew zero elsewhere: what is written to the view, summed
        over queries (skew.sum(2)), is summed along each anti-diagonal i + j = t. Only
        the view is ever written, so the rest stays zero while the layout stays."""
        batch, heads, n_q, n_k = shape
        width = n_q + n_k - 1
        layout = (batch, heads, n_q, width)
        skew = self.matrix("hankel", layout, like)
        if self._zeroed != (layout, skew.data_ptr()):
            skew.zero_()
            self._zeroed = (layout, skew.data_ptr())
        view = skew.as_strided(shape, (heads * n_q * width, n_q * width, width + 1, 1))
        return skew, view


def hankel_mask(diagonals: torch.Tensor, keep: torch.Tensor | None, n_k: int) -> torch.Tensor:
    """The additive mask B[h, i, j] = diagonals[h, i + j] over n_k keys: (1, H, Nq, n_k), a
    strided view; with keep (B, 1, 1, n_k), a (B, H, Nq, n_k) tensor with −inf at hidden keys."""
    mask = diagonals.unfold(-1, n_k, 1)[None]
    return mask if keep is None else mask.masked_fill(~keep, -math.inf)


class _FlashWithBiasGradient(torch.autograd.Function):
    """softmax(scale · q kᵀ + B) v for one block, with the gradient of the bias too (SDPA
    gives none for `attn_mask`, and falls back to its unfused kernel when the mask needs
    one). B is `bias` as given, broadcast to (B, H, Nq, Nk), or, when `hankel`, the Hankel
    matrix B[h, i, j] = bias[h, i + j] of bias (H, Nq + Nk − 1).

    forward: the CPU flash kernel, keeping its output O and per-row log-sum-exp L; saved
    for backward are only these, the inputs and `bias` as given (no (Nq, Nk) tensor unless
    the caller made one) and padding as a (B, Nk) mask.
    backward, from the block's recomputed probabilities P = exp(scale · q kᵀ + B − L):
    dv = Pᵀ dO, dP = dO vᵀ, dS = P ⊙ (dP − rowsum(dO ⊙ O)), dq = scale · dS k,
    dk = scale · dSᵀ q: five products, as many as the flash backward's own, which cannot
    return dS. The bias gets dS summed over what it broadcasts, or for a Hankel bias along
    anti-diagonals: dS (at a batch, its sum over the batch) is written skewed
    (`BackwardScratch.hankel`) so that each anti-diagonal is a column, and one sum over
    queries gives them all.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, keep, scale, hankel, scratch):
        if hankel:
            mask = hankel_mask(bias, keep, k.shape[2])
        else:
            mask = bias if keep is None else bias.masked_fill(~keep, -math.inf)
        out, log_sum_exp = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, attn_mask=mask, scale=scale
        )  # a row that sees no key: O = 0, L = 0
        ctx.save_for_backward(q, k, v, bias, keep, out, log_sum_exp)
        ctx.scale, ctx.hankel, ctx.scratch = scale, hankel, scratch
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, bias, keep, out, log_sum_exp = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True
            return (*second_order_biased(ctx, grad_out, None), None, None, None, None)
        dtype = q.dtype
        if dtype in (torch.bfloat16, torch.float16):
            # The flash kernel keeps L in float32; the backward runs there too, as SDPA's
            # own low-precision backward accumulates in float32.
            q, k, v, bias, out, grad_out = (t.float() for t in (q, k, v, bias, out, grad_out))
        if ctx.hankel and q.dtype == torch.float32 and native.load() is not None:
            grads = native_hankel_backward(ctx, grad_out, False)
            return (*(g.to(dtype) for g in grads), None, None, None, None)
        (batch, heads, block), n_k = q.shape[:3], k.shape[2]
        scratch = ctx.scratch or BackwardScratch()
        q, k, v = q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)  # (B·H, ·, d)
        grad_out, out = grad_out.flatten(0, 1), out.flatten(0, 1)
        # S − L = (B − L) + scale · q kᵀ: one pass writes B − L, the product adds to it.
        scores = scratch.matrix("scores", (batch * heads, block, n_k), q)
        grid = scores.view(batch, heads, block, n_k)
        bias_grid = bias.unfold(-1, n_k, 1) if ctx.hankel else bias
        torch.sub(bias_grid, log_sum_exp.to(scores.dtype)[..., None], out=grid)
        if keep is not None:
            grid.masked_fill_(~keep, -math.inf)
        scores.baddbmm_(q, k.transpose(1, 2), alpha=ctx.scale)
        # exp is many times slower below −87, where float32 underflows, than above it:
        # clamp there, then set what was clamped (P <= 1.65e−38: every hidden key) to 0.
        probabilities = torch.threshold_(scores.clamp_(min=-87.0).exp_(), 1.7e-38, 0.0)  # P
        # Products with a transposed operand run fastest as (d, ·) · (·, Nk), so dv and dk
        # are formed transposed: dvᵀ = dOᵀ P, dkᵀ = scale · qᵀ dS.
        grad_v = torch.bmm(grad_out.transpose(1, 2).contiguous(), probabilities)
        row_dot = (grad_out * out).sum(dim=-1, keepdim=True)  # rowsum(dO ⊙ O)
        # dP − rowsum(dO ⊙ O) (a baddbmm onto the broadcast row sums takes a per-matrix
        # loop on CPU: slower than the product and a subtraction).
        grad_scores = scratch.matrix("grad_scores", (batch * heads, block, n_k), q)
        grad_scores.baddbmm_(grad_out, v.transpose(1, 2), beta=0).sub_(row_dot)
        if ctx.hankel and batch == 1:
            # dS written skewed (products would not write a strided output), its
            # anti-diagonals summed below. With a batch, the sum over it comes first (it is
            # contiguous), and only that (H, Nq, Nk) is skewed: B times less to zero and sum.
            skew, skewed = scratch.hankel((batch, heads, block, n_k), q)
            grad_scores = torch.mul(grad_scores, probabilities, out=skewed.flatten(0, 1))
        else:
            grad_scores = grad_scores.mul_(probabilities)  # dS
        grad_q = torch.bmm(grad_scores, k).mul_(ctx.scale)
        grad_k = torch.bmm(q.transpose(1, 2).contiguous(), grad_scores).mul_(ctx.scale)
        if ctx.hankel:
            if batch > 1:
                skew, skewed = scratch.hankel((1, heads, block, n_k), q)
                torch.sum(grad_scores.view(batch, 1, heads, block, n_k), dim=0, out=skewed)
            grad_bias = skew.sum(dim=2).sum_to_size(bias.shape)  # (H, Nq + Nk − 1)
        else:
            grad_bias = grad_scores.view(batch, heads, block, n_k).sum_to_size(bias.shape)
        shape = (batch, heads, -1, q.shape[-1])
        transposed = (batch, heads, q.shape[-1], -1)
        return (
            grad_q.view(shape).to(dtype),
            grad_k.view(transposed).transpose(2, 3).to(dtype),
            grad_v.view(transposed).transpose(2, 3).to(dtype),
            grad_bias.to(dtype),
            None,
            None,
            None,
            None,
        )


def second_order_biased(ctx, grad_out: torch.Tensor, hankel: bool | None) -> list:
    """q, k, v and bias gradients, differentiable, for a context that saved (q, k, v,
    bias, keep, out, log_sum_exp) and its `scale` (and `hankel`, unless given)."""
    q, k, v, bias, keep, _, _ = ctx.saved_tensors
    hankel = ctx.hankel if hankel is None else hankel

    def recompute():
        if hankel:
            mask = hankel_mask(bias, keep, k.shape[2])
        else:
            mask = bias if keep is None else bias.masked_fill(~keep, -math.inf)
        return dense_attention(q, k, v, mask.expand(*q.shape[:3], k.shape[2]), ctx.scale)

    return differentiable_gradients((q, k, v, bias), grad_out, recompute)


def _keys_kept(keep: torch.Tensor | None, batch: int, n_k: int) -> torch.Tensor:
    """keep (B or 1, 1, 1, Nk) -> a contiguous (B, Nk) bool tensor; None -> an empty one."""
    if keep is None:
        return torch.empty(0, dtype=torch.bool)
    return keep.expand(batch, 1, 1, n_k).reshape(batch, n_k).contiguous()


def native_hankel_backward(ctx, grad_out: torch.Tensor, causal: bool) -> tuple:
    """dq, dk, dv and the Hankel bias's gradient (float32) from `playground.kernels.native`,
    for a context that saved (q, k, v, bias, keep, out, log_sum_exp) and its `scale`."""
    q, k, v, bias, keep, out, log_sum_exp = ctx.saved_tensors
    module = native.load()
    assert module is not None, "taken only where the native kernels are built"
    grad_q, grad_k, grad_v, grad_bias = module.hankel_biased_backward(
        *(rows_unit_stride(t.float()) for t in (q, k, v)),
        bias.float().contiguous(),
        _keys_kept(keep, q.shape[0], k.shape[2]),
        rows_unit_stride(out.float()),
        log_sum_exp.contiguous(),
        rows_unit_stride(grad_out.float()),
        ctx.scale,
        causal,
    )
    return grad_q, grad_k, grad_v, grad_bias.sum(dim=0).sum_to_size(bias.shape)  # over B


def biased_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    scale: float,
    keep: torch.Tensor | None = None,
    scratch: BackwardScratch | None = None,
) -> torch.Tensor:
    """softmax(scale · q kᵀ + bias) v -> (B, H, Nq, d) on the CPU flash kernel, with the
    gradient of `bias` as well as of q, k and v (`_FlashWithBiasGradient`).

    q (B, H, Nq, d), k and v (B, H, Nk, d); bias broadcasts to (B, H, Nq, Nk) and may be
    a view (it is what is kept for backward, with `keep`); keep (B, 1, 1, Nk) bool, if
    given, hides keys (−inf). A row that sees no key outputs 0. Blocks of one call that
    pass the same `scratch` share their backward's memory.
    """
    if transforms_active():
        mask = bias if keep is None else bias.masked_fill(~keep, -math.inf)
        return dense_attention(q, k, v, mask, scale)
    return _FlashWithBiasGradient.apply(q, k, v, bias, keep, scale, False, scratch)


def hankel_biased_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    diagonals: torch.Tensor,
    scale: float,
    keep: torch.Tensor | None = None,
    scratch: BackwardScratch | None = None,
) -> torch.Tensor:
    """`biased_attention` with the Hankel bias B[h, i, j] = diagonals[h, i + j],
    diagonals (H, Nq + Nk − 1): never formed as a matrix, and its gradient is reduced
    along anti-diagonals inside the backward."""
    if transforms_active():
        return dense_attention(q, k, v, hankel_mask(diagonals, keep, k.shape[2]), scale)
    return _FlashWithBiasGradient.apply(q, k, v, diagonals, keep, scale, True, scratch)
