"""Linear attention: Katharopoulos et al. 2020, "Transformers are RNNs: Fast
Autoregressive Transformers with Linear Attention", §3.2–3.4.

Softmax's similarity exp(qᵀk) is replaced by a kernel φ(q)ᵀφ(k) with the feature map
φ(x) = elu(x) + 1 (§3.2.1), so that the sums over keys can be taken once for all queries:

    V'_i = φ(Q_i)ᵀ Σ_j φ(K_j) V_jᵀ  /  φ(Q_i)ᵀ Σ_j φ(K_j)                 (§3.2, eq. 5)

Under causal masking the sums run over j ≤ i: prefix sums S_i = Σ_{j≤i} φ(K_j) V_jᵀ and
z_i = Σ_{j≤i} φ(K_j), the recurrence of an RNN (§3.4, eqs. 10–12). As in the paper's
code (fast-transformers) φ acts on the projected q and k without a 1/√d, padded keys
are left out of both sums, and ε = 1e-6 is added to the denominator.

The reference forms the (Nq, Nk) matrix A = φ(Q) φ(K)ᵀ, masks it and normalises its rows:
those rows are the weights it mixes values with, returned for `need_weights`. The fast
path never forms it: without causality, the two sums once (O(N · d²)); with it, chunks of
queries, each adding its keys to a running (d, d) state after it has used the state of
the keys before it, with the causal part inside the chunk done densely (O(N · (C + d) · d)
time, O(N · d + C²) memory per chunk).

Decoding is the RNN of §3.4 (eqs. 18–20): the state is S = Σ φ(K_j) V_jᵀ and z = Σ φ(K_j)
over the tokens so far, (d, d) and (d,) per head whatever the length; a new token adds
its key to both, then reads them with its query.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import playground
from playground import AttentionOutput, AttentionVariant, Capabilities, VariantConfig
from playground.decoding import DecodingState, refuse_forward_arguments
from playground.heads import add_projections, project_heads, project_output, projection_flops
from playground.masks import allowed_keys, empty_query_rows, queries_without_keys

EPSILON = 1e-6
"""Added to every denominator φ(Q_i)ᵀ z (fast-transformers' eps)."""


@dataclass(frozen=True)
class LinearConfig(VariantConfig):
    bias: bool = True
    """Add a bias to the q/k/v/out projections."""
    chunk_size: int = 64
    """Queries per chunk of the causal fast path. Results do not depend on it."""

    def __post_init__(self) -> None:
        playground.require_positive(self, "chunk_size")


def feature_map(x: torch.Tensor) -> torch.Tensor:
    """φ(x) = elu(x) + 1 (§3.2.1): positive, so every similarity is."""
    return F.elu(x) + 1


class LinearAttention(AttentionVariant):
    name = "linear"
    summary = "Kernelised attention, φ = elu + 1: O(n) sums over keys; causal by prefix sums."
    paper = "Katharopoulos et al. 2020, Transformers are RNNs (Linear Attention), §3.2–3.4"
    Config = LinearConfig
    colour = "#aec7e8"  # light blue, in every figure
    capabilities = Capabilities(
        causal=True,
        padding_mask=True,
        cross_attention=True,
        need_weights=True,
        dtypes=(torch.float32, torch.float64, torch.bfloat16),
    )
    suite_options = {"chunk_size": 5}  # several chunks and a partial one
    # The reference forms the (Nq, Nk) matrix for its weights; flops() is the sums' cost.
    flops_counted_path = "fast"
    flops_uncounted = "the normaliser Σ φ(K_j), 2 per key and feature"

    @staticmethod
    def flops(n_q: int, n_k: int, d_model: int, num_heads: int, **options: object) -> float:
        head_dim = d_model // num_heads
        sums = 2 * n_k * d_model * (head_dim + 1)  # Σ φ(K_j) V_jᵀ and Σ φ(K_j), all heads
        reads = 2 * n_q * d_model * (head_dim + 1)  # φ(Q_i)ᵀ S and φ(Q_i)ᵀ z
        return projection_flops(n_q, n_k, d_model) + float(sums + reads)

    def __init__(self, d_model: int = 512, num_heads: int = 8, **options: object) -> None:
        super().__init__(d_model, num_heads, **options)
        add_projections(self, d_model, bias=self.config.bias)

    def _feature_maps(self, query, key, value, attention_mask):
        """φ(q) (B, H, Nq, d), φ(k) with padded keys zeroed, v (B, H, Nk, d)."""
        q, k, v = project_heads(self, query, key, value)
        phi_k = feature_map(k)
        if attention_mask is not None:
            phi_k = phi_k * attention_mask[:, None, :, None].to(phi_k.dtype)
        return feature_map(q), phi_k, v

    def forward_reference(
        self, query, key, value, attention_mask, is_causal, need_weights
    ) -> AttentionOutput:
        phi_q, phi_k, v = self._feature_maps(query, key, value, attention_mask)
        similarity = phi_q @ phi_k.transpose(-2, -1)  # A (B, H, Nq, Nk), padded keys 0
        allowed = allowed_keys(attention_mask, phi_q.shape[2], phi_k.shape[2], is_causal, v.device)
        if allowed is not None:
            similarity = similarity.masked_fill(~allowed, 0.0)
        weights = similarity / (similarity.sum(dim=-1, keepdim=True) + EPSILON)  # eq. 5's rows
        output = project_output(self, weights @ v, empty_query_rows(allowed))
        return AttentionOutput(output, weights if need_weights else None)

    # --- fast path ----------------------------------------------------------------------
    def forward_fast(
        self, query, key, value, attention_mask, is_causal, need_weights
    ) -> AttentionOutput:
        phi_q, phi_k, v = self._feature_maps(query, key, value, attention_mask)
        if is_causal:
            context = self._causal(phi_q, phi_k, v)
        else:
            state = phi_k.transpose(-2, -1) @ v  # Σ_j φ(K_j) V_jᵀ (B, H, d, d)
            normaliser = phi_k.sum(dim=2)  # Σ_j φ(K_j) (B, H, d)
            denominator = (phi_q @ normaliser[..., None]) + EPSILON  # (B, H, Nq, 1)
            context = (phi_q @ state) / denominator
        empty = queries_without_keys(attention_mask, phi_q.shape[2], phi_k.shape[2], is_causal)
        return AttentionOutput(project_output(self, context, empty), None)

    def _causal(self, phi_q, phi_k, v) -> torch.Tensor:
        """Chunks of queries over the running sums of the keys before them (§3.4)."""
        batch, heads, n_q, d = phi_q.shape
        n_k, chunk = phi_k.shape[2], self.config.chunk_size
        state = phi_q.new_zeros(batch, heads, d, v.shape[-1])  # S of the keys so far
        normaliser = phi_q.new_zeros(batch, heads, d)  # z of the keys so far
        contexts = []
        for start in range(0, n_q, chunk):
            stop = min(start + chunk, n_q)
            q_chunk = phi_q[:, :, start:stop]  # (B, H, C, d)
            numerator = q_chunk @ state
            denominator = q_chunk @ normaliser[..., None]  # (B, H, C, 1)
            if start < n_k:  # this chunk's own keys, j <= i within it
                k_chunk, v_chunk = phi_k[:, :, start : min(stop, n_k)], v[:, :, start:stop]
                within = (q_chunk @ k_chunk.transpose(-2, -1)).tril()  # (B, H, C, C')
                numerator = numerator + within @ v_chunk
                denominator = denominator + within.sum(dim=-1, keepdim=True)
                state = state + k_chunk.transpose(-2, -1) @ v_chunk
                normaliser = normaliser + k_chunk.sum(dim=2)
            contexts.append(numerator / (denominator + EPSILON))
        return torch.cat(contexts, dim=2)  # (B, H, Nq, d)

    # --- decoding: the recurrent state of §3.4 ------------------------------------------
    def prefill_state(self, prompt, attention_mask, max_length, **extra):
        refuse_forward_arguments(self.name, extra)  # its state keeps none
        output = self(prompt, attention_mask=attention_mask, is_causal=True).output
        _, phi_k, v = self._feature_maps(prompt, prompt, prompt, attention_mask)
        state = LinearState(phi_k.transpose(-2, -1) @ v, phi_k.sum(dim=2))  # padding left out
        return output, state

    def step_state(self, token, state):
        phi_q, phi_k, v = self._feature_maps(token, token, token, None)  # (B, H, 1, d)
        state.kv += phi_k.transpose(-2, -1) @ v  # S_i = S_(i−1) + φ(K_i) V_iᵀ   (eq. 18)
        state.normaliser += phi_k[:, :, 0]  # z_i = z_(i−1) + φ(K_i)               (eq. 19)
        numerator = phi_q @ state.kv  # (B, H, 1, dv)
        denominator = phi_q @ state.normaliser[..., None] + EPSILON  # (B, H, 1, 1)   (eq. 20)
        return project_output(self, numerator / denominator, None)


class LinearState(DecodingState):
    """S = Σ φ(K_j) V_jᵀ (B, H, d, dv) and z = Σ φ(K_j) (B, H, d): a fixed size."""

    def __init__(self, kv: torch.Tensor, normaliser: torch.Tensor) -> None:
        super().__init__()
        self.kv = kv
        self.normaliser = normaliser


@playground.hookimpl
def register_attention(register):
    register(LinearAttention)
