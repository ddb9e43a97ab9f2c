"""The native fused backwards (playground.kernels.native) against the dense float64
references (playground.kernels.reference) and against the Python backwards they replace,
in float32: for relative biases, gradients of q, k, v and the bias over lengths past its
query tile, padding, causality, cross-attention and batches; for bands, gradients of
queries, keys, values and prefix keys over the band shapes of tests/kernels/test_kernels.py. They
are optional: without a compiler these tests skip, and the Python paths
(tests/kernels/test_kernels.py) are what runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings

import pytest
import torch

from playground.kernels import native
from playground.kernels.banded import banded_attention
from playground.kernels.biased import hankel_biased_attention
from playground.kernels.blocked import blocked_attention
from playground.kernels.reference import (
    dense_banded,
    dense_blocked,
    dense_hankel_biased,
    dense_relative,
)
from playground.kernels.relative import relative_bias_attention
from tests.kernels.test_kernels import CASES, H, blocked_case

needs_native = pytest.mark.skipif(
    not native.build_state().available, reason=f"native kernels: {native.build_state().reason}"
)


def _inputs(batch: int, n_q: int, n_k: int, seed: int, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)

    def tensor(*shape):
        return torch.randn(*shape, generator=generator, dtype=dtype).requires_grad_(True)

    q, k, v = tensor(batch, H, n_q, 8), tensor(batch, H, n_k, 8), tensor(batch, H, n_k, 8)
    return q, k, v, tensor(H, n_q + n_k - 1)


def _padding(batch: int, n_k: int) -> torch.Tensor:
    mask = torch.ones(2, n_k, dtype=torch.bool)
    mask[0, n_k // 2 :] = False
    mask[1, :3] = False  # left padding: under causality the first queries see nothing
    return mask[:batch]


@needs_native
@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize(("n_q", "n_k", "block"), [(150, 150, 64), (70, 130, 32), (150, 37, 256)])
def test_native_backward_matches_the_dense_reference(batch, is_causal, padded, n_q, n_k, block):
    """float32 native gradients within 1e-5 of the float64 dense ones (tiles of 64 queries:
    150 ends in a partial tile; a causal tile skips its later keys)."""
    q, k, v, relative_bias = _inputs(batch, n_q, n_k, seed=n_q + n_k)
    mask = _padding(batch, n_k) if padded else None
    context = relative_bias_attention(q, k, v, relative_bias, mask, is_causal, 0.35, block)
    assert type(context.grad_fn).__name__ == "_NativeRelativeBiasBackward"
    inputs = (q, k, v, relative_bias)
    doubled = [t.detach().double().requires_grad_(True) for t in inputs]
    expected = dense_relative(*doubled[:3], doubled[3], mask, is_causal, 0.35)
    seen = expected.isfinite().all(dim=-1, keepdim=True)  # rows that see a key
    weights = torch.randn(expected.shape, generator=torch.Generator().manual_seed(1))
    ours = torch.autograd.grad((context * weights * seen).sum(), inputs)
    theirs = torch.autograd.grad((expected.nan_to_num() * weights.double() * seen).sum(), doubled)
    for name, mine, reference in zip(["q", "k", "v", "bias"], ours, theirs, strict=True):
        error = (mine.double() - reference).abs().max().item()
        assert error < 1e-5 * max(1.0, reference.abs().max().item()), (name, error)


@needs_native
def test_native_backward_equals_the_python_backward():
    """The same gradients as the Python backward it replaces (PLAYGROUND_NATIVE=0), to
    float32 rounding, in bfloat16's float32 accumulation too."""
    results = {}
    for path in ("native", "python"):
        q, k, v, relative_bias = _inputs(2, 96, 96, seed=5)
        loaded = native._module
        if path == "python":
            native._module = None  # what load() returns when the build is unavailable
        try:
            context = relative_bias_attention(q, k, v, relative_bias, None, True, 0.35, 40)
            context.square().sum().backward()
        finally:
            native._module = loaded
        results[path] = [t.grad for t in (q, k, v, relative_bias)]
    for mine, python in zip(results["native"], results["python"], strict=True):
        torch.testing.assert_close(mine, python, atol=2e-5, rtol=1e-5)


