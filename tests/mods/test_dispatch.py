"""The CPU path of `SoftmaxAttention` is decided once (`playground.mods.dispatch`): a pure
function of the call's facts, which `forward_fast` follows and `cpu_kernel()` and the rows
print."""

from __future__ import annotations

import math

import pytest
import torch

import playground
from playground import SoftmaxAttention
from playground.kernels import native
from playground.mods.dispatch import CallFacts, CpuDispatch, CpuPath, cpu_path
from playground.mods.program import ModProgram
from playground.mods.structure import ModStructure
from playground.softmax_attention import ExactAttention

RELATIVE = ModStructure("relative", "proven by trace")
ADDITIVE = ModStructure("additive", "proven by trace")
PER_KEY = ModStructure("additive", "proven by trace", frozenset({"h", "kv_idx"}))
GENERAL = ModStructure("general", "the score enters through tanh")
EMPTY = torch.zeros(0)
PROGRAM = ModProgram(EMPTY, EMPTY, EMPTY, EMPTY, [], [], [], 0, EMPTY)


def facts(score=None, mask_mod=False, padding=False, program="no native kernels", hides=False):
    return CallFacts(score, mask_mod, padding, lambda: program, hides)


@pytest.mark.parametrize(
    ("call", "path"),
    [
        (facts(), CpuPath.SDPA),
        (facts(padding=True), CpuPath.MASKED_BLOCKS),
        (facts(PER_KEY), CpuPath.KEY_BIAS),
        (facts(PER_KEY, program=PROGRAM), CpuPath.KEY_BIAS),  # one fused call beats a program
        (facts(PER_KEY, hides=True), CpuPath.MASKED_BLOCKS),
        (facts(PER_KEY, hides=True, program=PROGRAM), CpuPath.PROGRAM),
        (facts(PER_KEY, mask_mod=True), CpuPath.MASKED_BLOCKS),
        (facts(GENERAL), CpuPath.SCORE_BLOCKS),
        (facts(GENERAL, mask_mod=True, program=PROGRAM), CpuPath.SCORE_BLOCKS),
        (facts(ADDITIVE, program=PROGRAM), CpuPath.PROGRAM),
        (facts(ADDITIVE), CpuPath.MASKED_BLOCKS),
        (facts(RELATIVE), CpuPath.TOEPLITZ),
        (facts(RELATIVE, program=PROGRAM), CpuPath.PROGRAM),
        (facts(RELATIVE, hides=True), CpuPath.MASKED_BLOCKS),
        (facts(RELATIVE, mask_mod=True), CpuPath.MASKED_BLOCKS),
        (facts(mask_mod=True, program=PROGRAM), CpuPath.PROGRAM),
        (facts(mask_mod=True), CpuPath.MASKED_BLOCKS),
    ],
)
def test_each_call_gets_one_path(call, path):
    decision = cpu_path(call)
    assert decision.path is path
    assert decision.reason  # every path says why
    assert (decision.program is not None) == (path is CpuPath.PROGRAM)


def test_the_reason_says_why_an_earlier_path_was_passed_over():
    assert "no native kernels" in str(cpu_path(facts(ADDITIVE)))
    assert "tanh" in str(cpu_path(facts(GENERAL)))
    hidden = str(cpu_path(facts(RELATIVE, hides=True)))
    assert "−inf" in hidden and "Toeplitz" in hidden


def test_the_program_is_lowered_only_when_the_decision_reaches_it():
    def never():
        raise AssertionError("lowered for a path that needs no program")

    for score in (None, PER_KEY, GENERAL):
        assert cpu_path(CallFacts(score, False, False, never)).path is not CpuPath.PROGRAM


# --- the module follows the decision ------------------------------------------------------
class _Slopes(SoftmaxAttention):
    name = "slopes_for_dispatch_tests"

    def __init__(self, d_model=16, num_heads=2, **options):
        super().__init__(d_model, num_heads, **options)
        self.register_buffer("slopes", torch.tensor([0.5, 0.25]))

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return score - self.slopes[h] * (q_idx - kv_idx).abs()


class _HidesNearKeys(_Slopes):
    """A relative bias that is −inf within 20 positions: the first 20 queries of a causal
    call see no key, and must output zero."""

    name = "hides_near_keys_for_dispatch_tests"

    def score_mod(self, score, b, h, q_idx, kv_idx):
        offset = q_idx - kv_idx
        return score + torch.where(offset >= 20, -self.slopes[h] * offset, -math.inf)


