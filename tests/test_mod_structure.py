"""A score_mod's structure is proven by tracing, not sampled: relative and additive mods
take their fast paths without a declaration, and mods that would fool a sampler keep the
general path and still match the reference."""

from __future__ import annotations

import pytest
import torch

import playground
from playground import SoftmaxAttention
from playground.kernels import relative as relative_kernels
from playground.mod_structure import trace_structure
from playground.testing import check_attention
from playground.testing.checks import check_fast_matches_reference
from tests.kernels.test_flex_cpu import (
    DependsOnBatch,
    MultipliesScore,
    ReadsAbsoluteQuery,
    RelativeOnlyBelow,
)

SLOPES = torch.linspace(0.1, 1.0, 8)
TABLE = torch.randn(64)

MODS = {
    "alibi as the README writes it": (
        lambda s, b, h, q, kv: s - SLOPES[h] * (q - kv).abs(),
        "relative",
    ),
    "a T5-like table by distance": (
        lambda s, b, h, q, kv: s + TABLE[(kv - q).clamp(-31, 31) + 31],
        "relative",
    ),
    "a bias per head only": (lambda s, b, h, q, kv: s + 0.1 * h, "relative"),
    "a learned bias per key": (lambda s, b, h, q, kv: s + TABLE[kv], "additive"),
    "a bias that reads b": (lambda s, b, h, q, kv: s + 0.5 * b - 0.1 * (q - kv).abs(), "additive"),
    "a tensor read at absolute q": (lambda s, b, h, q, kv: s + TABLE[q], "additive"),
    "relative only below a length": (
        lambda s, b, h, q, kv: torch.where((q - kv).abs() < 6, s - 0.3 * (q - kv).abs(), s - 5.0),
        "general",
    ),
    "a product with the score": (lambda s, b, h, q, kv: s * (1 + 0.1 * h), "general"),
    "a tanh soft cap": (lambda s, b, h, q, kv: torch.tanh(s / 30) * 30, "general"),
    "the score subtracted": (lambda s, b, h, q, kv: 1 - s, "general"),
    "Python control flow": (lambda s, b, h, q, kv: s if q > 3 else s - 1, "general"),
}


@pytest.mark.parametrize(("mod", "kind"), MODS.values(), ids=MODS)
def test_the_trace_reads_the_structure(mod, kind):
    structure = trace_structure(mod)
    assert structure.kind == kind, structure
    if kind == "relative":
        assert structure.reason == "proven by trace"


def test_the_reasons_say_why():
    assert str(trace_structure(MODS["a tanh soft cap"][0])).startswith("general: the score enters")
    assert "not traceable" in str(trace_structure(MODS["Python control flow"][0]))
    assert "reads b" in str(trace_structure(MODS["a bias that reads b"][0]))


class UndeclaredAlibi(SoftmaxAttention):
    """ALiBi as a researcher writes it from the README: slopes as a buffer, no declaration."""

    name = "test_undeclared_alibi"
    summary = paper = "test"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_buffer(
            "slopes", 2.0 ** (-8 * torch.arange(1, self.num_heads + 1) / self.num_heads)
        )

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return score - self.slopes[h] * (q_idx - kv_idx).abs()


def test_an_undeclared_relative_mod_takes_the_relative_kernel(monkeypatch):
    calls = []
    original = relative_kernels.relative_bias_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr("playground.softmax_attention.relative_bias_attention", counted)
    # float64: in float32 the native kernels evaluate the bias per row instead
    # (tests/kernels/test_mod_program.py).
    module = UndeclaredAlibi(32, 4).double().eval()
    assert str(module.score_mod_structure()) == "relative: proven by trace"
    x = torch.randn(2, 40, 32, dtype=torch.float64)
    with torch.no_grad():
        fast = module(x).output
        reference = module.forward_reference(x, x, x, None, False, False).output
    assert calls and (fast - reference).abs().max() < 1e-5


def test_a_declaration_overrides_the_trace():
    module = playground.build("alibi", 32, 4)
    assert str(module.score_mod_structure()) == "relative: declared (relative_score_mod = True)"


@pytest.mark.parametrize(
    "variant",
    [RelativeOnlyBelow, DependsOnBatch, MultipliesScore, ReadsAbsoluteQuery, UndeclaredAlibi],
    ids=lambda v: v.name,
)
def test_mods_that_would_fool_a_sampler_stay_correct(variant):
    """Each keeps a path that is right for it (never the relative one unless proven), and
    the fast path equals the reference in the suite's corners."""
    structure = variant(32, 4).score_mod_structure()
    assert structure.kind != "relative" or variant is UndeclaredAlibi
    report = check_attention(variant, checks=[check_fast_matches_reference])
    assert report.ok, report.failures


class LearnedBiasPerKey(SoftmaxAttention):
    name = "test_learned_bias_per_key"
    summary = paper = "test"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.key_bias = torch.nn.Parameter(0.1 * torch.randn(512))

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return score + self.key_bias[kv_idx]


def test_a_mod_reading_the_modules_own_parameter_is_traced():
    """fx refuses a parameter that is not a member of the traced root: the module is its
    owner, so a learned bias is read, not a reason to give up."""
    structure = LearnedBiasPerKey(32, 4).score_mod_structure()
    assert (
        str(structure) == "additive: proven by trace; not relative: q_idx and kv_idx appear apart"
    )


def test_a_bias_per_key_is_folded_into_the_keys(monkeypatch):
    """A traced additive bias that never reads q_idx takes kernels.key_bias_attention:
    one fused call, the bias a coordinate of the keys; it equals the reference, and the
    bias gets its gradient."""
    import playground.softmax_attention as softmax_module

    calls = []
    original = softmax_module.key_bias_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(softmax_module, "key_bias_attention", counted)
    module = LearnedBiasPerKey(32, 4).double()
    assert "q_idx" not in module.score_mod_structure().bias_reads
    x = torch.randn(2, 20, 32, dtype=torch.float64)
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[1, :5] = False
    fast = module(x, attention_mask=mask, is_causal=True).output
    reference = module.forward_reference(x, x, x, mask, True, False).output
    assert calls and (fast - reference).abs().max() < 1e-10
    fast.sum().backward()
    assert module.key_bias.grad is not None and module.key_bias.grad[:20].abs().max() > 0


@pytest.mark.parametrize("check_name", ["check_fast_matches_reference", "check_float64"])
def test_the_key_bias_path_passes_the_suite(check_name):
    from playground.testing import CHECKS

    check = next(check for check in CHECKS if check.__name__ == check_name)
    report = check_attention(LearnedBiasPerKey, checks=[check])
    assert report.ok, report.failures


class HidesKeysByBias(SoftmaxAttention):
    """A per-key bias of −inf on even keys: not folded (−inf in a key would poison the
    product), the blocked path runs it."""

    name = "test_hides_keys_by_bias"
    summary = paper = "test"

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return score + torch.where(kv_idx % 2 == 0, float("-inf"), 0.0)


def test_a_bias_that_hides_keys_is_not_folded_and_stays_right():
    module = HidesKeysByBias(32, 4).double().eval()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    with torch.no_grad():
        fast = module(x).output
        reference = module.forward_reference(x, x, x, None, False, False).output
    assert (fast - reference).abs().max() < 1e-10
