"""`SoftmaxAttention`'s blocked CPU path with a learned additive `score_mod`: the bias
needs a gradient, so each block runs on the core's `biased_attention` (a fused backward)
instead of SDPA's unfused kernel; the suite's gradient and masking checks hold."""

from __future__ import annotations

import math

import pytest
import torch

import playground
from playground.mods.dispatch import CpuPath
from playground.mods.scheduler import ModScheduler
from playground.testing import check_attention
from playground.testing.checks import (
    check_bfloat16,
    check_causality,
    check_fast_matches_reference,
    check_float64,
    check_fully_masked_rows_are_zero,
    check_gradients_reach_every_parameter,
    check_padding_invariance,
)


class KeyTableAttention(playground.SoftmaxAttention):
    """A learned bias per head and key position (mod 8): additive, not relative."""

    name, summary, paper = "key_table", "a learned bias per head and key slot", "-"
    additive_score_mod = True

    def __init__(self, d_model=512, num_heads=8, **options):
        super().__init__(d_model, num_heads, **options)
        self.table = torch.nn.Parameter(torch.randn(num_heads, 8))

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return score + self.table[h, kv_idx % 8]


class WindowedKeyTableAttention(KeyTableAttention):
    """The same bias inside a window: blocks see partial spans."""

    name = "windowed_key_table"

    def mask_mod(self, b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() < 5


CHECKS = [
    check_fast_matches_reference,
    check_causality,
    check_padding_invariance,
    check_fully_masked_rows_are_zero,
    check_gradients_reach_every_parameter,
    check_float64,
    check_bfloat16,
]


def test_a_learned_additive_bias_passes_the_gradient_and_masking_checks():
    report = check_attention(KeyTableAttention, checks=CHECKS)
    assert report.ok, report.failures


def test_a_learned_bias_inside_a_window_matches_the_reference():
    checks = [check_fast_matches_reference, check_float64]
    report = check_attention(WindowedKeyTableAttention, checks=checks)
    assert report.ok, report.failures


def test_the_fast_path_uses_the_fused_backward(monkeypatch):
    """Not SDPA's unfused kernel: the bias's gradient comes from `biased_attention` (in
    float64: in float32 the native kernels evaluate the bias as a mod program, and give
    its parameters their gradients there; tests/mods/test_program.py)."""
    import playground.mods.scheduler as module

    calls = []
    original = module.biased_attention
    monkeypatch.setattr(
        module, "biased_attention", lambda *a, **k: calls.append(1) or original(*a, **k)
    )
    attention = KeyTableAttention(d_model=16, num_heads=2, block_size=4).double().train()
    attention(torch.randn(2, 9, 16, dtype=torch.float64)).output.sum().backward()
    assert calls and attention.table.grad is not None


def test_a_dense_mask_is_recomputed_and_a_window_is_kept():
    """Training keeps every block's mask only when all of them together are no larger
    than q, k and v: a window's are, a dense causal mask_mod's are not (its memory would
    be quadratic)."""
    from playground.run.instruments import peak_memory_bytes
    from playground.run.measurer import Workload as workload

    class DenseCausal(playground.SoftmaxAttention):
        name, summary, paper = "dense_causal", "causal by mask_mod", "test"

        def mask_mod(self, b, h, q_idx, kv_idx):
            return q_idx >= kv_idx

    def peak(n: int) -> int:
        module = DenseCausal(d_model=64, num_heads=8, block_size=64)
        return peak_memory_bytes(workload(module, torch.randn(1, n, 64), "forward_backward"))

    assert peak(2048) < 2.3 * peak(1024)  # linear (1.9); keeping every mask gave 2.8
    window = playground.build("sliding_window", 64, 8, window=64, block_size=64)
    scheduler = ModScheduler(
        score_mod=None, mask_mod=window._mask, path=CpuPath.MASKED_BLOCKS, scale=1.0, block_size=64
    )
    spans = scheduler.key_spans(1, 8, 1024, 1024, False, torch.device("cpu"))
    kept = scheduler.mask_bytes(spans, 1, 8, None, torch.device("cpu"))
    assert kept <= 3 * 1024 * 64 * 4  # no larger than q, k and v: kept, not recomputed


# --- mask_mod rules the fast path must follow exactly (issue 30 §4) ---------------------
def fast_and_reference(cls, **options):
    """The class built twice, fast and reference, with the same weights, in float64."""
    torch.manual_seed(0)
    fast = cls(16, 2, impl="fast", **options).double()
    reference = cls(16, 2, impl="reference", **options).double()
    reference.load_state_dict(fast.state_dict())
    return fast, reference


def outputs_and_gradients(module, query, key=None, train=True, **call):
    """The output and, in training, the gradients of the inputs and of every parameter."""
    inputs = [t.detach().clone().requires_grad_(train) for t in (query, key) if t is not None]
    module.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(train):
        output = module(*inputs, **call).output
    if not train:
        return [output]
    (
        output * torch.linspace(-1, 1, output.numel(), dtype=output.dtype).view_as(output)
    ).sum().backward()
    return [output, *(t.grad for t in inputs), *(p.grad for p in module.parameters())]


def assert_paths_agree(fast, reference, *inputs, train=True, **call):
    got = outputs_and_gradients(fast, *inputs, train=train, **call)
    expected = outputs_and_gradients(reference, *inputs, train=train, **call)
    for index, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert (a is None) == (b is None), index
        if a is not None:
            assert not a.isnan().any(), f"NaN in result {index}"
            torch.testing.assert_close(a, b, msg=lambda m, i=index: f"result {i}: {m}")


class DocumentMask(playground.SoftmaxAttention):
    """FlexAttention's document mask: document ids set on the module before each batch."""

    name, summary, paper = "document_mask", "attend within one's document", "test"

    def mask_mod(self, b, h, q_idx, kv_idx):
        return self.document[b, q_idx] == self.document[b, kv_idx]


class ScheduledWindow(playground.SoftmaxAttention):
    """A window that a training schedule widens through a module attribute."""

    name, summary, paper = "scheduled_window", "a window that grows", "test"
    width = 4

    def mask_mod(self, b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() < self.width


def documents(*lengths_per_row):
    """(B, N) document ids from each row's document lengths."""
    return torch.stack(
        [
            torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)])
            for lengths in lengths_per_row
        ]
    )


