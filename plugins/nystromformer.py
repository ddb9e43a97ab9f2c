"""Nyströmformer: Xiong et al. 2021, "Nyströmformer: A Nyström-Based Algorithm for
Approximating Self-Attention", §3.

The softmax matrix is approximated from m landmarks, the means of m contiguous segments
of the queries and of the keys (§3.2, "segment-means"):

    F̃ = softmax(Q K̃ᵀ / √d),  Ã = softmax(Q̃ K̃ᵀ / √d),  B̃ = softmax(Q̃ Kᵀ / √d)
    softmax(Q Kᵀ / √d) V  ≈  F̃ Ã⁺ (B̃ V)                                   (§3.1, eq. 14)

with Ã⁺ the Moore–Penrose pseudo-inverse by the iteration of Razavi et al. 2014 (§3.2,
eq. 16): Z₀ = Ãᵀ / (max column sum of Ã), then

    Z_{j+1} = ¼ Z_j (13 I − Ã Z_j (15 I − Ã Z_j (7 I − Ã Z_j)))

six times, as in the paper's code and HF's `NystromformerSelfAttention`. An optional
depthwise convolution over the values along the sequence is added as a skip (§4, the
official code's `conv_kernel_size`; HF's default 65, off here by default). Segments have
⌈n/m⌉ or ⌊n/m⌋ tokens when m does not divide n; below m tokens each token is its own
landmark, and the approximation tends to exact attention. Z₀'s scale is the maximum over
one sequence's heads (HF takes it over the whole batch, which couples the sequences).

Landmarks mix every position, so the method is neither causal nor defined under padding
(HF adds the mask to B̃ only, and its landmarks still average the padding): neither is
declared. The reference writes the three softmaxes out; the fast path runs B̃ V and
F̃ (Ã⁺ B̃ V) as two fused SDPA calls (landmark queries over all keys, then every query
over the landmark keys), O(n · m) time and memory either way.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import playground
from playground import AttentionOutput, AttentionVariant, Capabilities, VariantConfig
from playground.heads import add_projections, project_heads, project_output, projection_flops


@dataclass(frozen=True)
class NystromConfig(VariantConfig):
    num_landmarks: int = 64
    """m, the landmarks (segment means) of queries and of keys (HF: 64)."""
    pinv_iterations: int = 6
    """Iterations of the pseudo-inverse (the paper's code and HF: 6)."""
    conv_kernel_size: int = 0
    """Width of the depthwise convolution over values added as a skip; 0 = none (HF: 65).
    Odd, so that it keeps the sequence's length."""
    bias: bool = True
    """Add a bias to the q/k/v/out projections (HF's have one)."""

    def __post_init__(self) -> None:
        playground.require_positive(self, "num_landmarks", "pinv_iterations")
        if self.conv_kernel_size < 0 or (self.conv_kernel_size and self.conv_kernel_size % 2 == 0):
            raise ValueError(
                f"conv_kernel_size must be 0 (no convolution) or odd; got {self.conv_kernel_size}"
            )


def segment_means(x: torch.Tensor, m: int) -> torch.Tensor:
    """(B, H, N, d) -> (B, H, m, d): means of m contiguous segments of N (m <= N), the
    first N mod m of them one token longer."""
    n = x.shape[2]
    sizes = torch.full((m,), n // m, device=x.device)
    sizes[: n % m] += 1
    segment = torch.repeat_interleave(torch.arange(m, device=x.device), sizes)  # (N,)
    sums = x.new_zeros(*x.shape[:2], m, x.shape[-1]).index_add_(2, segment, x)
    return sums / sizes.to(x.dtype)[:, None]


def iterative_pinv(matrix: torch.Tensor, iterations: int) -> torch.Tensor:
    """Ã⁺ of (B, H, m, m') by eq. 16, Z₀ scaled by the largest column sum per sequence."""
    scale = matrix.sum(dim=-2).amax(dim=(-2, -1), keepdim=True)[..., None]  # (B, 1, 1, 1)
    z = matrix.transpose(-2, -1) / scale
    identity = torch.eye(matrix.shape[-2], dtype=matrix.dtype, device=matrix.device)
    for _ in range(iterations):
        az = matrix @ z
        z = 0.25 * z @ (13 * identity - az @ (15 * identity - az @ (7 * identity - az)))
    return z


class NystromAttention(AttentionVariant):
    name = "nystromformer"
    summary = "Softmax approximated from m segment-mean landmarks and an iterative pinv."
    paper = "Xiong et al. 2021, Nyströmformer, §3"
    Config = NystromConfig
    colour = "#bcbd22"  # olive, in every figure
    capabilities = Capabilities(
        cross_attention=True,
        need_weights=True,
        weights_sum_to_one=False,  # F̃ Ã⁺ B̃ approximates a distribution; it is none
        weights_nonnegative=False,
        dtypes=(torch.float32, torch.float64),
    )
    suite_options = {"num_landmarks": 4}  # fewer landmarks than most suite lengths
    # flops() is F̃ (Ã⁺ (B̃ V)), the order of §3.3's linear cost, which the fast path takes;
    # the reference forms F̃ Ã⁺ (Nq × m) first, m² more per query and head.
    flops_counted_path = "fast"

    @staticmethod
    def flops(n_q: int, n_k: int, d_model: int, num_heads: int, **options: Any) -> float:
        m = min(int(options.get("num_landmarks", 64)), n_q, n_k)
        head_dim = d_model // num_heads
        # Q K̃ᵀ and F̃ (Ã⁺ B̃ V); Q̃ K̃ᵀ; Q̃ Kᵀ and B̃ V.
        softmaxes = 2 * 2 * (n_q * m + m * n_k) * d_model + 2 * m * m * d_model
        iterations = int(options.get("pinv_iterations", 6))
        pinv = iterations * 4 * 2 * m**3 * num_heads + 2 * m * m * head_dim * num_heads
        conv = 2 * n_k * d_model * int(options.get("conv_kernel_size", 0))
        return projection_flops(n_q, n_k, d_model) + float(softmaxes + pinv + conv)

    @classmethod
    def capabilities_for(cls, config: VariantConfig) -> Capabilities:
        """With the convolutional skip, self-attention only: it mixes values by position,
        so the queries' and the keys' must be the same."""
        assert isinstance(config, NystromConfig), "built from its own Config"
        if config.conv_kernel_size:
            return dataclasses.replace(cls.capabilities, cross_attention=False)
        return cls.capabilities

    def __init__(self, d_model: int = 512, num_heads: int = 8, **options: object) -> None:
        super().__init__(d_model, num_heads, **options)
        add_projections(self, d_model, bias=self.config.bias)
        width = self.config.conv_kernel_size
        self.conv = None
        if width:
            self.conv = nn.Conv2d(
                num_heads,
                num_heads,
                (width, 1),
                padding=(width // 2, 0),
                groups=num_heads,
                bias=False,
            )

    def _landmarks(self, query, key, value):
        q, k, v = project_heads(self, query, key, value)
        m = min(self.config.num_landmarks, q.shape[2], k.shape[2])
        return q, k, v, segment_means(q, m), segment_means(k, m)

    def _add_conv_skip(self, context: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return context if self.conv is None else context + self.conv(v)

    def forward_reference(
        self, query, key, value, attention_mask, is_causal, need_weights
    ) -> AttentionOutput:
        q, k, v, q_landmarks, k_landmarks = self._landmarks(query, key, value)
        scale = 1 / math.sqrt(self.head_dim)
        kernel_1 = (q @ k_landmarks.transpose(-2, -1) * scale).softmax(dim=-1)  # F̃ (·, N, m)
        kernel_2 = (q_landmarks @ k_landmarks.transpose(-2, -1) * scale).softmax(dim=-1)  # Ã
        kernel_3 = (q_landmarks @ k.transpose(-2, -1) * scale).softmax(dim=-1)  # B̃ (·, m, N)
        mixing = kernel_1 @ iterative_pinv(kernel_2, self.config.pinv_iterations)  # F̃ Ã⁺
        context = self._add_conv_skip(mixing @ (kernel_3 @ v), v)
        weights = mixing @ kernel_3 if need_weights else None  # (B, H, Nq, Nk)
        return AttentionOutput(project_output(self, context, None), weights)

    # --- fast path ----------------------------------------------------------------------
    def forward_fast(
        self, query, key, value, attention_mask, is_causal, need_weights
    ) -> AttentionOutput:
        q, k, v, q_landmarks, k_landmarks = self._landmarks(query, key, value)
        scale = 1 / math.sqrt(self.head_dim)
        landmark_values = F.scaled_dot_product_attention(q_landmarks, k, v)  # B̃ V (·, m, d)
        kernel_2 = (q_landmarks @ k_landmarks.transpose(-2, -1) * scale).softmax(dim=-1)
        mixed = iterative_pinv(kernel_2, self.config.pinv_iterations) @ landmark_values
        context = F.scaled_dot_product_attention(q, k_landmarks, mixed)  # F̃ (Ã⁺ B̃ V)
        return AttentionOutput(project_output(self, self._add_conv_skip(context, v), None), None)


@playground.hookimpl
def register_attention(register):
    register(NystromAttention)
