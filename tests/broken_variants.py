"""Deliberately broken variants: each breaks one promise, and the contract suite must
catch it with the right check (tests/testing/test_contract_suite.py). They derive from vanilla
so everything they do not break stays correct."""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

import playground
from playground import AttentionOutput
from playground.decoding import TokenCache
from playground.heads import project_heads, project_output, projection_flops
from playground.masks import allowed_keys, empty_query_rows

Vanilla = playground.get_variant("vanilla")


class LeaksFuture(Vanilla):
    """Ignores is_causal: every query sees every key."""

    name = "broken_leaks_future"

    def forward_reference(self, query, key, value, attention_mask, is_causal, need_weights):
        return super().forward_reference(query, key, value, attention_mask, False, need_weights)

    def forward_fast(self, query, key, value, attention_mask, is_causal, need_weights):
        return super().forward_fast(query, key, value, attention_mask, False, need_weights)


class IgnoresPadding(Vanilla):
    """Drops the padding mask."""

    name = "broken_ignores_padding"

    def forward_reference(self, query, key, value, attention_mask, is_causal, need_weights):
        return super().forward_reference(query, key, value, None, is_causal, need_weights)

    def forward_fast(self, query, key, value, attention_mask, is_causal, need_weights):
        return super().forward_fast(query, key, value, None, is_causal, need_weights)


class IgnoresPaddingInCrossAttention(Vanilla):
    """Drops the key padding mask when the keys are another sequence than the queries:
    self-attention is right, cross attention attends to padded keys."""

    name = "broken_ignores_padding_in_cross_attention"

    def forward_reference(self, query, key, value, attention_mask, is_causal, need_weights):
        mask = attention_mask if key is query else None
        return super().forward_reference(query, key, value, mask, is_causal, need_weights)

    def forward_fast(self, query, key, value, attention_mask, is_causal, need_weights):
        mask = attention_mask if key is query else None
        return super().forward_fast(query, key, value, mask, is_causal, need_weights)


class NaNOnFullyMaskedRow(Vanilla):
    """The textbook -inf mask and plain softmax: a query with no key left gets NaN."""

    name = "broken_nan_on_fully_masked_row"
    forward_fast = None

    def forward_reference(self, query, key, value, attention_mask, is_causal, need_weights):
        q, k, v = project_heads(self, query, key, value)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if attention_mask is not None:
            scores = scores.masked_fill(~attention_mask[:, None, None, :], float("-inf"))
        if is_causal:
            scores = scores.masked_fill(
                ~torch.ones_like(scores, dtype=torch.bool).tril(), float("-inf")
            )
        weights = scores.softmax(dim=-1)
        return AttentionOutput(
            project_output(self, weights @ v, None), weights if need_weights else None
        )


class FastDisagrees(Vanilla):
    """The fast path scales the scores by 1.01/√d instead of 1/√d."""

    name = "broken_fast_disagrees"

    def forward_fast(self, query, key, value, attention_mask, is_causal, need_weights):
        return super().forward_fast(
            query * 1.01, key, value, attention_mask, is_causal, need_weights
        )


class CouplesBatch(Vanilla):
    """Adds the batch mean to every element (a broken normalisation would do this)."""

    name = "broken_couples_batch"

    def forward(self, *args, **kwargs):
        output, weights = super().forward(*args, **kwargs)
        return AttentionOutput(output + output.mean(dim=0, keepdim=True), weights)


class WeightsDoNotSumToOne(Vanilla):
    name = "broken_weights_sum"

    def forward_reference(self, query, key, value, attention_mask, is_causal, need_weights):
        output, weights = super().forward_reference(
            query, key, value, attention_mask, is_causal, need_weights
        )
        return AttentionOutput(output, None if weights is None else 0.9 * weights)

    forward_fast = None


class DeadParameter(Vanilla):
    """Has a parameter that never takes part in the forward pass."""

    name = "broken_dead_parameter"

    def __init__(self, d_model=512, num_heads=8, **options):
        super().__init__(d_model, num_heads, **options)
        self.unused = nn.Parameter(torch.zeros(d_model))


class DropoutInEval(Vanilla):
    """Applies dropout whatever the mode."""

    name = "broken_dropout_in_eval"
    forward_fast = None

    def forward_reference(self, query, key, value, attention_mask, is_causal, need_weights):
        output, weights = super().forward_reference(
            query, key, value, attention_mask, is_causal, need_weights
        )
        return AttentionOutput(F.dropout(output, self.config.dropout, training=True), weights)