@needs_native
def test_native_backward_catches_a_wrong_bias_gradient():
    """The comparison can fail: the bias of j − i is not the bias of i − j."""
    q, k, v, relative_bias = _inputs(1, 80, 80, seed=2)
    context = relative_bias_attention(q, k, v, relative_bias, None, False, 0.35, 64)
    (grad,) = torch.autograd.grad(context.square().sum(), relative_bias)
    doubled = relative_bias.detach().double().flip(-1).requires_grad_(True)
    mirrored = dense_relative(q.double(), k.double(), v.double(), doubled, None, False, 0.35)
    (wrong,) = torch.autograd.grad(mirrored.square().sum(), doubled)
    assert (grad.double() - wrong.flip(-1)).abs().max() > 1e-3


def test_native_kernels_can_be_switched_off():
    """PLAYGROUND_NATIVE=0: nothing is built, the build state says why, training still works."""
    code = (
        "import torch; from playground.kernels import native; "
        "from playground.kernels import relative_bias_attention as r; "
        "q = torch.randn(1, 2, 9, 4, requires_grad=True); "
        "b = torch.randn(2, 17, requires_grad=True); "
        "c = r(q, q, q, b, None, False, 0.5, 4); c.sum().backward(); "
        "state = native.build_state(); "
        "print(state.available, state.reason, type(c.grad_fn).__name__)"
    )
    environment = {**os.environ, native.DISABLE_VARIABLE: "0"}
    shown = subprocess.run(
        [sys.executable, "-c", code], env=environment, capture_output=True, text=True, check=True
    ).stdout
    assert shown.split()[0] == "False" and "PLAYGROUND_NATIVE=0" in shown, shown
    assert "_NativeRelativeBias" not in shown


@needs_native
@pytest.mark.parametrize("padded", [False, True])
def test_native_per_block_backward_matches_the_dense_reference(padded):
    """`hankel_biased_attention` called on its own (one block) takes the native backward
    too: its gradients against the dense Hankel bias in float64."""
    generator = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, H, 70, 8, generator=generator) for _ in "qkv")
    diagonals = torch.randn(H, 139, generator=generator)
    keep = torch.ones(2, 1, 1, 70, dtype=torch.bool)
    keep[1, ..., 50:] = not padded
    inputs = [t.requires_grad_(True) for t in (q, k, v, diagonals)]
    context = hankel_biased_attention(*inputs[:3], inputs[3], 0.35, keep if padded else None)
    doubled = [t.detach().double().requires_grad_(True) for t in inputs]
    expected = dense_hankel_biased(*doubled, 0.35, keep)
    ours = torch.autograd.grad(context.square().sum(), inputs)
    theirs = torch.autograd.grad(expected.square().sum(), doubled)
    for mine, reference in zip(ours, theirs, strict=True):
        assert (mine.double() - reference).abs().max() < 1e-5 * max(1.0, reference.abs().max())


def test_a_failed_build_warns_once_and_leaves_the_python_path(monkeypatch):
    """A machine without a compiler: one warning that names the reason and the fix, then
    the Python backward, with the build state saying why."""

    def no_compiler():
        raise RuntimeError("Error building extension: c++: not found")

    monkeypatch.setattr(native, "_build", no_compiler)
    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(native, "_build_state", None)
    monkeypatch.delenv(native.DISABLE_VARIABLE, raising=False)
    with pytest.warns(RuntimeWarning, match="c\\+\\+: not found.*PLAYGROUND_NATIVE=0"):
        assert native.load() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.load() is None  # the answer is kept: no second build, no second warning
    assert not native.build_state().available and "c++: not found" in native.build_state().reason
    q, k, v, relative_bias = _inputs(1, 9, 9, seed=0)
    context = relative_bias_attention(q, k, v, relative_bias, None, False, 0.5, 4)
    context.sum().backward()
    assert type(context.grad_fn).__name__ != "_NativeRelativeBiasBackward"
    assert relative_bias.grad is not None


class _Spy:
    """A stand-in for the native module that counts the blocked kernels' calls, optionally
    handing them broken masks."""

    def __init__(self, module, break_mask: bool = False):
        self.module, self.break_mask = module, break_mask
        self.forwards = self.backwards = 0

    def _masks(self, masks):
        if self.break_mask:  # a kernel that ignores the band and the padding
            return [torch.zeros_like(mask) for mask in masks]
        return masks

    def blocked_forward(self, *arguments):
        self.forwards += 1
        *head, masks, scale = arguments
        return self.module.blocked_forward(*head, self._masks(masks), scale)

    def blocked_backward(self, *arguments):
        self.backwards += 1
        *head, masks, scale = arguments
        return self.module.blocked_backward(*head, self._masks(masks), scale)