@pytest.mark.parametrize("train", [True, False], ids=["train", "inference"])
def test_a_document_mask_set_before_each_batch_is_read_on_every_call(train):
    """The key spans are found again on every call: kept from the first batch, they
    dropped keys the second batch's documents allow (off by 0.07 before)."""
    fast, reference = fast_and_reference(DocumentMask, block_size=8)
    tokens = torch.randn(2, 40, 16, dtype=torch.float64)
    for lengths in [((10, 30), (35, 5)), ((30, 10), (3, 37))]:
        fast.document = reference.document = documents(*lengths)
        assert_paths_agree(fast, reference, tokens, train=train)


@pytest.mark.parametrize("train", [True, False], ids=["train", "inference"])
def test_a_window_widened_between_calls_is_read_on_every_call(train):
    fast, reference = fast_and_reference(ScheduledWindow, block_size=8)
    tokens = torch.randn(2, 40, 16, dtype=torch.float64)
    for width in (4, 40, 2):
        fast.width = reference.width = width
        assert_paths_agree(fast, reference, tokens, train=train, is_causal=width == 2)


def mask_class(rule):
    return type(
        f"Mask_{rule.__name__}",
        (playground.SoftmaxAttention,),
        {"name": rule.__name__, "summary": "a mask rule", "paper": "test", "mask_mod": rule},
    )


def per_query(self, b, h, q_idx, kv_idx):  # ignores kv_idx: (1, 1, Nq, 1)
    return q_idx % 3 != 0


def per_head(self, b, h, q_idx, kv_idx):  # (1, H, 1, 1)
    return h != 1


def per_head_window(self, b, h, q_idx, kv_idx):  # (1, H, Nq, Nk): a window per head
    return (q_idx - kv_idx).abs() < 3 * (h + 1)


def per_batch_prefix(self, b, h, q_idx, kv_idx):  # (B, 1, 1, Nk)
    return kv_idx < 5 * (b + 1)


def nothing(self, b, h, q_idx, kv_idx):  # every query sees nothing: zeros, as the reference
    return q_idx < -1


