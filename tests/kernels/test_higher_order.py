"""Gradients of gradients, and torch.func transforms, through the fused CPU paths.

The kernels' autograd functions have fused backwards whose results are not themselves
differentiable, and no torch.func rules. Under create_graph=True (a gradient penalty, a
Hessian-vector product) they recompute with torch's own operations, and under torch.func
transforms the paths made of torch's own operations run instead: either way the answer
is the reference's. Each shipped variant below takes one of those kernels in training:
sliding_window `blocked_attention`, longformer `banded_attention`, t5_relative and
learnable ALiBi `relative_bias_attention`."""

from __future__ import annotations

import pytest
import torch

from playground.registry import default_registry

CASES = [
    ("sliding_window", {}),
    # No global token: the global rows are an SDPA call, and torch's CPU flash kernel has
    # no double backward (it raises, as it does for every variant that calls SDPA).
    ("longformer", {"global_tokens": ()}),
    ("t5_relative", {}),
    ("alibi", {"learnable_slopes": True}),
]


def _module(name: str, options: dict, dtype: torch.dtype):
    registry = default_registry()
    suite = dict(registry.get(name).suite_options)
    torch.manual_seed(0)
    return registry.build(name, 16, 2, **{**suite, **options}).to(dtype).train()


def _inputs(dtype: torch.dtype):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 13, 16, generator=generator, dtype=dtype)
    mask = torch.ones(2, 13, dtype=torch.bool)
    mask[1, 9:] = False
    return x, mask


def _penalised_gradients(module, path: str, x, mask, is_causal: bool):
    """d/dθ of ‖d(loss)/dx‖²: the gradient penalty's gradient for every parameter and x."""
    x = x.clone().requires_grad_(True)
    forward = module.forward_fast if path == "fast" else module.forward_reference
    output = forward(x, x, x, mask, is_causal, False).output
    loss = (output * torch.linspace(-1, 1, output.numel(), dtype=x.dtype).view_as(output)).sum()
    (grad_x,) = torch.autograd.grad(loss, x, create_graph=True)
    penalty = grad_x.square().sum()
    return torch.autograd.grad(penalty, [x, *module.parameters()], allow_unused=True)


@pytest.mark.parametrize(("name", "options"), CASES)
@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_second_order_gradients_match_the_reference(name, options, is_causal, dtype):
    module = _module(name, options, dtype)
    if is_causal and not module.capabilities.causal:
        pytest.skip(f"{name} does not declare causal")
    x, mask = _inputs(dtype)
    fast = _penalised_gradients(module, "fast", x, mask, is_causal)
    reference = _penalised_gradients(module, "reference", x, mask, is_causal)
    tolerance = 1e-9 if dtype == torch.float64 else 2e-4
    for mine, theirs, parameter in zip(fast, reference, [x, *module.parameters()], strict=True):
        # A parameter one path leaves out (longformer's global projections, without
        # global tokens) has no gradient there and a zero one on the other.
        mine = torch.zeros_like(parameter) if mine is None else mine
        theirs = torch.zeros_like(parameter) if theirs is None else theirs
        scale = max(1.0, theirs.abs().max().item())
        assert (mine - theirs).abs().max().item() <= tolerance * scale


@pytest.mark.parametrize(("name", "options"), CASES)
def test_torch_func_grad_matches_the_reference(name, options):
    """torch.func.grad over the parameters, padding included: the fast module (taking
    the plain-autograd paths under the transform) and the reference one agree."""
    fast = _module(name, options, torch.float64)
    reference = _module(name, {**options, "impl": "reference"}, torch.float64)
    x, mask = _inputs(torch.float64)
    parameters = {key: value.detach() for key, value in fast.named_parameters()}

    def loss(module):
        def of(params):
            call = torch.func.functional_call(module, params, (x,), {"attention_mask": mask})
            return call.output.square().sum()

        return of

    ours, theirs = (
        torch.func.grad(loss(fast))(parameters),
        torch.func.grad(loss(reference))(parameters),
    )
    for key, expected in theirs.items():
        torch.testing.assert_close(ours[key], expected, rtol=1e-9, atol=1e-9)


def test_the_second_order_check_can_fail():
    """A fast path whose gradients are constants (the silent failure this file guards
    against: once_differentiable with a grad_output that needs no gradient) differs."""
    module = _module("sliding_window", {}, torch.float64)
    x, mask = _inputs(torch.float64)
    reference = _penalised_gradients(module, "reference", x, mask, False)
    from playground.kernels import blocked

    original = blocked.differentiable_gradients

    def detached(inputs, grad_output, recompute):
        return [None if g is None else g.detach() for g in original(inputs, grad_output, recompute)]

    blocked.differentiable_gradients = detached
    try:
        fast = _penalised_gradients(module, "fast", x, mask, False)
    finally:
        blocked.differentiable_gradients = original
    differences = [
        (mine - theirs).abs().max().item()
        for mine, theirs in zip(fast, reference, strict=True)
        if mine is not None and theirs is not None
    ]
    assert max(differences) > 1e-3