class Float64Broken(Vanilla):
    """Declares float64 but computes (and returns) float32."""

    name = "broken_float64"

    def forward(self, query, *args, **kwargs):
        output, weights = super().forward(query, *args, **kwargs)
        return AttentionOutput(output.float(), weights)


class OverflowsOnLargeInputs(Vanilla):
    """exp(s) / Σ exp(s) without subtracting the row maximum."""

    name = "broken_overflows"
    forward_fast = None

    def forward_reference(self, query, key, value, attention_mask, is_causal, need_weights):
        q, k, v = project_heads(self, query, key, value)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        allowed = torch.ones_like(scores, dtype=torch.bool)
        if attention_mask is not None:
            allowed = allowed & attention_mask[:, None, None, :]
        if is_causal:
            allowed = allowed & allowed.new_ones(scores.shape[-2:]).tril()
        exp = scores.exp() * allowed
        weights = exp / exp.sum(dim=-1, keepdim=True).clamp_min(1e-30)
        output = project_output(self, weights @ v, empty_query_rows(allowed[:, :1]))
        return AttentionOutput(output, weights if need_weights else None)


class BypassesCapabilities(Vanilla):
    """Declares no causal support but overrides forward, skipping the core's checks, and
    silently runs non-causal attention."""

    name = "broken_bypasses_capabilities"
    capabilities = dataclasses.replace(Vanilla.capabilities, causal=False)

    def forward(
        self,
        query,
        key=None,
        value=None,
        *,
        attention_mask=None,
        is_causal=False,
        need_weights=False,
    ):
        key = query if key is None else key
        value = key if value is None else value
        return self.forward_reference(query, key, value, attention_mask, False, need_weights)


class IgnoresKeys(Vanilla):
    """Cross-attention that attends over the query instead of the given key/value."""

    name = "broken_ignores_keys"

    def forward_reference(self, query, key, value, attention_mask, is_causal, need_weights):
        mask = attention_mask if key.shape[1] == query.shape[1] else None
        return super().forward_reference(query, query, query, mask, is_causal, need_weights)

    forward_fast = None


class WrongShape(Vanilla):
    """Drops the last query position."""

    name = "broken_wrong_shape"

    def forward(self, *args, **kwargs):
        output, weights = super().forward(*args, **kwargs)
        return AttentionOutput(output[:, :-1], weights)


class SelfAttentionOnly(Vanilla):
    """Not broken: declares less than it could (no causal, no cross-attention)."""

    name = "self_attention_only"
    capabilities = dataclasses.replace(Vanilla.capabilities, causal=False, cross_attention=False)


class FastLosesBiasGradient(Vanilla):
    """Same outputs and input gradients, but the fast path cuts out_proj.bias's gradient."""

    name = "broken_fast_loses_bias_gradient"

    def forward_fast(self, query, key, value, attention_mask, is_causal, need_weights):
        output, weights = super().forward_fast(
            query, key, value, attention_mask, is_causal, need_weights
        )
        bias = self.out_proj.bias
        return AttentionOutput(output - bias + bias.detach(), weights)


# --- corners: bugs that only show at some lengths, modes, batch positions or gradients ---
LEAK_ABOVE = 16


def _leak_future(output: torch.Tensor, value: torch.Tensor, start: int = 0) -> torch.Tensor:
    """Adds each next token's value to the output from position `start` on: a future leak."""
    leaked = output.clone()
    leaked[:, start:-1] = leaked[:, start:-1] + value[:, start + 1 :]
    return leaked


class LeaksAboveLength(Vanilla):
    """Honours is_causal only up to 16 keys (a cached mask that stops growing, say)."""

    name = "broken_leaks_above_length"

    def forward_reference(self, query, key, value, attention_mask, is_causal, need_weights):
        causal = is_causal and key.shape[1] <= LEAK_ABOVE
        return super().forward_reference(query, key, value, attention_mask, causal, need_weights)

    def forward_fast(self, query, key, value, attention_mask, is_causal, need_weights):
        causal = is_causal and key.shape[1] <= LEAK_ABOVE
        return super().forward_fast(query, key, value, attention_mask, causal, need_weights)


