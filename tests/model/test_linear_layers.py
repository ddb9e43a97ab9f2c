"""playground.model.linear_layers: linear layers on oneDNN give F.linear's values and gradients
(to float32 rounding), fall back to F.linear wherever oneDNN does not apply, and the model
trains the same with either library."""

from __future__ import annotations

import copy
import dataclasses
import os
import pickle
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from playground.model import linear_layers
from playground.model.linear_layers import FastLinear, linear, use_fast_linears

needs_onednn = pytest.mark.skipif(
    not linear_layers._onednn_op_available(), reason="this torch has no oneDNN linear"
)


@pytest.fixture
def onednn():
    """oneDNN for the test, whatever this CPU would choose; the choice restored after."""
    previous = linear_layers.backend()
    linear_layers.set_backend("onednn")
    yield
    linear_layers.set_backend(previous)


def _check_against_f_linear(shape, out_features, *, bias=True, grads=(True, True, True)):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=generator)
    weight = torch.randn(out_features, shape[-1], generator=generator)
    b = torch.randn(out_features, generator=generator) if bias else None
    tensors = [x, weight] + ([b] if bias else [])
    for tensor, wanted in zip(tensors, grads, strict=False):
        tensor.requires_grad_(wanted)
    grad_out = torch.randn(*shape[:-1], out_features, generator=generator)

    def run(function):
        for tensor in tensors:
            tensor.grad = None
        out = function(x, weight, b)
        if out.requires_grad:
            out.backward(grad_out)
        return out.detach(), [None if t.grad is None else t.grad.clone() for t in tensors]

    got, got_grads = run(linear)
    expected, expected_grads = run(F.linear)
    _close(got, expected)
    for g, e in zip(got_grads, expected_grads, strict=True):
        assert (g is None) == (e is None)
        if g is not None:
            _close(g, e)


