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
steps; eval always uses the kept one.

The reference forms the implied (Nq, Nk) weights D⁻¹ φ(Q) φ(K)ᵀ, returned for
`need_weights` (non-negative rows summing to 1, but not softmax's); the fast path takes
φ(K)ᵀ V first, O(N · m · d).

Causal attention (is_causal=True; the paper's unidirectional case, by prefix sums).
performer_pytorch's causal path keeps the key stabiliser above, a maximum over every key,
so a later key changes earlier outputs (through ε, which that maximum scales). Here query
i stabilises the keys it sees, j ≤ i, by their maximum M_i = max_{j≤i} s_j, with
s_j = max_r (W k_j)_r each key's own peak: the non-causal rule applied to the sequence cut
after i, so output i is the non-causal output of x_{≤i} at i (performer_pytorch's
FastAttention on that prefix is the oracle), and every exponent stays ≤ 0. Key j, as
query i sees it, is

    φ_i(k_j) = e^(s_j − M_i) u_j + ε′,  u_j = m^(−1/2) exp(W k_j − ‖k_j‖²/2 − s_j),  ε′ = m^(−1/2) ε

(both factors ≤ 1). A stabiliser of 0 for keys would also be causal and finite, since
w·x − ‖x‖²/2 ≤ ‖w‖²/2, but it makes ε absolute instead of relative to the largest feature:
for keys of large norm every feature then falls below ε and the weights turn uniform, a
bias the non-causal path does not have. The reference forms the masked (Nq, Nk) matrix
φ(Q) φ_i(K)ᵀ. The fast path takes chunks of queries over running sums of the keys before
them, Σ φ(k_j) v_jᵀ and Σ φ(k_j) with φ at the running maximum M (`PerformerState`: when M
grows to M′ the kept features become e^(M − M′) φ + ε′ (1 − e^(M − M′)), so Σ v_j and the
count of keys are kept too), and the chunk's own keys dense: O(N · (C + m) · d) time.

Decoding keeps those sums, one key at a time: kv = Σ φ(k_j) v_jᵀ (B, H, m, dv) and
normaliser = Σ φ(k_j) (B, H, m) over the real keys so far, with their running maximum
(B, H), Σ v_j and the count; O(m · d) per head, whatever the length. It is exact in eval
mode, and in training without redrawn features. With `redraw_features=True` every training
call draws its own W, so the steps of one decode could not share features: prefill and
decode_step then refuse (UnsupportedFeature) and ask for eval mode.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch

import playground
from playground import (
    AttentionOutput,
    AttentionVariant,
    Capabilities,
    UnsupportedFeature,
    VariantConfig,
)
from playground.decoding import DecodingState, real_tokens, refuse_forward_arguments
from playground.heads import add_projections, project_heads, project_output, projection_flops
from playground.masks import causal_mask, queries_without_keys

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
    chunk_size: int = 64
    """Queries per chunk of the causal fast path. Results do not depend on it."""

    def __post_init__(self) -> None:
        if self.nb_features < 0:
            raise ValueError(f"nb_features must be >= 0 (0 = d · ln d); got {self.nb_features}")
        playground.require_positive(self, "chunk_size")


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


def causal_key_features(
    k: torch.Tensor, projection: torch.Tensor, keep: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The parts of causal key features (module docstring) of k (B, H, N, d): u (B, H, N, m),
    each key stabilised by its own peak, and the peaks s (B, H, N), detached as every
    stabiliser is. Padded keys (`keep` (B, N) False) get u = 0 and s = −inf."""
    scale = k.shape[-1] ** -0.25
    logits = (scale * k) @ projection.T.to(k.dtype)  # W k (B, H, N, m)
    square = (k * k).sum(dim=-1, keepdim=True) * scale**2 / 2  # ‖k‖² / 2
    peak = logits.detach().amax(dim=-1, keepdim=True)  # s_j (B, H, N, 1)
    u = torch.exp(logits - square - peak) * projection.shape[0] ** -0.5
    peak = peak[..., 0]
    if keep is not None:
        u = u.masked_fill(~keep[:, None, :, None], 0.0)
        peak = peak.masked_fill(~keep[:, None, :], -math.inf)
    return u, peak


def causal_kernel(
    phi_q: torch.Tensor,
    u: torch.Tensor,
    peak: torch.Tensor,
    attention_mask: torch.Tensor | None,
    reach: torch.Tensor,
) -> torch.Tensor:
    """φ(Q) φ_i(K)ᵀ (B, H, Nq, Nk): query i against key j as it sees it, e^(s_j − M_i) u_j + ε′,
    for the real keys j ≤ i, and 0 for the others; reach (B, H, Nq) holds M_i."""
    allowed = causal_mask(phi_q.shape[2], u.shape[2], u.device)  # (Nq, Nk)
    if attention_mask is not None:
        allowed = allowed & attention_mask[:, None, None, :]  # (B, 1, Nq, Nk)
    # e^(s_j − M_i) ≤ 1 for the keys query i sees; for the others the gap is clamped to 0
    # (and M_i = −inf, no key yet, counted as 0) so that every factor is finite before the
    # mask zeroes it. Padded keys have s_j = −inf: a factor of 0.
    reach = reach.masked_fill(torch.isneginf(reach), 0.0)
    growth = (peak[:, :, None, :] - reach[..., None]).clamp_(max=0.0).exp_()
    epsilon = _epsilon(u) * phi_q.sum(dim=-1, keepdim=True)  # ε′ φ(q_i)·1 (B, H, Nq, 1)
    return ((phi_q @ u.transpose(-2, -1)) * growth).add_(epsilon).mul_(allowed.to(u.dtype))


def running_peak(peak: torch.Tensor, n_q: int) -> torch.Tensor:
    """M_i (B, H, Nq): the largest peak s_j of the keys j ≤ i (the last key for queries past
    it), −inf while there is none."""
    visible = torch.arange(n_q, device=peak.device).clamp(max=peak.shape[2] - 1)
    return peak.cummax(dim=-1).values[..., visible]


def restabilised(older: torch.Tensor, newer: torch.Tensor) -> torch.Tensor:
    """e^(older − newer) ≤ 1: what features stabilised by `older` are multiplied by when the
    stabiliser grows to `newer`; 0 where `older` is −inf (no key was kept at it)."""
    return torch.exp(older - newer).nan_to_num(nan=0.0)


class PerformerAttention(AttentionVariant):
    name = "performer"
    summary = "Softmax kernel estimated by positive orthogonal random features (FAVOR+)."
    paper = "Choromanski et al. 2021, Rethinking Attention with Performers, §3"
    Config = PerformerConfig
    colour = "#7f7f7f"  # grey, in every figure
    capabilities = Capabilities(
        causal=True,
        padding_mask=True,
        cross_attention=True,
        need_weights=True,
        dtypes=(torch.float32, torch.float64),
    )
    suite_options = {"nb_features": 12, "chunk_size": 12}  # several chunks, a partial one
    # The reference forms the implied (Nq, Nk) weights; flops() is φ(Q) (φ(K)ᵀ V)'s cost.
    flops_counted_path = "fast"
    flops_uncounted = "the normaliser Σ φ(K_j), 2 per key and feature"

    @staticmethod
    def flops(n_q: int, n_k: int, d_model: int, num_heads: int, **options: Any) -> float:
        head_dim = d_model // num_heads
        m = int(options.get("nb_features", 0)) or int(head_dim * math.log(head_dim))
        features = 2 * (n_q + n_k) * m * d_model  # W x for queries and keys, all heads
        mixing = 2 * n_k * m * d_model + 2 * n_q * m * d_model + 2 * (n_q + n_k) * m * num_heads
        return projection_flops(n_q, n_k, d_model) + float(features + mixing)

    @classmethod
    def capabilities_for(cls, config: VariantConfig) -> Capabilities:
        """Redrawing the features in training makes two training calls differ."""
        assert isinstance(config, PerformerConfig), "built from its own Config"
        if config.redraw_features:
            return dataclasses.replace(cls.capabilities, deterministic_in_training=False)
        return cls.capabilities

    projection_matrix: torch.Tensor  # W (m, d): a buffer, registered in __init__

    def __init__(self, d_model: int = 512, num_heads: int = 8, **options: object) -> None:
        super().__init__(d_model, num_heads, **options)
        add_projections(self, d_model, bias=self.config.bias)
        d = self.head_dim
        self.nb_features = self.config.nb_features or int(d * math.log(d)) or 1
        generator = torch.Generator().manual_seed(self.config.feature_seed)
        self.register_buffer(
            "projection_matrix", orthogonal_features(self.nb_features, d, generator)
        )

    def _projected(self, query, key, value):
        """φ(q) (B, H, Nq, m), k and v (B, H, Nk, d), and this call's W (m, d): a new draw
        in training with redraw_features, the kept one otherwise."""
        q, k, v = project_heads(self, query, key, value)
        projection = self.projection_matrix
        if self.training and self.config.redraw_features:
            projection = orthogonal_features(self.nb_features, self.head_dim).to(projection)
        return favor_features(q, projection, is_query=True), k, v, projection

    def forward_reference(
        self, query, key, value, attention_mask, is_causal, need_weights
    ) -> AttentionOutput:
        phi_q, k, v, projection = self._projected(query, key, value)
        if is_causal:
            u, peak = causal_key_features(k, projection, attention_mask)
            reach = running_peak(peak, phi_q.shape[2])  # M_i (B, H, Nq)
            kernel = causal_kernel(phi_q, u, peak, attention_mask, reach)  # (B, H, Nq, Nk)
        else:
            phi_k = favor_features(k, projection, is_query=False, keep=attention_mask)
            kernel = phi_q @ phi_k.transpose(-2, -1)  # φ(Q) φ(K)ᵀ (B, H, Nq, Nk)
        weights = kernel / _nonzero(kernel.sum(dim=-1, keepdim=True))  # D⁻¹ φ(Q) φ(K)ᵀ
        empty = queries_without_keys(attention_mask, phi_q.shape[2], k.shape[2], is_causal)
        output = project_output(self, weights @ v, empty)
        return AttentionOutput(output, weights if need_weights else None)

    # --- fast path ----------------------------------------------------------------------
    def forward_fast(
        self, query, key, value, attention_mask, is_causal, need_weights
    ) -> AttentionOutput:
        phi_q, k, v, projection = self._projected(query, key, value)
        if is_causal:
            u, peak = causal_key_features(k, projection, attention_mask)
            context = self._causal(phi_q, u, peak, v, attention_mask)
        else:
            phi_k = favor_features(k, projection, is_query=False, keep=attention_mask)
            numerator = phi_q @ (phi_k.transpose(-2, -1) @ v)  # φ(Q) (φ(K)ᵀ V)
            normaliser = phi_q @ phi_k.sum(dim=2)[..., None]  # φ(Q) φ(K)ᵀ 1 (B, H, Nq, 1)
            context = numerator / _nonzero(normaliser)
        empty = queries_without_keys(attention_mask, phi_q.shape[2], k.shape[2], is_causal)
        return AttentionOutput(project_output(self, context, empty), None)

    def _causal(self, phi_q, u, peak, v, attention_mask) -> torch.Tensor:
        """Chunks of queries over the running sums of the keys before them (a
        `PerformerState`, as decoding keeps) -> context (B, H, Nq, dv); the chunk's own keys
        dense."""
        n_q, n_k, chunk = phi_q.shape[2], u.shape[2], self.config.chunk_size
        real = real_tokens(u[:, 0], attention_mask)  # (B, Nk)
        reach = running_peak(peak, n_q)  # M_i (B, H, Nq)
        sums = PerformerState.empty(u, v)
        contexts = []
        for start in range(0, n_q, chunk):
            stop = min(start + chunk, n_q)
            q_chunk, chunk_reach = phi_q[:, :, start:stop], reach[:, :, start:stop]
            numerator, denominator = sums.read(q_chunk, chunk_reach)  # the keys before
            if start < n_k:  # this chunk's own keys, j <= i within it
                keys = slice(start, min(stop, n_k))
                u_chunk, peak_chunk, v_chunk = u[:, :, keys], peak[:, :, keys], v[:, :, keys]
                within = causal_kernel(q_chunk, u_chunk, peak_chunk, real[:, keys], chunk_reach)
                numerator = numerator + within @ v_chunk  # (B, H, C, dv)
                denominator = denominator + within.sum(dim=-1, keepdim=True)  # (B, H, C, 1)
                sums.add(u_chunk, peak_chunk, v_chunk, real[:, keys])
            contexts.append(numerator / _nonzero(denominator))
        return torch.cat(contexts, dim=2)

    # --- decoding: the fast path's running sums, one key at a time -------------------------
    def prefill_state(self, prompt, attention_mask, max_length, **extra):
        refuse_forward_arguments(self.name, extra)  # its state keeps none
        self._refuse_redrawn_features()
        output = self(prompt, attention_mask=attention_mask, is_causal=True).output
        _, k, v = project_heads(self, prompt, prompt, prompt)  # (B, H, P, d)
        u, peak = causal_key_features(k, self.projection_matrix, attention_mask)
        state = PerformerState.empty(u, v)
        if prompt.shape[1]:
            state.add(u, peak, v, real_tokens(prompt, attention_mask))
        return output, state

    def step_state(self, token, state):
        self._refuse_redrawn_features()
        q, k, v = project_heads(self, token, token, token)  # (B, H, 1, d)
        u, peak = causal_key_features(k, self.projection_matrix, None)
        state.add(u, peak, v, real_tokens(token, None))
        phi_q = favor_features(q, self.projection_matrix, is_query=True)  # (B, H, 1, m)
        numerator, denominator = state.read(phi_q, state.running[..., None])
        return project_output(self, numerator / denominator, None)

    def _refuse_redrawn_features(self) -> None:
        if self.training and self.config.redraw_features:
            raise UnsupportedFeature(
                self.name,
                "decoding in training mode with redraw_features=True",
                "every training call draws new features, so the steps of one decode would "
                "not share them; decode in eval mode (`module.eval()`), which uses the kept "
                "features, or build it with redraw_features=False",
            )


class PerformerState(DecodingState):
    """kv = Σ φ(k_j) v_jᵀ (B, H, m, dv) and normaliser = Σ φ(k_j) (B, H, m) over the real keys
    so far, their features at `running` (B, H), the largest peak among them (−inf before
    the first); value_sum = Σ v_j (B, H, dv) and count (B,) int64 restabilise them when it
    grows. A fixed size. The causal fast path keeps one per call, over chunks of keys."""

    def __init__(
        self,
        kv: torch.Tensor,
        normaliser: torch.Tensor,
        value_sum: torch.Tensor,
        count: torch.Tensor,
        running: torch.Tensor,
    ) -> None:
        super().__init__()
        self.kv = kv
        self.normaliser = normaliser
        self.value_sum = value_sum
        self.count = count
        self.running = running

    @classmethod
    def empty(cls, u: torch.Tensor, v: torch.Tensor) -> PerformerState:
        """No key yet, for keys like u (B, H, ·, m) and values like v (B, H, ·, dv)."""
        batch, heads, m, dv = *u.shape[:2], u.shape[3], v.shape[3]
        return cls(
            kv=v.new_zeros(batch, heads, m, dv),
            normaliser=v.new_zeros(batch, heads, m),
            value_sum=v.new_zeros(batch, heads, dv),
            count=torch.zeros(batch, dtype=torch.long, device=v.device),
            running=v.new_full((batch, heads), -math.inf),
        )

    def add(self, u: torch.Tensor, peak: torch.Tensor, v: torch.Tensor, real: torch.Tensor) -> None:
        """Take n more keys (u (B, H, n, m), their peaks (B, H, n), v (B, H, n, dv), real
        (B, n) bool): the kept features restabilised to the new running maximum M′,
        e^(M − M′) φ + ε′ (1 − e^(M − M′)), then the new keys' features at M′ added."""
        running = torch.maximum(self.running, peak.amax(dim=-1))  # M′ (B, H)
        rescale = restabilised(self.running, running)[..., None]  # (B, H, 1)
        epsilon = _epsilon(u) * (1 - rescale)  # (B, H, 1)
        weight = real[:, None, :, None].to(v.dtype)  # (B, 1, n, 1)
        features = u * restabilised(peak, running[..., None])[..., None] + _epsilon(u) * weight
        self.kv = (
            self.kv * rescale[..., None]
            + epsilon[..., None] * self.value_sum[:, :, None]
            + features.transpose(-2, -1) @ v
        )
        count = self.count.to(v.dtype)[:, None, None]  # (B, 1, 1)
        self.normaliser = self.normaliser * rescale + epsilon * count + features.sum(dim=2)
        self.value_sum = self.value_sum + (v * weight).sum(dim=2)
        self.count = self.count + real.sum(dim=1)
        self.running = running

    def read(self, phi_q: torch.Tensor, reach: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """φ(q_i)ᵀ kv (B, H, n, dv) and φ(q_i)ᵀ normaliser (B, H, n, 1) for queries phi_q
        (B, H, n, m) that stabilise keys by reach (B, H, n) >= `running`."""
        rescale = restabilised(self.running[..., None], reach)[..., None]  # (B, H, n, 1)
        epsilon = _epsilon(phi_q) * phi_q.sum(dim=-1, keepdim=True) * (1 - rescale)
        count = self.count.to(phi_q.dtype)[:, None, None, None]  # (B, 1, 1, 1)
        numerator = (phi_q @ self.kv) * rescale + epsilon * self.value_sum[:, :, None]
        denominator = (phi_q @ self.normaliser[..., None]) * rescale + epsilon * count
        return numerator, denominator


def _epsilon(u: torch.Tensor) -> float:
    """ε′ = m^(−1/2) ε of features u (…, m)."""
    return EPSILON * u.shape[-1] ** -0.5


def _nonzero(normaliser: torch.Tensor) -> torch.Tensor:
    """D with its zeros (queries with no real key; every feature is positive otherwise)
    set to 1, so those rows are 0 rather than NaN, in value and in gradient."""
    return normaliser.masked_fill(normaliser == 0, 1.0)


@playground.hookimpl
def register_attention(register):
    register(PerformerAttention)