class FastLeaksAboveLength(Vanilla):
    """The reference is right; the fast path drops the causal mask above 16 keys."""

    name = "broken_fast_leaks_above_length"

    def forward_fast(self, query, key, value, attention_mask, is_causal, need_weights):
        causal = is_causal and key.shape[1] <= LEAK_ABOVE
        return super().forward_fast(query, key, value, attention_mask, causal, need_weights)


class LeaksForLaterBatchElements(Vanilla):
    """Causal for batch elements 0 and 1 only; the third and later see the future."""

    name = "broken_leaks_for_batch_index_2"

    def forward_reference(self, query, key, value, attention_mask, is_causal, need_weights):
        output, weights = super().forward_reference(
            query, key, value, attention_mask, is_causal, need_weights
        )
        if is_causal and query.shape[0] > 2 and 1 < query.shape[1] == key.shape[1]:
            output = torch.cat([output[:2], _leak_future(output[2:], value[2:])])
        return AttentionOutput(output, weights)

    forward_fast = None


class LeaksOnlyThroughGradient(Vanilla):
    """Exact causal values, but the gradient of output i reaches token i + 1."""

    name = "broken_gradient_only_leak"

    def forward_reference(self, query, key, value, attention_mask, is_causal, need_weights):
        output, weights = super().forward_reference(
            query, key, value, attention_mask, is_causal, need_weights
        )
        if is_causal and 1 < query.shape[1] == key.shape[1]:
            shifted = _leak_future(torch.zeros_like(output), value)
            output = output + (shifted - shifted.detach())  # adds 0, but not to the gradient
        return AttentionOutput(output, weights)

    forward_fast = None


class IgnoresPaddingInTraining(Vanilla):
    """Drops the padding mask in train mode only (a training-only kernel, say)."""

    name = "broken_ignores_padding_in_training"

    def forward_reference(self, query, key, value, attention_mask, is_causal, need_weights):
        mask = None if self.training else attention_mask
        return super().forward_reference(query, key, value, mask, is_causal, need_weights)

    forward_fast = None


class IgnoresPaddingUnderCausal(Vanilla):
    """Honours padding alone and causality alone, but drops padding when both are asked."""

    name = "broken_ignores_padding_under_causal"

    def forward_reference(self, query, key, value, attention_mask, is_causal, need_weights):
        mask = None if is_causal else attention_mask
        return super().forward_reference(query, key, value, mask, is_causal, need_weights)

    forward_fast = None


class LeaksAtLengthsDivisibleByThree(Vanilla):
    """Leaks the future only when the length is a multiple of 3: no length the named
    checks use for vanilla (1, 2, 16, 130), so only the property search can find it."""

    name = "broken_leaks_at_lengths_divisible_by_3"

    def forward_reference(self, query, key, value, attention_mask, is_causal, need_weights):
        causal = is_causal and key.shape[1] % 3 != 0
        return super().forward_reference(query, key, value, attention_mask, causal, need_weights)

    forward_fast = None


# --- wrong declarations: a SoftmaxAttention that promises what its score_mod is not ---
class FalselyRelative(playground.SoftmaxAttention):
    """Declares `relative_score_mod`, but its bias grows with the query's absolute
    position: the relative fast path evaluates it at q = 0 or kv = 0 only."""

    name = "broken_falsely_relative"
    relative_score_mod = True

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return score + 0.1 * q_idx * (kv_idx - q_idx).abs() / (1 + h)


class FalselyAdditive(playground.SoftmaxAttention):
    """Declares `additive_score_mod`, but scales the score: the blocked fast path adds
    f(0) = 0 instead."""

    name = "broken_falsely_additive"
    additive_score_mod = True

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return score * 0.5


# --- gradients only a stricter or a lower-precision backward shows -------------------
class _NaNGradientInBfloat16(torch.autograd.Function):
    """Identity forward; a backward that turns NaN in bfloat16 only."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * math.nan if grad.dtype == torch.bfloat16 else grad


class Bfloat16BackwardBroken(Vanilla):
    """Right in every dtype forward, and in float32 and float64 backward; bfloat16
    training gives NaN gradients (a fused backward that forgot to upcast, say)."""

    name = "broken_bfloat16_backward"

    def forward_fast(self, query, key, value, attention_mask, is_causal, need_weights):
        output, weights = super().forward_fast(
            query, key, value, attention_mask, is_causal, need_weights
        )
        return AttentionOutput(_NaNGradientInBfloat16.apply(output), weights)


class FastGradientSlightlyOff(Vanilla):
    """Same outputs; the fast path's input gradient is off by 1e-6 of the input, which
    float32's tolerance lets pass (an approximation in a fused backward, say)."""

    name = "broken_fast_gradient_slightly_off"

    def forward_fast(self, query, key, value, attention_mask, is_causal, need_weights):
        output, weights = super().forward_fast(
            query, key, value, attention_mask, is_causal, need_weights
        )
        nudge = 1e-6 * query.sum(dim=-1, keepdim=True)
        return AttentionOutput(output + nudge - nudge.detach(), weights)