def _close(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal to float32 rounding of sums in another order: within 1e-5 of the largest."""
    assert got.shape == expected.shape
    got, expected = got.detach(), expected.detach()
    scale = expected.abs().max().clamp(min=1.0)
    assert float((got - expected).abs().max() / scale) < 1e-5


@needs_onednn
@pytest.mark.parametrize(
    "shape, out_features",
    [((2048, 64), 256), ((32, 64, 64), 64), ((4, 7, 13), 5), ((64,), 3), ((1, 1), 1)],
)
def test_values_and_gradients_match_f_linear(onednn, shape, out_features):
    _check_against_f_linear(shape, out_features)


@needs_onednn
@pytest.mark.parametrize("grads", [(True, False, False), (False, True, True), (True, True)])
def test_only_the_gradients_asked_for(onednn, grads):
    _check_against_f_linear((3, 9, 16), 8, bias=len(grads) == 3, grads=grads)


@needs_onednn
def test_strided_input_and_empty_batch(onednn):
    x = torch.randn(16, 10)[:, ::2]  # (16, 5), not contiguous
    weight = torch.randn(4, 5)
    torch.testing.assert_close(linear(x, weight), F.linear(x, weight))
    empty = torch.randn(0, 7, 5, requires_grad=True)
    out = linear(empty, weight)
    assert out.shape == (0, 7, 4)
    out.sum().backward()
    assert empty.grad.shape == empty.shape


def test_other_dtypes_devices_and_autocast_take_f_linear(onednn, monkeypatch):
    def refuse(*args):
        raise AssertionError("oneDNN path taken")

    monkeypatch.setattr(linear_layers._OneDNNLinear, "apply", refuse)
    for dtype in (torch.float64, torch.bfloat16):
        x, weight = torch.randn(3, 4, dtype=dtype), torch.randn(2, 4, dtype=dtype)
        torch.testing.assert_close(linear(x, weight), F.linear(x, weight))
    x, weight = torch.randn(3, 4), torch.randn(2, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert linear(x, weight).dtype == torch.bfloat16  # autocast still applies
    linear_layers.set_backend("blas")
    torch.testing.assert_close(linear(x, weight), F.linear(x, weight))


@needs_onednn
def test_a_wrong_gradient_is_caught(onednn, monkeypatch):
    """The comparison above can fail: a weight gradient transposed the wrong way is found."""
    backward = linear_layers._OneDNNLinear.backward

    def transposed(ctx, grad_out):
        grad_x, grad_weight, grad_bias = backward(ctx, grad_out)
        return grad_x, grad_weight.t(), grad_bias

    monkeypatch.setattr(linear_layers._OneDNNLinear, "backward", staticmethod(transposed))
    with pytest.raises(AssertionError):
        _check_against_f_linear((32, 8), 8)


def test_use_fast_linears_keeps_parameters_and_state():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    state = copy.deepcopy(model.state_dict())
    model[0].register_forward_hook(_count_call)
    _count_call.calls = 0
    model.append(_Own(2, 2))
    assert use_fast_linears(model) == 2
    assert type(model[0]) is FastLinear and type(model[2]) is FastLinear
    assert type(model[3]) is _Own  # a subclass keeps its own forward
    assert isinstance(model[0], nn.Linear)
    for key, value in state.items():
        torch.testing.assert_close(model.state_dict()[key], value)
    model(torch.randn(3, 4))
    assert _count_call.calls == 1
    pickle.loads(pickle.dumps(model))
    copy.deepcopy(model)


class _Own(nn.Linear):
    pass


def _count_call(*args) -> None:
    _count_call.calls += 1


def test_set_backend_and_the_environment_variable_reject_unknown_names():
    with pytest.raises(ValueError, match="'onednn' or 'blas'"):
        linear_layers.set_backend("mkl")  # type: ignore[arg-type]
    env = {**os.environ, linear_layers.VARIABLE: "fast"}
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from playground.model import linear_layers; linear_layers.backend()",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert "PLAYGROUND_LINEAR='fast' is not a backend" in result.stderr


def test_backend_follows_the_cpu_vendor_and_the_variable(monkeypatch):
    monkeypatch.setattr(linear_layers, "_onednn_op_available", lambda: True)
    monkeypatch.delenv(linear_layers.VARIABLE, raising=False)
    for vendor, expected in (("GenuineIntel", "blas"), ("AuthenticAMD", "onednn"), ("", "blas")):
        monkeypatch.setattr(linear_layers, "_cpu_vendor", lambda v=vendor: v)
        assert linear_layers._default_backend() == expected
    monkeypatch.setenv(linear_layers.VARIABLE, "blas")
    assert linear_layers._default_backend() == "blas"
    monkeypatch.setattr(linear_layers, "_onednn_op_available", lambda: False)
    monkeypatch.setenv(linear_layers.VARIABLE, "onednn")
    assert linear_layers._default_backend() == "blas"  # nothing to run it on


@needs_onednn
def test_the_model_trains_the_same_on_either_library():
    """A few AdamW steps of the classifier: the same losses to float32 rounding."""
    from playground.model.training import train
    from playground.model.transformer import TransformerClassifier
    from playground.registry import Registry
    from playground.run.jobs import AccuracyJob, prepare

    registry = Registry.discover()
    job = AccuracyJob("vanilla", {}, "mqar", {"seq_len": 64, "num_pairs": 4}, steps=5)
    prepared = prepare(registry, job)
    data, _ = prepared.task.split(0)
    previous, losses = linear_layers.backend(), {}
    try:
        for name in ("blas", "onednn"):
            linear_layers.set_backend(name)
            torch.manual_seed(0)
            model = TransformerClassifier(prepared.model, registry)
            assert all(type(m) is not nn.Linear for m in model.modules())
            config = dataclasses.replace(prepared.training, steps=5)
            losses[name] = train(model, data, config, seed=0).losses
    finally:
        linear_layers.set_backend(previous)
    assert losses["blas"] == pytest.approx(losses["onednn"], rel=1e-4)


@needs_onednn
def test_a_bias_of_any_strides(onednn):
    """oneDNN reads a bias as contiguous: a strided or expanded one must still be right."""
    x, weight = torch.randn(5, 16), torch.randn(4, 16)
    for bias in (torch.randn(8)[::2], torch.tensor([3.0]).expand(4)):
        _close(linear(x, weight, bias), F.linear(x, weight, bias))


@needs_onednn
def test_second_order_gradients(onednn):
    """A Hessian and a gradient penalty (create_graph=True) equal nn.Linear's."""
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 1))
    fast = copy.deepcopy(plain)
    use_fast_linears(fast)
    point = torch.randn(4)
    hessians = [
        torch.autograd.functional.hessian(lambda p, m=model: m(p).sum(), point)
        for model in (plain, fast)
    ]
    assert hessians[0].abs().max() > 0
    _close(hessians[1], hessians[0])
    batch = torch.randn(5, 4)
    for model in (plain, fast):
        inputs = batch.clone().requires_grad_(True)
        (gradient,) = torch.autograd.grad(model(inputs).sum(), inputs, create_graph=True)
        gradient.pow(2).sum().backward()
    for a, b in zip(fast.parameters(), plain.parameters(), strict=True):
        assert (a.grad is None) == (b.grad is None)  # the last bias: no second-order term
        if a.grad is not None:
            _close(a.grad, b.grad)


@needs_onednn
def test_a_frozen_layer_keeps_no_input(onednn):
    """With the weight frozen, the input is not saved: changing it in place afterwards is
    fine, as with nn.Linear."""
    layer = FastLinear(8, 3).requires_grad_(False)
    hidden = torch.randn(4, 8, requires_grad=True) * 1.0
    out = layer(hidden)
    hidden.mul_(2)
    out.sum().backward()


@needs_onednn
def test_torch_func_transforms_take_f_linear(onednn):
    weight = torch.randn(4, 16)
    batch = torch.randn(3, 16)
    _close(torch.func.vmap(lambda v: linear(v, weight))(batch), F.linear(batch, weight))
    jacobian = torch.func.jacrev(lambda v: linear(v, weight).sum())(batch[0])
    _close(jacobian, weight.sum(dim=0))


def test_wrong_shapes_get_torchs_own_message(onednn):
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        FastLinear(4, 6)(torch.randn(3, 5))


@needs_onednn
def test_onednn_linear_is_the_product_with_the_weight_transposed():
    generator = torch.Generator().manual_seed(3)
    a, b = torch.randn(64, 48, generator=generator), torch.randn(32, 48, generator=generator)
    _close(linear_layers.onednn_linear(a, b), a @ b.t())


def test_onednn_computes_float32_on_a_cpu_only(monkeypatch):
    monkeypatch.setattr(linear_layers, "_onednn_op_available", lambda: True)
    assert linear_layers.onednn_computes("cpu", torch.float32)
    assert not linear_layers.onednn_computes("cpu", torch.bfloat16)
    assert not linear_layers.onednn_computes("cuda", torch.float32)
    monkeypatch.setattr(linear_layers, "_onednn_op_available", lambda: False)
    assert not linear_layers.onednn_computes("cpu", torch.float32)
