"""SoftmaxAttention's FlexAttention path, run eagerly on the CPU so that it is tested on
every commit without a GPU (tools/gpu-check runs it compiled on CUDA when one is lent):
the block mask, `mask_mod` composed with padding and causality, the scale, empty rows and
cross attention, against the variant's reference, for every shipped SoftmaxAttention
variant and for mods that wrong-foot a structure detector."""

from __future__ import annotations

import warnings

import pytest
import torch

import playground
from playground import SoftmaxAttention
from playground.registry import default_registry

D_MODEL, HEADS = 32, 4
SHIPPED = sorted(
    name
    for name in default_registry().names()
    if issubclass(playground.get_variant(name), SoftmaxAttention)
)


class RelativeOnlyBelow(SoftmaxAttention):
    """ALiBi-like below 6 tokens of distance, then a constant: relative only below a
    length."""

    name = "test_relative_only_below"
    summary = paper = "test"

    def score_mod(self, score, b, h, q_idx, kv_idx):
        distance = (q_idx - kv_idx).abs()
        return torch.where(distance < 6, score - 0.3 * distance, score - 5.0)


class DependsOnBatch(SoftmaxAttention):
    name = "test_depends_on_b"
    summary = paper = "test"

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return score + 0.5 * b - 0.1 * (q_idx - kv_idx).abs()


class MultipliesScore(SoftmaxAttention):
    name = "test_multiplies_score"
    summary = paper = "test"

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return score * (1 + 0.1 * h)


class ReadsAbsoluteQuery(SoftmaxAttention):
    name = "test_reads_absolute_q"
    summary = paper = "test"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_buffer("per_query", torch.linspace(-1, 1, 512))

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return score + self.per_query[q_idx]


MODS = [RelativeOnlyBelow, DependsOnBatch, MultipliesScore, ReadsAbsoluteQuery]
OPTIONS = {"sliding_window": {"window": 3}}


def module(variant) -> SoftmaxAttention:
    torch.manual_seed(0)
    if isinstance(variant, str):
        built = playground.build(variant, D_MODEL, HEADS, **OPTIONS.get(variant, {}))
    else:
        built = variant(D_MODEL, HEADS)
    return built.double().eval()


def inputs(n_q: int, n_k: int):
    generator = torch.Generator().manual_seed(1)
    query = torch.randn(3, n_q, D_MODEL, generator=generator, dtype=torch.float64)
    key = torch.randn(3, n_k, D_MODEL, generator=generator, dtype=torch.float64)
    padding = torch.ones(3, n_k, dtype=torch.bool)
    padding[1, : n_k // 3] = False  # left padding
    padding[2, n_k // 2 :] = False  # right padding
    return query, key, padding


CASES = {
    "self, bidirectional": (11, 11, False, False),
    "self, causal": (11, 11, True, False),
    "self, causal, padded": (11, 11, True, True),
    "self, padded": (11, 11, False, True),
    "cross, Nq < Nk, padded": (7, 13, False, True),
    "cross, Nq > Nk, padded": (13, 5, False, True),
}


def compare(variant, n_q, n_k, causal, padded) -> float:
    attention = module(variant)
    query, key, padding = inputs(n_q, n_k)
    mask = padding if padded else None
    if n_q == n_k:
        key = query
    with torch.no_grad():
        flex = attention._forward_flex(query, key, key, mask, causal).output
        reference = attention.forward_reference(query, key, key, mask, causal, False).output
    return float((flex - reference).abs().max())


@pytest.mark.parametrize("case", CASES, ids=CASES)
@pytest.mark.parametrize(
    "variant", SHIPPED + MODS, ids=lambda v: v if isinstance(v, str) else v.name
)
def test_the_flex_path_equals_the_reference(variant, case):
    assert compare(variant, *CASES[case]) < 1e-10


@pytest.mark.parametrize("variant", SHIPPED)
def test_a_query_that_sees_no_key_outputs_zero_on_the_flex_path(variant):
    attention = module(variant)
    query, _, _ = inputs(6, 6)
    padding = torch.zeros(3, 6, dtype=torch.bool)
    padding[0] = True  # batch elements 1 and 2 have no real key
    with torch.no_grad():
        flex = attention._forward_flex(query, query, query, padding, False).output
        reference = attention.forward_reference(query, query, query, padding, False, False).output
    assert (flex[1:] == 0).all() and (flex - reference).abs().max() < 1e-10


def test_the_comparison_can_fail():
    """Causality dropped on one side shows: the test above compares real outputs."""
    attention = module("alibi")
    query, _, padding = inputs(9, 9)
    with torch.no_grad():
        flex = attention._forward_flex(query, query, query, padding, True).output
        bidirectional = attention.forward_reference(query, query, query, padding, False, False)
    assert (flex - bidirectional.output).abs().max() > 1e-3


def test_the_flex_path_asks_for_the_log_sum_exp_without_the_deprecated_flag():
    attention = module("alibi")
    query, _, padding = inputs(5, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            attention._forward_flex(query, query, query, padding, True)
