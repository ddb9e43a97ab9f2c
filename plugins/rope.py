"""RoPE: Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding",
§3.4.

No position embeddings are added to the tokens; queries and keys are rotated by their
positions before they meet, so that their dot product depends on the offset only:

    f(x, m) = R_m x,    θ_i = base^(−2(i − 1)/d),  i = 1 … d/2           (§3.4.2, eq. 15)
    (R_m q)ᵀ (R_n k) = qᵀ R_(n − m) k                                    (eq. 16)

R_m rotates each pair of dimensions by m θ_i. In HF Llama's layout ("rotate half"),
dimension i pairs with i + d/2:

    R_m x = x ⊙ cos(m θ) + rotate_half(x) ⊙ sin(m θ),   rotate_half([x₁, x₂]) = [−x₂, x₁]

with θ repeated over both halves (§3.4.3 writes the same rotation for interleaved pairs).
Queries are at positions 0 … Nq − 1 and keys at 0 … Nk − 1 (`position_mod`); a decoded
token is rotated by its own position, and the cache keeps rotated keys. Then softmax
attention as usual, so every path of `SoftmaxAttention` serves: the fast one, with no
mods, is one fused SDPA call.
"""

import math
from dataclasses import dataclass

import torch

import playground


@dataclass(frozen=True)
class RopeConfig(playground.SoftmaxConfig):
    rope_base: float = 10000.0
    """The base of the frequencies θ_i (the paper and Llama: 10000; HF's `rope_theta`)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 < self.rope_base < math.inf:
            raise ValueError(f"rope_base must be a finite number above 1; got {self.rope_base}")


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[x₁, x₂] -> [−x₂, x₁] over the last dimension."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


class RopeAttention(playground.SoftmaxAttention):
    name, summary = "rope", "Softmax attention with rotary position embeddings on q and k."
    paper = "Su et al. 2021, RoFormer: Rotary Position Embedding, §3.4"
    Config = RopeConfig
    colour = "#8c564b"  # brown, in every figure
    flops_uncounted = "the rotations of q and k, 3 per token and feature"
    encodes_positions = True  # the rotation replaces position embeddings (§3.4)

    @staticmethod
    def flops(n_q: int, n_k: int, d_model: int, num_heads: int, **options: object) -> float:
        rotations = 3 * (n_q + n_k) * d_model  # x cos + rotate_half(x) sin, for q and k
        return playground.SoftmaxAttention.flops(n_q, n_k, d_model, num_heads) + rotations

    def __init__(self, d_model=512, num_heads=8, **options):
        super().__init__(d_model, num_heads, **options)
        if self.head_dim % 2:
            raise playground.ConfigError(
                f"rope rotates pairs of dimensions, so the head dimension d_model / "
                f"num_heads = {self.head_dim} must be even"
            )

    def frequencies(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """θ_i = base^(−2(i − 1)/d), (d/2,), from the option rather than a buffer: a
        module cast to bfloat16 must not round θ before the angles are formed."""
        exponents = torch.arange(0, self.head_dim, 2, dtype=dtype, device=device) / self.head_dim
        return 1.0 / self.config.rope_base**exponents

    def rotary_cos_sin(
        self, positions: torch.Tensor, like: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos(m θ) and sin(m θ), (N, d) in like's dtype, for the positions m (N,);
        computed in float32 (float64 for float64), as Llama does."""
        dtype = torch.float64 if like.dtype == torch.float64 else torch.float32
        angles = positions.to(dtype)[:, None] * self.frequencies(dtype, like.device)  # (N, d/2)
        angles = torch.cat([angles, angles], dim=-1)  # (N, d): θ over both halves
        return angles.cos().to(like.dtype), angles.sin().to(like.dtype)

    def position_mod(self, q, k, q_idx, kv_idx):
        """R_m q and R_n k (eq. 15): each query and key rotated by its own position, so a
        decoded token is rotated by its offset in the sequence."""
        cos, sin = self.rotary_cos_sin(q_idx, q)
        q = q * cos + rotate_half(q) * sin
        if kv_idx is not q_idx:  # a decoded token's key is at its query's position
            cos, sin = self.rotary_cos_sin(kv_idx, k)
        return q, k * cos + rotate_half(k) * sin


@playground.hookimpl
def register_attention(register):
    register(RopeAttention)