@pytest.mark.parametrize("rule", [per_query, per_head, per_head_window, per_batch_prefix, nothing])
@pytest.mark.parametrize("n_q, n_k", [(32, 16), (30, 17), (20, 20)])
@pytest.mark.parametrize("train", [True, False], ids=["train", "inference"])
def test_a_mask_of_any_broadcast_shape_matches_the_reference(rule, n_q, n_k, train):
    """A rule that ignores kv_idx (or q_idx) was reshaped to (−1, Nk): it raised, or
    where the sizes divided it found the wrong spans; a per-head rule crashed in
    inference, whose mask buffer had no head dimension."""
    fast, reference = fast_and_reference(mask_class(rule), block_size=8)
    query = torch.randn(2, n_q, 16, dtype=torch.float64)
    key = torch.randn(2, n_k, 16, dtype=torch.float64)
    assert_paths_agree(fast, reference, query, key, train=train)
    if n_q == n_k:
        assert_paths_agree(fast, reference, query, train=train, is_causal=True)


# --- scores of −inf: FlexAttention's answer, a zero output ------------------------------
class HiddenRows(playground.SoftmaxAttention):
    """Queries 2, 7, 12, … see no finite score in any head; 3, 8, … none in head 0."""

    name, summary, paper = "hidden_rows", "-inf rows from score_mod", "test"

    def score_mod(self, score, b, h, q_idx, kv_idx):
        hidden = (q_idx % 5 == 2) | ((q_idx % 5 == 3) & (h == 0))
        return torch.where(hidden, -math.inf, score * 0.5)


class HiddenRowsAdditive(HiddenRows):
    name = "hidden_rows_additive"
    additive_score_mod = True

    def score_mod(self, score, b, h, q_idx, kv_idx):
        hidden = (q_idx % 5 == 2) | ((q_idx % 5 == 3) & (h == 0))
        return score + torch.where(hidden, -math.inf, 0.1 * kv_idx)


class RelativeWindowByScore(playground.SoftmaxAttention):
    """A window written as a relative score_mod: in cross attention with more queries
    than keys, the last queries have no key within reach."""

    name, summary, paper = "relative_window_by_score", "-inf beyond distance 3", "test"
    relative_score_mod = True

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return score + torch.where((kv_idx - q_idx).abs() > 3, -math.inf, 0.0)


@pytest.mark.parametrize("cls", [HiddenRows, HiddenRowsAdditive], ids=lambda c: c.name)
@pytest.mark.parametrize("train", [True, False], ids=["train", "inference"])
def test_a_row_of_minus_infinity_scores_outputs_zero_on_every_path(cls, train):
    """As FlexAttention gives: zero, not softmax's NaN, with zero gradients; a query
    whose every head has no finite score outputs exactly zero (no out_proj bias)."""
    fast, reference = fast_and_reference(cls, block_size=8)
    tokens = torch.randn(2, 20, 16, dtype=torch.float64)
    assert_paths_agree(fast, reference, tokens, train=train)
    assert_paths_agree(fast, reference, tokens, train=train, is_causal=True)
    for module in (fast, reference):
        output = module(tokens).output
        assert (output[:, 2::5] == 0).all() and (output[:, 3::5] != 0).any(dim=-1).all()


@pytest.mark.parametrize("train", [True, False], ids=["train", "inference"])
def test_a_relative_score_mod_that_leaves_queries_no_key_outputs_zero_for_them(train):
    fast, reference = fast_and_reference(RelativeWindowByScore, block_size=8)
    query = torch.randn(2, 20, 16, dtype=torch.float64)
    key = torch.randn(2, 6, 16, dtype=torch.float64)
    assert_paths_agree(fast, reference, query, key, train=train)
    for module in (fast, reference):
        output = module(query, key).output
        assert (output[:, 9:] == 0).all() and (output[:, :9] != 0).all()


# --- a hook that returns junk is named ----------------------------------------------------
def hook_class(hook, method):
    return type(
        f"Junk_{method.__name__}",
        (playground.SoftmaxAttention,),
        {"name": method.__name__, "summary": "junk", "paper": "test", hook: method},
    )


def score_as_float(self, score, b, h, q_idx, kv_idx):
    return 0.5


def score_as_int(self, score, b, h, q_idx, kv_idx):
    return q_idx - kv_idx


def score_cut_short(self, score, b, h, q_idx, kv_idx):
    return score[..., :-1]


