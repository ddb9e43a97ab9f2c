"""Every registered variant passes the contract suite (one pytest test per check, so
`pytest -k causality` selects by name), and the suite catches deliberately broken
variants with the right check."""

from __future__ import annotations

import pytest
import torch

import playground
from playground.decoding import RecomputeState
from playground.testing import (
    CHECKS,
    CheckFailed,
    check_attention,
    iter_cases,
    parametrize_with_checks,
)
from playground.testing.checks import (
    check_bfloat16,
    check_eval_mode_is_deterministic,
    check_fast_matches_reference,
    check_float16,
    check_float64,
    check_gradients_reach_every_parameter,
    check_key_value_default_to_query,
    check_rejects_malformed_inputs,
)
from playground.testing.decoding_checks import DECODING_CHECKS
from playground.testing.low_precision import LOW_PRECISION_CHECKS
from tests import broken_variants

SPECIFICITY_CHECKS = (
    check_key_value_default_to_query,
    check_gradients_reach_every_parameter,
    check_eval_mode_is_deterministic,
    check_rejects_malformed_inputs,
)
"""Cheap promises every broken variant keeps: it breaks one thing, not everything."""

ALSO_BREAKS = {
    # Cutting a parameter's gradient in the fast path is also a parameter without one.
    broken_variants.FastLosesBiasGradient: (check_gradients_reach_every_parameter,),
    # Overriding forward skips the input checks along with the capability checks.
    broken_variants.BypassesCapabilities: (check_rejects_malformed_inputs,),
    # Key/value take no part, so they get no gradient.
    broken_variants.IgnoresKeys: (check_gradients_reach_every_parameter,),
    # One position short: the upstream gradient no longer fits the output.
    broken_variants.WrongShape: (check_gradients_reach_every_parameter,),
}


@parametrize_with_checks()
def test_contract(case):
    case.check()


@pytest.mark.parametrize(
    ("broken", "caught_by"),
    [
        (broken_variants.LeaksFuture, "check_causality"),
        (broken_variants.IgnoresPadding, "check_padding_invariance"),
        (broken_variants.IgnoresPadding, "check_padded_weights_are_zero"),
        (broken_variants.IgnoresPaddingInCrossAttention, "check_cross_attention_corners"),
        (broken_variants.NaNOnFullyMaskedRow, "check_fully_masked_rows_are_zero"),
        (broken_variants.FastDisagrees, "check_fast_matches_reference"),
        (broken_variants.FastLosesBiasGradient, "check_fast_matches_reference"),
        (broken_variants.CouplesBatch, "check_batch_independence"),
        (broken_variants.WeightsDoNotSumToOne, "check_weights_sum_to_one"),
        (broken_variants.DeadParameter, "check_gradients_reach_every_parameter"),
        (broken_variants.DropoutInEval, "check_eval_mode_is_deterministic"),
        (broken_variants.Float64Broken, "check_float64"),
        (broken_variants.OverflowsOnLargeInputs, "check_large_magnitude_inputs"),
        (broken_variants.BypassesCapabilities, "check_undeclared_features_raise"),
        (broken_variants.IgnoresKeys, "check_cross_attention"),
        (broken_variants.WrongShape, "check_output_shape_and_dtype"),
        (broken_variants.LeaksAboveLength, "check_causality"),
        (broken_variants.FastLeaksAboveLength, "check_fast_matches_reference"),
        (broken_variants.LeaksForLaterBatchElements, "check_causality"),
        (broken_variants.LeaksOnlyThroughGradient, "check_causality"),
        (broken_variants.IgnoresPaddingInTraining, "check_padding_invariance"),
        (broken_variants.IgnoresPaddingUnderCausal, "check_padding_invariance"),
        (broken_variants.FalselyRelative, "check_fast_matches_reference"),
        (broken_variants.FalselyAdditive, "check_fast_matches_reference"),
        (broken_variants.Bfloat16BackwardBroken, "check_bfloat16"),
        (broken_variants.FastGradientSlightlyOff, "check_float64"),
        (broken_variants.UndeclaredTrainingNoise, "check_training_randomness_is_declared"),
        (broken_variants.FalselyRandom, "check_training_randomness_is_declared"),
        (broken_variants.NegativeWeightsDeclaredNonnegative, "check_weights_sum_to_one"),
        (broken_variants.SumsSoftmaxInInputDtype, "check_bfloat16_error_within_naive"),
        (broken_variants.SumsSoftmaxInInputDtype, "check_float16_error_within_naive"),
        (broken_variants.FlopsDoubled, "check_flops_match_the_counter"),
        (broken_variants.FlopsForgetValueProduct, "check_flops_match_the_counter"),
        (broken_variants.LearnedSummaryOfAMatrix, "check_learned_summary"),
    ],
    ids=lambda value: value if isinstance(value, str) else value.__name__,
)
def test_suite_catches_broken_variant(broken, caught_by):
    check = next(check for check in CHECKS if check.__name__ == caught_by)
    report = check_attention(broken, checks=[check])
    assert report.verdict_of(caught_by) == "failed", report.results
    # Failures are specific: the promises the variant keeps still pass.
    kept = [
        c for c in SPECIFICITY_CHECKS if c is not check and c not in ALSO_BREAKS.get(broken, ())
    ]
    assert check_attention(broken, checks=kept).ok, check_attention(broken, checks=kept).failures