class SumsSoftmaxInInputDtype(Vanilla):
    """The fast path adds up the softmax's denominator key by key in the input's dtype,
    with no float32 accumulator (an online softmax whose running sum stays in bfloat16, a
    hand-written kernel's classic slip). In float32 and float64 that is within rounding of
    the reference; in bfloat16 and float16, once the sum is large each small term is
    rounded at the sum's scale, an error several times what torch's softmax (float32
    inside) makes, yet within the 5e-2 (bfloat16) and 1e-2 (float16) agreement with
    float32 that check_bfloat16 and check_float16 ask for."""

    name = "broken_sums_softmax_in_input_dtype"

    def forward_fast(self, query, key, value, attention_mask, is_causal, need_weights):
        q, k, v = project_heads(self, query, key, value)  # (B, H, N, d)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # (B, H, Nq, Nk)
        allowed = allowed_keys(attention_mask, q.shape[2], k.shape[2], is_causal, q.device)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, -math.inf)
        # A row with no key keeps a finite maximum, so that its terms are 0, not NaN.
        top = scores.amax(dim=-1, keepdim=True).clamp_min(torch.finfo(scores.dtype).min)
        terms = (scores - top).exp()
        total = torch.zeros_like(top)  # (B, H, Nq, 1), rounded to the dtype at every key
        for j in range(k.shape[2]):
            total = total + terms[..., j : j + 1]
        weights = terms / total.clamp_min(torch.finfo(total.dtype).tiny)
        mixed = weights @ v  # (B, H, Nq, d)
        return AttentionOutput(project_output(self, mixed, empty_query_rows(allowed)), None)


class UndeclaredTrainingNoise(Vanilla):
    """Adds noise in training without declaring deterministic_in_training=False."""

    name = "broken_training_noise"

    def forward_fast(self, query, key, value, attention_mask, is_causal, need_weights):
        result = super().forward_fast(query, key, value, attention_mask, is_causal, need_weights)
        if self.training:
            result = AttentionOutput(result.output + 1e-3 * torch.randn_like(result.output), None)
        return result


class FalselyRandom(Vanilla):
    """Declares itself random in training, but is not."""

    name = "broken_falsely_random"
    capabilities = dataclasses.replace(Vanilla.capabilities, deterministic_in_training=False)


class NegativeWeightsDeclaredNonnegative(Vanilla):
    """Declares weights that sum to 1 and are non-negative; some are negative."""

    name = "broken_negative_weights"

    def forward_reference(self, query, key, value, attention_mask, is_causal, need_weights):
        output, weights = super().forward_reference(
            query, key, value, attention_mask, is_causal, need_weights
        )
        if weights is None:
            return AttentionOutput(output, None)
        # w (1 + 3 (s − Σ w s)), s = ±1 by key: rows still sum to 1, zeros stay 0, and
        # the keys with s = −1 go negative.
        sign = 1.0 - 2.0 * (torch.arange(weights.shape[-1]) % 2).to(weights.dtype)
        drift = sign - (weights * sign).sum(dim=-1, keepdim=True)
        return AttentionOutput(output, weights * (1 + 3 * drift))

    forward_fast = None


# --- decoding (playground/testing/decoding.py) -----------------------------------------------
Rope = playground.get_variant("rope")
Linear = playground.get_variant("linear")
SlidingWindow = playground.get_variant("sliding_window")


class DropsOldestKeyEarly(Vanilla):
    """Its step evicts the oldest kept key before attending, as a full rolling buffer
    would, though exact attention's cache is never full: from the first step with a key
    kept, every decoded token misses key 0."""

    name = "broken_drops_oldest_key"

    def step_state(self, token, state):
        if state.kept:
            state.slot_real[:, 0] = False
        return super().step_state(token, state)