def mask_as_int(self, b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx).int()


def mask_as_python_bool(self, b, h, q_idx, kv_idx):
    return True


def mask_too_wide(self, b, h, q_idx, kv_idx):
    return torch.ones(1, 1, 1, 99, dtype=torch.bool)


def project_without_splitting_heads(self, query, key, value):
    q, k, v = playground.SoftmaxAttention.project(self, query, key, value)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, N, H, d)


def project_two(self, query, key, value):
    return playground.SoftmaxAttention.project(self, query, key, value)[:2]


def context_as_query(self, context, query):
    return query


JUNK = [
    ("score_mod", score_as_float, "returned float 0.5"),
    ("score_mod", score_as_int, "returned a tensor of dtype int64"),
    ("score_mod", score_cut_short, "broadcasts to its arguments' shape"),
    ("mask_mod", mask_as_int, "returned a tensor of dtype int32"),
    ("mask_mod", mask_as_python_bool, "returned bool True"),
    ("mask_mod", mask_too_wide, "broadcasts to the index tensors' shape"),
    ("project", project_without_splitting_heads, "q (2, 5, 2, 8)"),
    ("project", project_two, "three tensors"),
    ("context_mod", context_as_query, "(B, H, Nq, d) = (2, 2, 5, 8)"),
]


@pytest.mark.parametrize(
    "hook, method, problem", JUNK, ids=[method.__name__ for _, method, _ in JUNK]
)
@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_a_hook_that_returns_junk_is_named(hook, method, problem, impl):
    """Raw torch errors from deep inside a path (or, for a context_mod returning the
    query, a silently wrong output) became a HookError naming the class and the hook."""
    module = hook_class(hook, method)(16, 2, impl=impl, block_size=2)
    with pytest.raises(playground.HookError) as error:
        module(torch.randn(2, 5, 16), is_causal=True)
    message = str(error.value)
    assert f"Junk_{method.__name__}.{hook}(" in message and problem in message, message


def test_a_constant_score_is_one_score_for_every_pair():
    """A 0-dimensional score, as FlexAttention allows: uniform weights on every path."""

    def constant(self, score, b, h, q_idx, kv_idx):
        return torch.zeros((), dtype=score.dtype)

    fast, reference = fast_and_reference(hook_class("score_mod", constant), block_size=4)
    assert_paths_agree(fast, reference, torch.randn(2, 9, 16, dtype=torch.float64))


def test_the_suite_passes_a_score_mod_that_hides_a_whole_row():
    """The suite called this "NaN on ordinary inputs"; the row now outputs zero."""
    from playground.testing.checks import check_output_shape_and_dtype

    class FirstQueryHidden(playground.SoftmaxAttention):
        name, summary, paper = "first_query_hidden", "query 0 has no finite score", "test"

        def score_mod(self, score, b, h, q_idx, kv_idx):
            return torch.where(q_idx == 0, -math.inf, score)

    checks = [check_output_shape_and_dtype, check_fast_matches_reference]
    report = check_attention(FirstQueryHidden, checks=checks)
    assert report.ok, report.failures


class SoftCapSeesNothing(playground.SoftmaxAttention):
    """A score_mod that is not additive (tanh), and a mask_mod that hides every key."""

    name, summary, paper = "soft_cap_sees_nothing", "no query sees a key", "test"

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return 5 * torch.tanh(score / 5)

    def mask_mod(self, b, h, q_idx, kv_idx):
        return q_idx < -1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("block_size", [4, 64])
def test_no_key_visible_anywhere_gives_the_references_zero_gradients(dtype, block_size):
    """Issue 42: on the non-additive path, a call in which no query sees any key built no
    graph, so torch.autograd.grad(out, x) raised where the reference returns zeros."""
    module = SoftCapSeesNothing(16, 2, block_size=block_size).to(dtype)
    x = torch.randn(2, 10, 16, dtype=dtype, requires_grad=True)
    inputs = (x, *module.parameters())
    fast = torch.autograd.grad(module(x).output.sum(), inputs)
    reference = module.forward_reference(x, x, x, None, False, False).output
    expected = torch.autograd.grad(reference.sum(), inputs)
    for got, want in zip(fast, expected, strict=True):
        assert torch.equal(got, want) and not bool(want.any())