def test_only_the_low_precision_checks_see_a_softmax_summed_in_bfloat16():
    """The break stays within every other dtype check's tolerance (agreement with float32
    in bfloat16 and float16, fast against reference in float32 and float64): the error
    bound relative to the naive path is what catches it, in both dtypes, naming the
    quantity and both errors."""
    broken = broken_variants.SumsSoftmaxInInputDtype
    others = [check_bfloat16, check_float16, check_fast_matches_reference, check_float64]
    assert check_attention(broken, checks=others).ok
    report = check_attention(broken, checks=list(LOW_PRECISION_CHECKS))
    assert [r.verdict for r in report.results] == ["failed", "failed"], report.results
    for result, dtype in zip(report.results, ("torch.bfloat16", "torch.float16"), strict=True):
        assert result.reason.startswith(f"in {dtype}, the fast path's error in the gradient")
        assert "above 2 × the reference path's own largest error" in result.reason


def test_the_low_precision_checks_skip_by_declaration_with_a_reason():
    report = check_attention("rope", checks=list(LOW_PRECISION_CHECKS))  # no float16
    assert report.verdict_of("check_bfloat16_error_within_naive") == "passed"
    assert report.verdict_of("check_float16_error_within_naive") == "skipped"
    assert report.results[1].reason == "torch.float16 not declared"
    report = check_attention(
        broken_variants.NegativeWeightsDeclaredNonnegative, checks=list(LOW_PRECISION_CHECKS)
    )  # no fast path
    assert {r.verdict for r in report.results} == {"skipped"}
    assert all(r.reason.startswith("no fast path") for r in report.results)


def test_the_low_precision_bound_is_twice_the_naive_error_plus_one_rounding():
    from playground.testing.low_precision import _assert_error_within_naive, _LargestErrors

    rounding = 2.0**-8  # bfloat16's unit roundoff
    within = _LargestErrors(fast=2 * 0.01 + 3 * rounding, naive=0.01, magnitude=3.0)
    _assert_error_within_naive({"output": within}, torch.bfloat16, torch.float64)
    small = _LargestErrors(fast=rounding, naive=0.0, magnitude=0.2)  # the slack's floor is 1
    _assert_error_within_naive({"output": small}, torch.bfloat16, torch.float64)
    # Zero in exact arithmetic: rounding noise only, not compared.
    noise = _LargestErrors(fast=0.01, naive=0.001, magnitude=1e-16)
    _assert_error_within_naive({"noise": noise}, torch.bfloat16, torch.float64)
    for beyond in (
        _LargestErrors(fast=2 * 0.01 + 3 * rounding + 1e-3, naive=0.01, magnitude=3.0),
        _LargestErrors(fast=float("nan"), naive=0.01, magnitude=3.0),
    ):
        with pytest.raises(CheckFailed, match="error in output reaches"):
            _assert_error_within_naive({"output": beyond}, torch.bfloat16, torch.float64)


def test_vanilla_passes_with_no_failures_and_reports_reasons_for_skips():
    """(Every check on vanilla runs in test_contract above; here the report's shape.)"""
    from playground.testing import checks

    report = check_attention(
        "vanilla",
        checks=[
            checks.check_output_shape_and_dtype,
            checks.check_undeclared_features_raise,  # skipped: vanilla declares them all
            checks.check_rejects_malformed_inputs,
        ],
    )
    assert report.ok, report.failures
    skipped = [r for r in report.results if r.verdict == "skipped"]
    assert skipped and all(r.reason for r in skipped)


def test_skips_only_by_declared_capability():
    report = check_attention(broken_variants.SelfAttentionOnly)
    assert report.verdict_of("check_cross_attention") == "skipped"
    assert report.verdict_of("check_causality") == "skipped"
    assert report.verdict_of("check_undeclared_features_raise") == "passed"
    assert report.ok, report.failures