def _assert_within_1e5(ours, theirs) -> None:
    """float32 results within 1e-5 of float64 ones, relative where they exceed 1."""
    for mine, reference in zip(ours, theirs, strict=True):
        error = (mine.double() - reference).abs().max().item()
        assert error < 1e-5 * max(1.0, reference.abs().max().item()), error


def _assert_native_equals_python(results_of) -> None:
    """results_of() the same, to float32 rounding, on the native and the Python paths."""
    results = {}
    for path in ("native", "python"):
        loaded = native._module
        if path == "python":
            native._module = None  # what load() returns when the build is unavailable
        try:
            results[path] = results_of()
        finally:
            native._module = loaded
    for mine, python in zip(results["native"], results["python"], strict=True):
        torch.testing.assert_close(mine, python, atol=2e-6, rtol=1e-5)


def _banded_gradients(case, seed: int, width: int = 8):
    """float32 outputs (of the rows that see a key) and gradients of banded_attention on
    `case`, and float64 dense ones."""
    n, before, after, prefix, causal_prefix, block = case
    generator = torch.Generator().manual_seed(seed)
    batch = 2

    def tensor(*shape):
        return torch.randn(*shape, generator=generator, requires_grad=True)

    queries, keys_values = tensor(batch, n, width), tensor(batch, n, 2 * width)
    key_ok = torch.rand(batch, n, generator=generator) > 0.3
    key_ok[1, : before + after + 2] = False  # rows that see nothing
    prefix_kv = tensor(batch, prefix, 2 * width) if prefix else None
    prefix_ok = (torch.rand(batch, prefix, generator=generator) > 0.3) if prefix else None
    positions = torch.randint(0, n, (batch, prefix), generator=generator) if causal_prefix else None
    inputs = [t for t in (queries, keys_values, prefix_kv) if t is not None]
    context = banded_attention(
        queries, keys_values, key_ok, H, before, after, prefix_kv, prefix_ok, positions, block
    )
    doubled = [t.detach().double().requires_grad_(True) for t in inputs]
    expected, seen = dense_banded(
        doubled[0],
        doubled[1],
        key_ok,
        H,
        before,
        after,
        doubled[2] if prefix else None,
        prefix_ok,
        positions,
    )
    weights = torch.randn(expected.shape, generator=generator, dtype=torch.float64)
    ours = torch.autograd.grad((context * weights.float())[seen].sum(), inputs)
    theirs = torch.autograd.grad((expected * weights)[seen].sum(), doubled)
    return [context[seen].detach(), *ours], [expected[seen].detach(), *theirs]


@needs_native
@pytest.mark.parametrize("case", [*CASES, (300, 64, 64, 2, True, 64), (257, 100, 0, 0, False, 64)])
def test_native_banded_kernels_match_the_dense_reference(case, monkeypatch):
    """float32 native outputs and gradients of queries, keys, values and prefix keys
    within 1e-5 of the float64 dense band's, with the native kernels seen to run."""
    spy = _Spy(native.load())
    monkeypatch.setattr(native, "_module", spy)
    ours, theirs = _banded_gradients(case, seed=sum(case[:3]), width=8 if case[0] < 100 else 64)
    assert spy.forwards == spy.backwards == 1
    _assert_within_1e5(ours, theirs)


@needs_native
def test_native_banded_backward_equals_the_python_backward():
    """The same gradients as the Python backward it replaces (PLAYGROUND_NATIVE=0)."""
    _assert_native_equals_python(
        lambda: _banded_gradients((200, 40, 30, 2, True, 32), seed=3, width=32)[0]
    )


@needs_native
def test_native_banded_backward_catches_a_kernel_that_ignores_the_mask(monkeypatch):
    """The comparison can fail: the same kernel, handed no mask, gives other gradients."""
    monkeypatch.setattr(native, "_module", _Spy(native.load(), break_mask=True))
    ours, theirs = _banded_gradients(CASES[2], seed=1)
    errors = [(mine.double() - ref).abs().max() for mine, ref in zip(ours, theirs, strict=True)]
    assert max(errors) > 1e-2


def _blocked_gradients(seed: int = 0):
    """float32 outputs and gradients of blocked_attention, and float64 dense ones."""
    (q, k, v), blocks, masks = blocked_case(torch.float32, seed, n=40, d=16)
    blocks[4] = (21, 23, 20, 40)  # a wider last span, with a per-batch-and-head bias
    masks[4] = torch.randn(2, H, 2, 20, generator=torch.Generator().manual_seed(seed))
    context = blocked_attention(q, k, v, blocks, masks, 0.3)
    doubled = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    expected = dense_blocked(*doubled, blocks, masks, 0.3)
    weights = torch.randn(expected.shape, dtype=torch.float64, generator=torch.Generator())
    ours = torch.autograd.grad((context * weights.float()).sum(), (q, k, v))
    theirs = torch.autograd.grad((expected * weights).sum(), doubled)
    return [context.detach(), *ours], [expected.detach(), *theirs]


