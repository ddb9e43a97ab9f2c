"""Sliding-window attention, as in Mistral 7B (Jiang et al. 2023, §2, "Sliding Window
Attention"; Beltagy et al. 2020 before it).

Each query sees the W keys nearest to it:

    causal:          i − W < j ≤ i          (W keys, HF's sliding-window convention)
    bidirectional:   |i − j| < W

The mask is the same both ways, |i − j| < W; the call's `is_causal` removes j > i. The
core's blocked path skips every key outside a block's window, so time and memory grow as
n · W. Decoding keeps the last W keys and values in a rolling buffer (Mistral §2, "Rolling
Buffer Cache"), so its state stops growing at W tokens.
"""

from dataclasses import dataclass

import playground
from playground.heads import attention_flops, projection_flops


@dataclass(frozen=True)
class SlidingWindowConfig(playground.SoftmaxConfig):
    window: int = 512
    """W: a query sees the keys less than W positions away (causally, the W last ones)."""

    def __post_init__(self):
        super().__post_init__()
        playground.require_positive(self, "window")


class SlidingWindowAttention(playground.SoftmaxAttention):
    name, summary = "sliding_window", "Softmax attention over the W nearest keys."
    paper = "Jiang et al. 2023, Mistral 7B, §2 (sliding window attention)"
    Config = SlidingWindowConfig
    colour = "#17becf"  # cyan, in every figure
    suite_options = {**playground.SoftmaxAttention.suite_options, "window": 4}
    # The reference scores every pair and masks; the fast path attends to the window only.
    flops_counted_path = "fast"

    @staticmethod
    def flops(n_q, n_k, d_model, num_heads, window=512, **options):
        # (query, key) pairs with |i − j| < W: each query's window, cut at the ends.
        pairs = sum(max(0, min(i + window, n_k) - max(i - window + 1, 0)) for i in range(n_q))
        return projection_flops(n_q, n_k, d_model) + attention_flops(pairs, d_model)

    @classmethod
    def picture_options(cls, options, seq_len):
        return {**options, "window": playground.picture_width(options.get("window", 512), seq_len)}

    def mask_mod(self, b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() < self.config.window

    def decoding_window(self):
        return self.config.window  # a decoded token sees the last W keys: a rolling buffer


@playground.hookimpl
def register_attention(register):
    register(SlidingWindowAttention)