def test_the_property_search_finds_what_the_named_checks_miss():
    from playground.testing import property_search
    from playground.testing.checks import check_causality

    broken = broken_variants.LeaksAtLengthsDivisibleByThree
    assert check_attention(broken, checks=[check_causality]).ok  # its lengths miss it
    with pytest.raises(
        AssertionError, match=r"leaks the future .*property search.*n_q=(3|6|9|12|15|18)\b"
    ):
        property_search(broken, max_examples=100)
    from playground.testing.properties import check_property_search

    report = check_attention(broken, checks=[check_property_search])
    assert report.verdict_of("check_property_search") == "failed"


def test_the_property_search_is_derandomized():
    from playground.testing import property_search

    broken = broken_variants.LeaksAtLengthsDivisibleByThree
    messages = set()
    for _ in range(2):
        with pytest.raises(AssertionError) as caught:
            property_search(broken, max_examples=30)
        messages.add(str(caught.value))
    assert len(messages) == 1, messages


def test_softmax_attention_without_mods_passes_the_suite():
    """The core's ExactAttention (no score_mod, no mask_mod): one SDPA call without
    padding, the blocked path with it."""
    from playground.softmax_attention import ExactAttention

    report = check_attention(ExactAttention)
    assert report.ok, report.failures


DECODES_WRONG = {"check_decoding_matches_forward", "check_decoding_padded_prompts"}
MISREPORTS_SIZE = {"check_decoding_state_size"}
DECODING_BREAKS = {
    broken_variants.DropsOldestKeyEarly: DECODES_WRONG,
    broken_variants.RopeOffByOne: DECODES_WRONG,
    broken_variants.ForgetsNormaliser: DECODES_WRONG,
    broken_variants.WindowBufferOneShort: DECODES_WRONG,
    broken_variants.PrefillSeesWholePrompt: DECODES_WRONG,
    # Its prompts are all real unless padded: only the padded batch shows it.
    broken_variants.CachesPaddingAsReal: {"check_decoding_padded_prompts"},
    # No state of its own: the core's default decodes it, and shows the length leak.
    broken_variants.ScalesWithLength: DECODES_WRONG,
    # Right for the padded batch's positions: only the right-padded prompts show it.
    broken_variants.PositionsOfThePaddedBatch: {"check_decoding_padded_prompts"},
    broken_variants.HidesStateTensor: MISREPORTS_SIZE,
    broken_variants.MisreportsStateSize: MISREPORTS_SIZE,
    # Every decoding check first asks prefill to refuse what the variant declares.
    broken_variants.DecodesDespiteDeclaringNot: {check.__name__ for check in DECODING_CHECKS},
}
"""Each decoding break and the checks that must fail it: exactly those."""


@pytest.mark.slow
@pytest.mark.parametrize("broken", list(DECODING_BREAKS), ids=lambda broken: broken.__name__)
def test_a_decoding_break_fails_its_checks_and_passes_the_rest(broken):
    """The whole suite runs on the fast path (the breaks are in the decoding hooks, which
    both paths share): the checks made for the break fail it and every other check passes
    it, so the break is in the decoding alone and the suite says where."""
    results = [case.evaluate() for case in iter_cases([broken]) if case.impl == "fast"]
    failed = {result.check for result in results if result.verdict == "failed"}
    assert failed == DECODING_BREAKS[broken], [r for r in results if r.verdict == "failed"]


def test_the_decoding_checks_skip_a_variant_that_refuses_to_decode():
    report = check_attention("linformer", checks=list(DECODING_CHECKS))
    assert {r.verdict for r in report.results} == {"skipped"}
    assert all(
        r.reason.startswith("causal not declared") and r.reason.endswith("prefill refuses it")
        for r in report.results
    )
    report = check_attention(broken_variants.DeclaresNoDecoding, checks=list(DECODING_CHECKS))
    assert {r.verdict for r in report.results} == {"skipped"}
    assert all(broken_variants.NO_DECODING_HINT in r.reason for r in report.results)


def test_a_variant_without_a_state_of_its_own_is_checked_through_the_default():
    """The core's default (re-running the causal forward) passes, and it is what ran."""

    class Recomputed(broken_variants.Vanilla):
        name = "recomputed"
        prefill_state = playground.AttentionVariant.prefill_state
        step_state = playground.AttentionVariant.step_state

    report = check_attention(Recomputed, checks=list(DECODING_CHECKS))
    assert {r.verdict for r in report.results} == {"passed"}, report.results
    state = Recomputed(32, 4).prefill(torch.randn(1, 3, 32))[1]
    assert isinstance(state, RecomputeState)
