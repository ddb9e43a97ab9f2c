"""ALiBi: Press et al. 2022, "Train Short, Test Long: Attention with Linear Biases
Enables Input Length Extrapolation", §3.

No position embeddings; each head h adds a penalty linear in the query–key distance:

    softmax(q_i Kᵀ / √d − m_h · |i − j|)        (§3; causally j ≤ i, so −m_h · (i − j))

The slopes m_h are a geometric sequence: for H a power of two, m_h = 2^(−8h/H),
h = 1 … H. Otherwise the H' = 2^⌊log₂ H⌋ slopes of H' heads come first, then every other
slope of 2H' heads, as in the paper's code and HF Bloom's `build_alibi_tensor`.
`learnable_slopes=True` makes them a Parameter (they stay fixed in the paper).
"""

from dataclasses import dataclass

import torch

import playground


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """(H,) the paper's geometric slopes, for any head count."""
    power = 2 ** (num_heads.bit_length() - 1)  # the largest power of two <= H
    slopes = 2.0 ** (-8.0 * torch.arange(1, power + 1) / power)
    extra = 2.0 ** (-8.0 * torch.arange(1, 2 * power + 1, 2) / (2 * power))
    return torch.cat([slopes, extra[: num_heads - power]])


@dataclass(frozen=True)
class AlibiConfig(playground.SoftmaxConfig):
    learnable_slopes: bool = False
    """Train the slopes m_h (a Parameter) instead of keeping the paper's fixed ones."""


class AlibiAttention(playground.SoftmaxAttention):
    name, summary = "alibi", "Softmax attention with a per-head linear distance penalty."
    paper = "Press et al. 2022, Train Short, Test Long (ALiBi), §3"
    Config = AlibiConfig
    colour = "#ff7f0e"  # orange, in every figure
    encodes_positions = True  # the bias replaces position embeddings (§3)
    relative_score_mod = True  # −m_h·|i − j| depends on j − i only

    def __init__(self, d_model=512, num_heads=8, **options):
        super().__init__(d_model, num_heads, **options)
        slopes = alibi_slopes(num_heads)  # (H,)
        if self.config.learnable_slopes:
            self.slopes = torch.nn.Parameter(slopes)
        else:
            self.register_buffer("slopes", slopes)

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return score - self.slopes[h] * (q_idx - kv_idx).abs()

    def learned_summary(self):
        """The trained slopes m_h (when `learnable_slopes`; fixed ones are not learned)."""
        return {"slope m_h per head": self.slopes} if self.config.learnable_slopes else {}


@playground.hookimpl
def register_attention(register):
    register(AlibiAttention)
