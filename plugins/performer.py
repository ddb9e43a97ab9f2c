"""Performer (FAVOR+): Choromanski et al. 2021, "Rethinking Attention with Performers",
§3.

The softmax kernel exp(qᵀk) is estimated by positive random features, so that attention
is computed without the (Nq, Nk) matrix:

    φ(x) = m^(−1/2) · exp(Wx − ‖x‖²/2)       W (m, d): orthogonal random rows    (§3.2, eq. 7)
    exp(qᵀk) = E[φ(q)ᵀφ(k)]                 for rows w ~ N(0, I_d)               (lemma 1)
    Attention(Q, K, V) ≈ D⁻¹ φ(Q) (φ(K)ᵀ V),  D = diag(φ(Q) φ(K)ᵀ 1)            (§2.2, eq. 4)

with q and k scaled by d^(−1/4) each (so qᵀk is divided by √d). The rows of W are
orthogonal within blocks of d (Gram–Schmidt, §3.1, "ORFs"), each scaled to the norm of a
Gaussian vector. As in `performer_pytorch` (whose `FastAttention` is the oracle given the
same W), each feature subtracts a stabiliser before exp and adds ε = 1e-4 after it: the
query's own maximum, and for keys the maximum over the sequence's real keys (padding is
left out of it and of the sums, so that padding cannot change a real output). The ε is a
bias, not only a guard: where one key's features dwarf the others', the rest fall below ε
after the shared stabiliser and the weights drift toward uniform, which more features do
not cure (the attention-patterns figure, on its sharply local inputs, shows this).

W is drawn once, from `feature_seed`, and kept as the buffer `projection_matrix` (so two modules
with the same seed agree, and parity tests can copy it). `redraw_features=True` draws a
new W from torch's random generator at every training call, as the paper does between
steps; eval always uses the kept one. Not causal: that needs prefix sums whose stabiliser
sees the future here.

The reference forms the implied (Nq, Nk) weights D⁻¹ φ(Q) φ(K)ᵀ, returned for
`need_weights` (non-negative rows summing to 1, but not softmax's); the fast path takes
φ(K)ᵀ V first, O(N · m · d).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

import playground
from playground import AttentionOutput, AttentionVariant, Capabilities, VariantConfig
from playground.heads import add_projections, project_heads, project_output, projection_flops
from playground.masks import queries_without_keys

EPSILON = 1e-4
"""Added to every feature after the stabilised exp (performer_pytorch's softmax_kernel)."""


@dataclass(frozen=True)
class PerformerConfig(VariantConfig):
    nb_features: int = 0
    """m, the random features per head; 0 = ⌊d · ln d⌋ (performer_pytorch's default)."""
    redraw_features: bool = False
    """Draw a new projection at every training call (torch's random generator)."""
    feature_seed: int = 0
    """Seed of the projection kept for eval (and for training unless redrawn)."""
    bias: bool = True
    """Add a bias to the q/k/v/out projections."""

    def __post_init__(self) -> None:
        if self.nb_features < 0:
            raise ValueError(f"nb_features must be >= 0 (0 = d · ln d); got {self.nb_features}")


def orthogonal_features(m: int, d: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """(m, d): blocks of d orthonormal rows (QR of a Gaussian matrix), the last block
    partial, each row then scaled to the norm of a fresh Gaussian vector (§3.1)."""
    blocks = []
    for _ in range(-(-m // d)):
        gaussian = torch.randn(d, d, generator=generator)
        q, _ = torch.linalg.qr(gaussian)
        blocks.append(q.T)
    rows = torch.cat(blocks)[:m]
    norms = torch.randn(m, d, generator=generator).norm(dim=1)
    return norms[:, None] * rows


def favor_features(
    x: torch.Tensor, projection: torch.Tensor, is_query: bool, keep: torch.Tensor | None = None
) -> torch.Tensor:
    """φ(x) (B, H, N, m) of x (B, H, N, d): eq. 7 with performer_pytorch's stabiliser and ε.
    `keep` (B, N) bool marks the real keys: the stabiliser is their maximum, and padded
    keys' features are 0."""
    scale = x.shape[-1] ** -0.25
    logits = (scale * x) @ projection.T.to(x.dtype)  # W x (B, H, N, m)
    square = (x * x).sum(dim=-1, keepdim=True) * scale**2 / 2  # ‖x‖² / 2
    if is_query:
        stabiliser = logits.amax(dim=-1, keepdim=True)
    else:
        real = logits if keep is None else logits.masked_fill(~keep[:, None, :, None], -math.inf)
        stabiliser = real.amax(dim=(-2, -1), keepdim=True).nan_to_num(0.0, neginf=0.0)
    shift = square + stabiliser.detach()  # (B, H, N, 1) or (B, H, 1, 1): one pass below
    normalizer = projection.shape[0] ** -0.5
    if torch.is_grad_enabled() and logits.requires_grad:
        features = (torch.exp(logits - shift) + EPSILON) * normalizer
    else:  # nothing to differentiate: the (B, H, N, m) tensor is rewritten in place
        features = logits.sub_(shift).exp_().add_(EPSILON).mul_(normalizer)
    if keep is not None:
        features = features.masked_fill(~keep[:, None, :, None], 0.0)  # NaN padding too
    return features


class PerformerAttention(AttentionVariant):
    name = "performer"
    summary = "Softmax kernel estimated by positive orthogonal random features (FAVOR+)."
    paper = "Choromanski et al. 2021, Rethinking Attention with Performers, §3"
    Config = PerformerConfig
    colour = "#7f7f7f"  # grey, in every figure
    capabilities = Capabilities(
        padding_mask=True,
        cross_attention=True,
        need_weights=True,
        dtypes=(torch.float32, torch.float64),
    )
    suite_options = {"nb_features": 12}

    @staticmethod
    def flops(n_q: int, n_k: int, d_model: int, num_heads: int, **options: object) -> float:
        head_dim = d_model // num_heads
        m = int(options.get("nb_features", 0)) or int(head_dim * math.log(head_dim))
        features = 2 * (n_q + n_k) * m * d_model  # W x for queries and keys, all heads
        mixing = 2 * n_k * m * d_model + 2 * n_q * m * d_model + 2 * (n_q + n_k) * m * num_heads
        return projection_flops(n_q, n_k, d_model) + float(features + mixing)

    def __init__(self, d_model: int = 512, num_heads: int = 8, **options: object) -> None:
        super().__init__(d_model, num_heads, **options)
        add_projections(self, d_model, bias=self.config.bias)
        d = self.head_dim
        self.nb_features = self.config.nb_features or int(d * math.log(d)) or 1
        generator = torch.Generator().manual_seed(self.config.feature_seed)
        self.register_buffer(
            "projection_matrix", orthogonal_features(self.nb_features, d, generator)
        )
        if self.config.redraw_features:
            self.capabilities = dataclasses.replace(
                self.capabilities, deterministic_in_training=False
            )

    def _feature_maps(self, query, key, value, attention_mask):
        q, k, v = project_heads(self, query, key, value)
        projection = self.projection_matrix
        if self.training and self.config.redraw_features:
            projection = orthogonal_features(self.nb_features, self.head_dim).to(projection)
        phi_q = favor_features(q, projection, is_query=True)
        phi_k = favor_features(k, projection, is_query=False, keep=attention_mask)
        return phi_q, phi_k, v

    def forward_reference(
        self, query, key, value, attention_mask, is_causal, need_weights
    ) -> AttentionOutput:
        phi_q, phi_k, v = self._feature_maps(query, key, value, attention_mask)
        kernel = phi_q @ phi_k.transpose(-2, -1)  # φ(Q) φ(K)ᵀ (B, H, Nq, Nk)
        weights = kernel / _nonzero(kernel.sum(dim=-1, keepdim=True))  # D⁻¹ φ(Q) φ(K)ᵀ
        empty = queries_without_keys(attention_mask, phi_q.shape[2], phi_k.shape[2], False)
        output = project_output(self, weights @ v, empty)
        return AttentionOutput(output, weights if need_weights else None)

    # --- fast path ----------------------------------------------------------------------
    def forward_fast(
        self, query, key, value, attention_mask, is_causal, need_weights
    ) -> AttentionOutput:
        phi_q, phi_k, v = self._feature_maps(query, key, value, attention_mask)
        context = phi_q @ (phi_k.transpose(-2, -1) @ v)  # φ(Q) (φ(K)ᵀ V)
        normaliser = phi_q @ phi_k.sum(dim=2)[..., None]  # φ(Q) φ(K)ᵀ 1 (B, H, Nq, 1)
        empty = queries_without_keys(attention_mask, phi_q.shape[2], phi_k.shape[2], False)
        return AttentionOutput(project_output(self, context / _nonzero(normaliser), empty), None)


def _nonzero(normaliser: torch.Tensor) -> torch.Tensor:
    """D with its zeros (queries with no real key; every feature is positive otherwise)
    set to 1, so those rows are 0 rather than NaN, in value and in gradient."""
    return normaliser.masked_fill(normaliser == 0, 1.0)


@playground.hookimpl
def register_attention(register):
    register(PerformerAttention)
