"""Every variant's fast path on a CUDA device against its own reference there: outputs and
gradients, with padding and causality, in float32 and bfloat16. For `SoftmaxAttention`
variants (alibi, sliding_window, a researcher's mods) the fast path on CUDA is compiled
`flex_attention` with a block mask, so this is where that path is proven.

Skipped cleanly without a GPU; `tools/gpu-check` runs these first (DEVELOPERS.md).
"""

from __future__ import annotations

import pytest
import torch

from playground.registry import Registry
from playground.softmax_attention import SoftmaxAttention

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

REGISTRY = Registry.discover(entry_points=False)
TOLERANCE = {torch.float32: 2e-4, torch.bfloat16: 3e-2}


def inputs(n: int, dtype: torch.dtype, padded: bool):
    generator = torch.Generator().manual_seed(n)
    tokens = torch.randn(2, n, 64, generator=generator).to("cuda", dtype)
    mask = None
    if padded:
        mask = torch.ones(2, n, dtype=torch.bool, device="cuda")
        mask[1, n // 3 :] = False
    return tokens, mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("n", [1, 17, 130, 300])
@pytest.mark.parametrize("name", REGISTRY.names())
def test_fast_matches_reference_on_cuda(name, n, dtype):
    cls = REGISTRY.get(name)
    if dtype not in cls.capabilities.dtypes:
        pytest.skip(f"{name} does not declare {dtype}")
    torch.manual_seed(0)
    module = REGISTRY.build(name, 64, 4, **cls.suite_options).to("cuda", dtype)
    for causal in (False, True) if cls.capabilities.causal else (False,):
        for padded in (False, True) if cls.capabilities.padding_mask else (False,):
            tokens, mask = inputs(n, dtype, padded)
            tokens.requires_grad_(True)
            fast = module(tokens, attention_mask=mask, is_causal=causal, impl="fast").output
            reference = module(tokens, attention_mask=mask, is_causal=causal, impl="reference")
            tolerance = TOLERANCE[dtype]
            torch.testing.assert_close(fast, reference.output, rtol=tolerance, atol=tolerance)
            weights = torch.randn_like(fast)
            (grad_fast,) = torch.autograd.grad((fast * weights).sum(), tokens)
            (grad_reference,) = torch.autograd.grad((reference.output * weights).sum(), tokens)
            torch.testing.assert_close(
                grad_fast, grad_reference, rtol=10 * tolerance, atol=10 * tolerance
            )


def test_mod_variants_take_the_flex_path_on_cuda(monkeypatch):
    """The CUDA fast path of a SoftmaxAttention variant is flex_attention, not the CPU
    blocks: a call that reaches the CPU path fails the test."""
    module = REGISTRY.build("alibi", 64, 4).cuda()
    assert isinstance(module, SoftmaxAttention)

    def no_cpu_blocks(*arguments, **keywords):
        raise AssertionError("the CPU blocked path ran on CUDA")

    # alibi's CPU fast path is the relative Toeplitz kernel; any other mod's is the scheduler
    monkeypatch.setattr("playground.mods.scheduler.ModScheduler.attend", no_cpu_blocks)
    monkeypatch.setattr("playground.softmax_attention.relative_bias_attention", no_cpu_blocks)
    tokens, _ = inputs(64, torch.float32, False)
    module(tokens, impl="fast")
