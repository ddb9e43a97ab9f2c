"""The FLOPs check (playground/testing/flops.py): flops() against torch's FlopCounterMode
over the declared path, and the learned_summary check. The broken variants each check
must catch are in test_contract_suite.py's parametrised list; here the messages, the
declarations and the counter's formula for the CPU flash kernel."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import playground
from playground.testing import check_attention
from playground.testing.flops import COUNTED_ATTENTION, check_flops_match_the_counter
from playground.testing.hooks import check_learned_summary
from tests import broken_variants


def _only(variant, check):
    (result,) = check_attention(variant, checks=[check]).results
    return result


def test_a_doubled_flops_is_refused_naming_both_numbers_and_the_shape():
    result = _only(broken_variants.FlopsDoubled, check_flops_match_the_counter)
    assert result.verdict == "failed"
    # n = 2, d_model 32: projections 2·4·2·32², Q Kᵀ and P V 4·2·2·32.
    counted = 8 * 2 * 32 * 32 + 4 * 2 * 2 * 32
    assert result.reason.startswith(
        f"flops() claims {2 * counted} but FlopCounterMode counts {counted} over the "
        f"reference path (n_q=2, n_k=2, self attention, d_model=32, num_heads=4): 2 times "
        f"the count, outside the declared flops_tolerance of ±0.05"
    ), result.reason


def test_forgetting_p_v_is_caught_where_the_attention_outweighs_the_projections():
    result = _only(broken_variants.FlopsForgetValueProduct, check_flops_match_the_counter)
    assert result.verdict == "failed"
    ratio = float(re.search(r": ([0-9.]+) times the count", result.reason).group(1))
    assert ratio < 0.95, result.reason


@pytest.mark.parametrize("name", ["linear", "performer", "sliding_window", "longformer"])
def test_a_variant_whose_reference_does_more_than_its_algorithm_declares_the_fast_path(name):
    """Counted on the reference (the (Nq, Nk) matrix of a linear-cost method, or every pair
    scored and then masked) the claim is far below the count: the declaration is what
    makes the check pass, not a wide tolerance."""
    cls = playground.get_variant(name)
    assert cls.flops_counted_path == "fast"
    assert cls.flops_tolerance == 0.05
    on_reference = type(f"{cls.__name__}OnReference", (cls,), {"flops_counted_path": "reference"})
    result = _only(on_reference, check_flops_match_the_counter)
    assert result.verdict == "failed"
    assert "over the reference path" in result.reason
    assert _only(cls, check_flops_match_the_counter).verdict == "passed"


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ({"flops_counted_path": "fastest"}, "flops_counted_path is 'fastest'; declare one of"),
        ({"flops_tolerance": 1.5}, r"flops_tolerance is 1.5; declare a share of the count"),
        ({"flops_tolerance": "5%"}, r"flops_tolerance is '5%'"),
    ],
)
def test_junk_declarations_are_refused(declared, message):
    junk = type("Junk", (broken_variants.Vanilla,), {"name": "junk", **declared})
    result = _only(junk, check_flops_match_the_counter)
    assert result.verdict == "failed"
    assert re.match(message, result.reason), result.reason


def test_a_non_finite_flops_is_refused():
    nan = staticmethod(lambda n_q, n_k, d_model, num_heads, **options: float("nan"))
    junk = type("NanFlops", (broken_variants.Vanilla,), {"name": "nan_flops", "flops": nan})
    result = _only(junk, check_flops_match_the_counter)
    assert result.verdict == "failed"
    assert result.reason.startswith("flops() returned nan (n_q=2, n_k=2")


def _sdpa_flops(mapping, *arguments, **options):
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=mapping) as mode:
        F.scaled_dot_product_attention(*arguments, **options)
    return mode.get_total_flops()


def test_the_cpu_flash_kernel_is_counted_by_the_pairs_its_mask_allows():
    """torch's counter has no formula for the CPU flash kernel (it counts nothing); ours
    counts Q Kᵀ and P V over every pair without a mask, and over the allowed ones with a
    bool or an additive mask, or under is_causal."""
    b, h, n_q, n_k, d = 2, 3, 6, 5, 8
    q, k, v = torch.randn(b, h, n_q, d), torch.randn(b, h, n_k, d), torch.randn(b, h, n_k, d)
    assert _sdpa_flops({}, q, k, v) == 0
    assert _sdpa_flops(COUNTED_ATTENTION, q, k, v) == 4 * b * h * n_q * n_k * d
    band = (torch.arange(n_q)[:, None] - torch.arange(n_k)).abs() <= 1
    assert int(band.sum()) == 2 + 3 + 3 + 3 + 2 + 1  # |i − j| <= 1, per query row
    assert _sdpa_flops(COUNTED_ATTENTION, q, k, v, attn_mask=band) == 4 * b * h * 14 * d
    additive = torch.zeros(n_q, n_k).masked_fill(~band, float("-inf"))
    assert _sdpa_flops(COUNTED_ATTENTION, q, k, v, attn_mask=additive) == 4 * b * h * 14 * d
    square = torch.randn(b, h, n_k, d)
    causal = _sdpa_flops(COUNTED_ATTENTION, square, k, v, is_causal=True)
    assert causal == 4 * b * h * (n_k * (n_k + 1) // 2) * d


def test_a_junk_learned_summary_is_caught_naming_the_hook():
    result = _only(broken_variants.LearnedSummaryOfAMatrix, check_learned_summary)
    assert result.verdict == "failed"
    assert result.reason.startswith("in eval mode: variant 'broken_learned_summary_of_a_matrix'")
    assert "its learned_summary() hook returned 'W^Q'" in result.reason
    assert "(flatten a matrix)" in result.reason


@pytest.mark.parametrize(
    ("name", "options"),
    [("alibi", {"learnable_slopes": True}), ("differential", {}), ("t5_relative", {})],
)
def test_shipped_learned_summaries_pass(name, options):
    report = check_attention(name, checks=[check_learned_summary], options=options)
    assert report.verdict_of("check_learned_summary") == "passed", report.results
    assert playground.build(name, d_model=32, num_heads=4, **options).learned_summary()
