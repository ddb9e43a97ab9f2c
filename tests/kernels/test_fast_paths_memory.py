"""No shipped fast path holds an (H, n, n) score matrix: inference and training peak
memory at n = 1024 stay below one dense fp32 score matrix of all heads (32 MiB here).
Catches a fused kernel silently falling back to its unfused one (differential attention's
q/k and v widths once did)."""

from __future__ import annotations

import pytest
import torch

import playground
from playground.run.instruments import peak_memory_bytes
from playground.run.measurer import Workload as workload

N, D_MODEL, HEADS = 1024, 64, 8
DENSE = HEADS * N * N * 4


@pytest.mark.parametrize("name", playground.list_variants())
@pytest.mark.parametrize("pass_name", ["forward", "forward_backward"])
def test_peak_memory_is_below_one_dense_score_matrix(name, pass_name):
    cls = playground.get_variant(name)
    if cls.forward_fast is None:
        pytest.skip(f"{name} has no fast path")
    options = cls.fit_options({}, N)
    module = playground.build(name, D_MODEL, HEADS, **options)
    peak = peak_memory_bytes(workload(module, torch.randn(1, N, D_MODEL), pass_name))
    assert peak < DENSE, f"{name} {pass_name}: {peak / 2**20:.1f} MiB"