@needs_native
def test_native_blocked_kernels_match_the_dense_reference(monkeypatch):
    """Overlapping spans, bool, per-head additive and per-batch-and-head masks, no mask,
    a block without keys and queries in no block: outputs and gradients within 1e-5 of
    float64."""
    spy = _Spy(native.load())
    monkeypatch.setattr(native, "_module", spy)
    ours, theirs = _blocked_gradients()
    assert spy.forwards == spy.backwards == 1
    _assert_within_1e5(ours, theirs)


@needs_native
def test_native_blocked_backward_equals_the_python_backward():
    _assert_native_equals_python(lambda: _blocked_gradients(seed=2)[0])


@needs_native
def test_native_blocked_backward_catches_a_kernel_that_ignores_the_masks(monkeypatch):
    monkeypatch.setattr(native, "_module", _Spy(native.load(), break_mask=True))
    ours, theirs = _blocked_gradients()
    errors = [(mine.double() - ref).abs().max() for mine, ref in zip(ours, theirs, strict=True)]
    assert max(errors) > 1e-2


def _paths():
    """Both backwards of blocked_attention: native (when built) and Python."""
    return [pytest.param("native", marks=needs_native), "python"]


def _dense_blocked_gradients(q, k, v, blocks, masks, scale, weights):
    """float64 gradients of the dense answer of blocked_attention (masks: None or bool)."""
    doubled = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    expected = dense_blocked(*doubled, blocks, masks, scale)
    return torch.autograd.grad((expected * weights.double()).sum(), doubled)


@pytest.mark.parametrize("path", _paths())
@pytest.mark.parametrize(
    "layout", ["one query, grad_out read through .mT", "one key from a (B, H, d, 1) cache"]
)
def test_blocked_backward_reads_single_rows_whatever_their_stride(path, layout, monkeypatch):
    """A single row's stride may be below d (BLAS would refuse it as a leading
    dimension and leave the gradients unwritten)."""
    if path == "python":
        monkeypatch.setattr(native, "_module", None)
    generator = torch.Generator().manual_seed(0)
    n_q, n_k = (1, 6) if layout.startswith("one query") else (6, 1)
    q = torch.randn(2, H, n_q, 8, generator=generator, requires_grad=True)
    if layout.startswith("one key"):
        cache_k = torch.randn(2, H, 8, 1, generator=generator, requires_grad=True)
        cache_v = torch.randn(2, H, 8, 1, generator=generator, requires_grad=True)
        k, v = cache_k.mT, cache_v.mT  # (B, H, 1, d), row stride 1
    else:
        k = torch.randn(2, H, n_k, 8, generator=generator, requires_grad=True)
        v = torch.randn(2, H, n_k, 8, generator=generator, requires_grad=True)
    blocks, masks = [(0, n_q, 0, n_k)], [None]
    context = blocked_attention(q, k, v, blocks, masks, 0.3)
    weights = torch.randn(2, H, 8, n_q, generator=generator)
    ours = torch.autograd.grad((context.mT * weights).sum(), (q, k, v))  # grad_out via .mT
    theirs = _dense_blocked_gradients(q, k, v, blocks, masks, 0.3, weights.mT)
    for mine, reference in zip(ours, theirs, strict=True):
        assert (mine.double() - reference).abs().max() < 1e-5