class _PerKey(_Slopes):
    name = "per_key_for_dispatch_tests"

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return score + self.slopes[h] * kv_idx


class _SoftCap(_Slopes):
    name = "soft_cap_for_dispatch_tests"

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return 5 * torch.tanh(score / 5)


class _Window(SoftmaxAttention):
    name = "window_for_dispatch_tests"

    def mask_mod(self, b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() <= 3


def _taken(cls, dtype=torch.float64, **call):
    """The path a call takes, and the largest difference of its output from the
    reference's."""
    torch.manual_seed(0)
    module = cls(16, 2).to(dtype).eval()
    x = torch.randn(2, 24, 16, dtype=dtype)
    call = {"is_causal": True, **call}
    with torch.no_grad():
        fast = module(x, **call).output
        reference = module.forward_reference(
            x, x, x, call.get("attention_mask"), call["is_causal"], False
        ).output
    return module.cpu_path_taken, float((fast - reference).abs().max())


def _exact(cls, dtype=torch.float64, **call):
    taken, error = _taken(cls, dtype, **call)
    assert error < (1e-10 if dtype == torch.float64 else 1e-5), (taken, error)
    return taken


@pytest.mark.parametrize(
    ("cls", "path"),
    [
        (ExactAttention, CpuPath.SDPA),
        (_PerKey, CpuPath.KEY_BIAS),
        (_SoftCap, CpuPath.SCORE_BLOCKS),
        (_Slopes, CpuPath.TOEPLITZ),  # float64: programs run in float32
        (_HidesNearKeys, CpuPath.MASKED_BLOCKS),
        (_Window, CpuPath.MASKED_BLOCKS),
    ],
)
def test_every_path_is_taken_by_some_mod_and_is_exact(cls, path):
    taken = _exact(cls)
    assert isinstance(taken, CpuDispatch) and taken.path is path, taken


def test_padding_without_mods_takes_the_blocks():
    mask = torch.ones(2, 24, dtype=torch.bool)
    mask[1, 20:] = False
    assert _exact(ExactAttention, attention_mask=mask).path is CpuPath.MASKED_BLOCKS


@pytest.mark.skipif(native.load() is None, reason="the native kernels are not built")
@pytest.mark.parametrize("cls", [_Slopes, _Window, _HidesNearKeys])
def test_float32_with_the_native_kernels_runs_the_program(cls):
    assert _exact(cls, torch.float32).path is CpuPath.PROGRAM


def test_the_forward_follows_the_decision_it_is_given(monkeypatch):
    """Forced onto another path, the call runs that path (and stays exact): nothing
    downstream decides again."""
    forced = CpuDispatch(CpuPath.MASKED_BLOCKS, "forced by a test")
    monkeypatch.setattr("playground.softmax_attention.cpu_path", lambda facts: forced)
    relative_calls = []
    monkeypatch.setattr(
        "playground.softmax_attention.relative_bias_attention",
        lambda *args, **kwargs: relative_calls.append(1),
    )
    assert _exact(_Slopes) == forced
    assert not relative_calls


def test_without_the_fallback_the_toeplitz_path_is_wrong(monkeypatch):
    """The fallback is needed, and the exactness check sees it go: told nothing of the
    −inf in the bias, the call runs the Toeplitz path, whose queries that see no key do
    not output zero."""
    assert _exact(_HidesNearKeys).path is CpuPath.MASKED_BLOCKS
    monkeypatch.setattr("playground.softmax_attention.replace", lambda facts, **changed: facts)
    taken, error = _taken(_HidesNearKeys)
    assert taken.path is CpuPath.TOEPLITZ
    assert not error < 1e-6  # NaN or far off


@pytest.mark.parametrize("name", ["alibi", "sliding_window", "gated", "rope"])
def test_cpu_kernel_reports_the_path_a_call_takes(name):
    module = playground.build(name, 32, 4)
    if not isinstance(module, SoftmaxAttention):
        pytest.skip(f"{name} is not a SoftmaxAttention")
    module.eval()
    with torch.no_grad():
        module(torch.randn(1, 64, 32), is_causal=True)
    assert module.cpu_kernel(64) == module.cpu_path_taken