class RopeOffByOne(Rope):
    """A decoded token is rotated as if one position later; the forward is untouched (a
    single-token forward rotates q and k alike, so its scores do not change)."""

    name = "broken_rope_off_by_one"

    def position_mod(self, q, k, q_idx, kv_idx):
        if q.shape[2] == 1 and k.shape[2] == 1:
            q_idx = kv_idx = q_idx + 1
        return super().position_mod(q, k, q_idx, kv_idx)


class ForgetsNormaliser(Linear):
    """Its recurrent state loses z = Σ φ(K_j) at every step: the new token is normalised
    by its own key alone."""

    name = "broken_forgets_normaliser"

    def step_state(self, token, state):
        state.normaliser.zero_()
        return super().step_state(token, state)


class WindowBufferOneShort(SlidingWindow):
    """Its rolling buffer keeps W − 1 keys where the mask lets a query see W."""

    name = "broken_window_one_short"

    def decoding_window(self):
        return self.config.window - 1


class CachesPaddingAsReal(Vanilla):
    """Its cache forgets which prompt tokens were padding: decoded tokens attend to them."""

    name = "broken_caches_padding"

    def prefill_state(self, prompt, attention_mask, max_length):
        output, state = super().prefill_state(prompt, attention_mask, max_length)
        state.slot_real.fill_(True)
        return output, state


class PrefillSeesWholePrompt(Vanilla):
    """Its prefill runs the prompt without the causal mask (as an encoder would): each
    prompt token's output sees the tokens after it; the cache and the steps are right."""

    name = "broken_prefill_sees_whole_prompt"

    def prefill_state(self, prompt, attention_mask, max_length):
        _, state = super().prefill_state(prompt, attention_mask, max_length)
        output = self(prompt, attention_mask=attention_mask).output
        return output, state


class ScalesWithLength(Vanilla):
    """Under is_causal, scales its output by 1 + N / 100, N the input's length (as a bias
    −log N would, with N the whole input's length): output i depends on how many tokens
    follow it, which no change of their values shows (check_causality passes), but
    decoding does. It has no state of its own: the core's default decodes it."""

    name = "broken_scales_with_length"
    prefill_state = playground.AttentionVariant.prefill_state
    step_state = playground.AttentionVariant.step_state

    def forward_reference(self, query, key, value, attention_mask, is_causal, need_weights):
        result = super().forward_reference(
            query, key, value, attention_mask, is_causal, need_weights
        )
        return _scaled_with_length(result, query, is_causal)

    def forward_fast(self, query, key, value, attention_mask, is_causal, need_weights):
        result = super().forward_fast(query, key, value, attention_mask, is_causal, need_weights)
        return _scaled_with_length(result, query, is_causal)


def _scaled_with_length(result, query, is_causal):
    scale = 1 + query.shape[1] / 100 if is_causal else 1.0
    return AttentionOutput(result.output * scale, result.weights)


class PositionsOfThePaddedBatch(Vanilla):
    """Adds a sinusoid of each token's position in the padded batch to its query and key
    (absolute positions counted without the mask). The core moves a right-padded prompt's
    padding to the left, so such a sequence decodes at other positions than it runs alone
    (the left-padded batch, compared with its own padded forward, is right). It has no
    state of its own."""

    name = "broken_positions_of_the_padded_batch"
    prefill_state = playground.AttentionVariant.prefill_state
    step_state = playground.AttentionVariant.step_state

    def forward_reference(self, query, key, value, attention_mask, is_causal, need_weights):
        query, key = _with_absolute_positions(query), _with_absolute_positions(key)
        return super().forward_reference(query, key, value, attention_mask, is_causal, need_weights)

    def forward_fast(self, query, key, value, attention_mask, is_causal, need_weights):
        query, key = _with_absolute_positions(query), _with_absolute_positions(key)
        return super().forward_fast(query, key, value, attention_mask, is_causal, need_weights)


def _with_absolute_positions(x):
    position = torch.arange(x.shape[1], dtype=x.dtype, device=x.device)[:, None]  # (N, 1)
    feature = torch.arange(x.shape[2], dtype=x.dtype, device=x.device)  # (E,)
    return x + torch.sin(position / (1 + feature))  # (B, N, E)


class _Holder:
    def __init__(self, tensor):
        self.tensor = tensor