@pytest.mark.parametrize("path", _paths())
def test_blocked_attention_takes_columns_and_broadcast_masks(path, monkeypatch):
    """Column-major q, k and v (the flash kernel reads rows as unit-stride: they are
    made so), and masks that only broadcast: key padding (B, 1, 1, span), a 2-D one, a
    transposed view."""
    if path == "python":
        monkeypatch.setattr(native, "_module", None)
    generator = torch.Generator().manual_seed(3)

    def column_major(*shape):
        return torch.randn(*shape[:2], shape[3], shape[2], generator=generator).mT.requires_grad_()

    q, k, v = column_major(2, H, 12, 8), column_major(2, H, 12, 8), column_major(2, H, 12, 8)
    padding = torch.rand(2, 1, 1, 7, generator=generator) > 0.4
    padding[..., 0] = True
    two_d = torch.rand(4, 7, generator=generator) > 0.3
    two_d[:, 0] = True
    transposed = (torch.rand(1, 1, 7, 4, generator=generator) > 0.3).mT
    transposed[..., 0] = True
    blocks = [(0, 4, 0, 7), (4, 8, 3, 10), (8, 12, 5, 12)]
    masks = [padding, two_d, transposed]
    context = blocked_attention(q, k, v, blocks, masks, 0.3)
    weights = torch.randn(context.shape, generator=generator)
    ours = torch.autograd.grad((context * weights).sum(), (q, k, v))
    expanded = [m.expand(2, H, 4, 7) for m in masks]
    theirs = _dense_blocked_gradients(q, k, v, blocks, expanded, 0.3, weights)
    for mine, reference in zip(ours, theirs, strict=True):
        assert (mine.double() - reference).abs().max() < 1e-5


def test_blocked_attention_refuses_bad_blocks_before_it_runs():
    q = torch.randn(1, H, 8, 4, requires_grad=True)
    for blocks, problem in (
        ([(5, 3, 0, 4)], "lies outside"),
        ([(0, 4, 0, 40)], "lies outside"),
        ([(0, 6, 0, 4), (4, 8, 4, 8)], "shares queries"),
    ):
        with pytest.raises(ValueError, match=problem):
            blocked_attention(q, q, q, blocks, [None] * len(blocks), 0.5)
    with pytest.raises(ValueError, match="one per block"):
        blocked_attention(q, q, q, [(0, 8, 0, 8)], [], 0.5)


def test_blocked_attention_names_bad_shapes():
    q = torch.randn(1, H, 8, 4)
    for k, problem in (
        (torch.randn(1, H, 8, 5), "alike"),  # another head width
        (torch.randn(2, H, 8, 4), "alike"),  # another batch
        (torch.randn(H, 8, 4), "alike"),  # no batch dimension
        (torch.randn(1, H + 1, 8, 4), "heads"),
    ):
        with pytest.raises(ValueError, match=problem):
            blocked_attention(q, k, k, [(0, 8, 0, 8)], [None], 0.5)
    with pytest.raises(ValueError, match=r"broadcast to \(B, H, 8, 8\)"):
        blocked_attention(q, q, q, [(0, 8, 0, 8)], [torch.ones(8, 7, dtype=torch.bool)], 0.5)


@pytest.mark.parametrize("shape", [(2, 0, 10, 4), (0, H, 10, 4), (2, H, 10, 0)])
def test_blocked_attention_of_nothing_is_empty(shape):
    """No heads, batch or width: an empty context with a graph (the flash kernel would
    divide by zero)."""
    q = torch.randn(*shape, requires_grad=True)
    context = blocked_attention(q, q, q, [(0, 10, 0, 10)], [None], 0.5)
    assert context.shape == shape
    context.sum().backward()
    assert q.grad.shape == shape


@pytest.mark.parametrize("path", _paths())
def test_a_nan_score_gives_nan_not_a_dropped_key(path, monkeypatch):
    """A NaN in a key (or +inf scores) makes the rows that see it NaN, forward and
    backward, as the flash kernel does; the rows that do not see it stay finite."""
    if path == "python":
        monkeypatch.setattr(native, "_module", None)
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, H, 8, 4, generator=generator) for _ in "qkv")
    k[:, :, 5] = float("nan")
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    blocks = [(0, 4, 0, 4), (4, 8, 2, 8)]  # only the second block sees key 5
    context = blocked_attention(q, k, v, blocks, [None, None], 0.5)
    assert context[:, :, :4].isfinite().all() and context[:, :, 4:].isnan().all()
    context.sum().backward()
    assert q.grad[:, :, :4].isfinite().all() and q.grad[:, :, 4:].isnan().all()


@pytest.fixture
def fresh_native(monkeypatch):
    """`playground.kernels.native` as a new process finds it: nothing loaded or decided yet."""
    monkeypatch.setattr(native, "_module", None)
    monkeypatch.setattr(native, "_build_state", None)
    monkeypatch.delenv(native.DISABLE_VARIABLE, raising=False)


@pytest.mark.parametrize("value", ["0", "false", "No", "OFF", " off "])
def test_every_off_word_switches_the_native_kernels_off(value, fresh_native, monkeypatch):
    def built():
        raise AssertionError("built although PLAYGROUND_NATIVE is off")

    monkeypatch.setattr(native, "_build", built)
    monkeypatch.setenv(native.DISABLE_VARIABLE, value)
    assert native.load() is None
    assert native.build_state().reason == f"disabled by PLAYGROUND_NATIVE={value}"