class HidesStateTensor(Vanilla):
    """Keeps a tensor inside an object its state's `nbytes` does not look into."""

    name = "broken_hides_state_tensor"

    def prefill_state(self, prompt, attention_mask, max_length):
        output, state = super().prefill_state(prompt, attention_mask, max_length)
        state.scratch = _Holder(torch.zeros(1024))
        return output, state


class _KeysOnlyCache(TokenCache):
    """Counts its keys, not its values (nor which slots are real)."""

    @property
    def nbytes(self):
        keys = self.entries["k"]
        return keys.numel() * keys.element_size()


class MisreportsStateSize(Vanilla):
    """Its state's `nbytes` counts the keys and forgets the values."""

    name = "broken_misreports_state_size"

    def prefill_state(self, prompt, attention_mask, max_length):
        output, cache = super().prefill_state(prompt, attention_mask, max_length)
        state = _KeysOnlyCache(max_length=max_length)
        state.append(cache.kept_real(), **cache.kept_entries())
        return output, state


NO_DECODING_HINT = "its outputs change when a later token arrives"


class DeclaresNoDecoding(Vanilla):
    """Not broken: causal, but declares it does not decode (and says why)."""

    name = "declares_no_decoding"
    capabilities = dataclasses.replace(
        Vanilla.capabilities, decoding=False, decoding_hint=NO_DECODING_HINT
    )


class DecodesDespiteDeclaringNot(DeclaresNoDecoding):
    """Declares decoding=False, but its prefill skips the core's refusal and decodes."""

    name = "broken_decodes_despite_declaring_not"

    def prefill(self, prompt, *, attention_mask=None, max_length=None):
        output, state = self.prefill_state(prompt, attention_mask, max_length)
        state.bind(self, prompt, max_length, prompt.shape[1])
        return output, state


class FlopsDoubled(Vanilla):
    """Its flops() claims twice the work its forward does (every efficiency figure of it
    would be twice too high)."""

    name = "broken_flops_doubled"

    @staticmethod
    def flops(n_q, n_k, d_model, num_heads, **options):
        return 2 * Vanilla.flops(n_q, n_k, d_model, num_heads, **options)


class FlopsForgetValueProduct(Vanilla):
    """Its flops() counts Q Kᵀ and forgets P V: the attention's share off by 2×."""

    name = "broken_flops_forget_value_product"

    @staticmethod
    def flops(n_q, n_k, d_model, num_heads, **options):
        return projection_flops(n_q, n_k, d_model) + 2 * n_q * n_k * d_model


class LearnedSummaryOfAMatrix(Vanilla):
    """Its learned_summary() hands the report a matrix (a list of lists), which it cannot
    draw: it must be flattened into one list of numbers."""

    name = "broken_learned_summary_of_a_matrix"

    def learned_summary(self):
        return {"W^Q": self.q_proj.weight.detach()}


class AttendsByPositionOnly(Vanilla):
    """Ignores q·k: each head's score for a key is a learned number per relative distance
    (clamped to ±MAX_DISTANCE), the same whatever the query and key hold. It can learn to
    name the token a fixed number of places back (lookback), but never to find a key by
    its content (associative recall): the quick spec's recall task must tell it apart
    from exact attention."""

    name = "broken_attends_by_position_only"
    MAX_DISTANCE = 64
    forward_fast = None

    def __init__(self, d_model=512, num_heads=8, **options):
        super().__init__(d_model, num_heads, **options)
        self.distance_bias = nn.Parameter(torch.zeros(num_heads, 2 * self.MAX_DISTANCE + 1))

    def forward_reference(self, query, key, value, attention_mask, is_causal, need_weights):
        _, _, v = project_heads(self, query, key, value)  # (B, H, N, d_k); q, k unused
        n_q, n_k = query.shape[1], v.shape[2]
        distance = torch.arange(n_q, device=v.device)[:, None] - torch.arange(n_k, device=v.device)
        bucket = distance.clamp(-self.MAX_DISTANCE, self.MAX_DISTANCE) + self.MAX_DISTANCE
        scores = self.distance_bias[:, bucket][None].to(v.dtype)  # (1, H, Nq, Nk)
        allowed = allowed_keys(attention_mask, n_q, n_k, is_causal, v.device)
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        weights = torch.nan_to_num(scores.softmax(dim=-1))  # a row with no key left: zeros
        output = project_output(self, weights @ v, empty_query_rows(allowed))
        return AttentionOutput(output, weights if need_weights else None)