def test_an_unknown_native_setting_is_refused_naming_the_words(fresh_native, monkeypatch):
    """A typo is not guessed at: neither built nor silently left on."""
    from playground.errors import ConfigError

    monkeypatch.setattr(native, "_build", lambda: pytest.fail("built on a typo"))
    monkeypatch.setenv(native.DISABLE_VARIABLE, "flase")
    with pytest.raises(ConfigError, match=r"PLAYGROUND_NATIVE='flase'.*0, false, no, off"):
        native.load()
    for value in ("1", "true", "Yes", "on", ""):
        monkeypatch.setenv(native.DISABLE_VARIABLE, value)
        assert native.enabled(), value


def test_the_build_directory_depends_on_the_torch_installation(monkeypatch, tmp_path):
    """Two environments (another virtual environment, another torch) build apart: each
    build.ninja holds its own environment's absolute paths."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    here = native.build_directory()
    assert here.parent == tmp_path
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "another-venv"))
    elsewhere = native.build_directory()
    monkeypatch.undo()
    monkeypatch.setattr(torch, "__version__", "0.0.0+other")
    other_torch = native.build_directory()
    assert len({here.name, elsewhere.name, other_torch.name}) == 3


def test_a_lock_left_by_a_killed_build_warns_naming_it_instead_of_hanging(
    fresh_native, monkeypatch, tmp_path
):
    """torch's `lock` file without a build running: no wait on it (torch's has no end),
    a warning that names it and how to remove it, and the Python paths."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    directory = native.build_directory()
    directory.mkdir()
    (directory / "lock").touch()
    monkeypatch.setattr(native, "_compile", lambda directory: pytest.fail("built over a lock"))
    with pytest.warns(RuntimeWarning, match=rf"{directory / 'lock'}.*killed.*rm "):
        assert native.load() is None
    assert "StaleLock" in native.build_state().reason


def test_a_build_in_another_process_is_waited_for_a_bounded_time(
    fresh_native, monkeypatch, tmp_path, capfd
):
    """While another process holds the build, this one says it waits; past the bound it
    takes the Python paths with a warning, never a silent hang."""
    pytest.importorskip("fcntl")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(native, "LOCK_WAIT_S", 0.3)
    monkeypatch.setattr(native, "LOCK_POLL_S", 0.05)
    monkeypatch.setattr(native, "_compile", lambda directory: pytest.fail("built twice"))
    directory = native.build_directory()
    holder = subprocess.Popen(  # another process building: it holds the flock
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
            "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
            str(directory.with_name(f"{directory.name}.lock")),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.warns(RuntimeWarning, match="another process has been building"):
            assert native.load() is None
    finally:
        holder.kill()
        holder.wait()
    assert (
        "waiting for another process's build of playground.kernels.native" in capfd.readouterr().err
    )


@needs_native
def test_a_truncated_library_is_rebuilt_not_loaded(tmp_path):
    """A library cut to half its size (a build killed while writing it) would kill the
    process with a bus error if imported: it is seen, announced as rebuilt, and (the
    rebuild refused here) the Python paths run, in a process that ends normally."""
    built = native.build_directory()
    root = tmp_path / "extensions"
    copy = root / built.name
    shutil.copytree(built, copy)  # keeps the times: ninja sees nothing to do
    library = copy / f"{built.name}.so"
    assert native._finished(copy)
    with library.open("r+b") as handle:
        handle.truncate(library.stat().st_size // 2)
    assert not native._finished(copy)
    code = (
        "import warnings; from playground.kernels import native\n"
        "def refused(directory): raise RuntimeError('rebuild refused by the test')\n"
        "native._compile = refused\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    print(native.load(), native.build_state().reason)\n"
        "print('warned:', [str(w.message)[:60] for w in caught])\n"
    )
    environment = {**os.environ, "TORCH_EXTENSIONS_DIR": str(root)}
    environment.pop(native.DISABLE_VARIABLE, None)
    finished = subprocess.run(
        [sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=120
    )
    assert finished.returncode == 0, (finished.returncode, finished.stderr[-2000:])
    assert "None build failed: RuntimeError: rebuild refused" in finished.stdout
    assert "warned: ['playground.kernels.native could not be built" in finished.stdout
    assert "building playground.kernels.native (first use" in finished.stderr
