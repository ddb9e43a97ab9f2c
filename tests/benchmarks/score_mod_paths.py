"""Which path a score_mod takes, and what it costs: ALiBi written as a score_mod three ways
(nothing declared, `additive_score_mod`, `relative_score_mod`), the README's example as
written, three additive biases that are not relative (a learned bias per key, a bias from
document ids, a learned bias per pair of blocks) and the shipped alibi, each with the
trace's verdict, timed in one process against the machine's GEMM rate.

    python -m tests.benchmarks.score_mod_paths                # forward, n = 4096
    python -m tests.benchmarks.score_mod_paths --pass forward_backward --seq-len 2048

fp32, batch 1, d_model 512, 8 heads, on --threads (default 2). Efficiency is the pass's
FLOPs over its median time, over the GEMM rate measured in the same process: the
projections and the attention over the (query, key) pairs the variant's `mask_mod`
allows (all of them without one), ×3 with the backward. Counting every pair for a mod
that keeps a band would put a banded pass above the GEMM rate.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

import playground
from playground import SoftmaxAttention
from playground.heads import attention_flops, projection_flops
from playground.mods.grid import index_grid
from playground.run.instruments import gemm_flops_per_second, time_call, using_threads

README = Path(__file__).parents[2] / "README.md"


def alibi_slopes(heads: int) -> torch.Tensor:
    return 2.0 ** (-8 * torch.arange(1, heads + 1) / heads)


class AlibiUndeclared(SoftmaxAttention):
    name, summary, paper = "alibi as a score_mod, nothing declared", "-", "-"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_buffer("slopes", alibi_slopes(self.num_heads))

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return score - self.slopes[h] * (q_idx - kv_idx).abs()


class AlibiAdditive(AlibiUndeclared):
    name = "alibi as a score_mod, additive_score_mod = True"
    additive_score_mod = True


class AlibiRelative(AlibiUndeclared):
    name = "alibi as a score_mod, relative_score_mod = True"
    relative_score_mod = True


class BiasPerKey(SoftmaxAttention):
    """A learned bias per key position: additive, not relative."""

    name, summary, paper = "a learned bias per key (additive, not relative)", "-", "-"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.key_bias = torch.nn.Parameter(0.1 * torch.randn(8192))

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return score + self.key_bias[kv_idx]


class DocumentBias(SoftmaxAttention):
    """A data-dependent bias: −1 between tokens of different documents (ids in a buffer
    set per batch), additive, reading q_idx and kv_idx apart."""

    name, summary, paper = "a bias from document ids (data-dependent)", "-", "-"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_buffer("document", torch.arange(8192) // 700)

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return score + torch.where(self.document[q_idx] == self.document[kv_idx], 0.0, -1.0)


class LearnedBlockBias(SoftmaxAttention):
    """A learned bias per head and pair of 256-token blocks: additive, reads q_idx and
    kv_idx apart, and needs a gradient."""

    name, summary, paper = "a learned bias per pair of blocks (needs a gradient)", "-", "-"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.table = torch.nn.Parameter(0.1 * torch.randn(self.num_heads, 32, 32))

    def score_mod(self, score, b, h, q_idx, kv_idx):
        return score + self.table[h, q_idx // 256, kv_idx // 256]


def readme_example() -> type[SoftmaxAttention]:
    """The README's score_mod example, copied as written."""
    block = re.search(r"```python\n(class MyAttention.*?)```", README.read_text(), re.S)
    namespace: dict = {"playground": playground}
    exec(block.group(1), namespace)
    example = namespace["MyAttention"]
    example.name = "the README's example, as written"
    return example


def pass_flops(module: SoftmaxAttention, n: int) -> float:
    """FLOPs of one forward over n tokens: projections, and attention over the pairs the
    module's mask_mod allows (averaged over heads)."""
    if not module._has_mask_mod:
        return module.count_flops(n, n)
    positions = torch.arange(n)
    b, h, q_idx, kv_idx = index_grid(1, module.num_heads, positions, positions)
    allowed = module._mask(b, h, q_idx, kv_idx)  # (1, H or 1, n, n)
    pairs = float(allowed.sum()) / allowed.shape[1]
    return projection_flops(n, n, module.d_model) + attention_flops(pairs, module.d_model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument(
        "--pass", dest="pass_name", default="forward", choices=["forward", "forward_backward"]
    )
    parser.add_argument("--threads", type=int, default=2)
    arguments = parser.parse_args()
    n, training = arguments.seq_len, arguments.pass_name == "forward_backward"
    gemm = gemm_flops_per_second(threads=arguments.threads)
    classes = [
        AlibiUndeclared,
        AlibiAdditive,
        AlibiRelative,
        readme_example(),
        BiasPerKey,
        DocumentBias,
        LearnedBlockBias,
    ]
    table = Table(
        title=f"{arguments.pass_name}, n = {n}, fp32, batch 1, d_model 512, 8 heads, {arguments.threads} threads; GEMM {gemm / 1e9:.0f} GFLOP/s"
    )
    for column in ("score_mod", "path (trace verdict)", "CPU kernel", "time ms", "efficiency"):
        table.add_column(column)
    modules = [(cls.name, cls(512, 8)) for cls in classes]
    modules.append(("the shipped alibi", playground.build("alibi")))
    x = torch.randn(1, n, 512, requires_grad=training)
    for label, module in modules:
        module.train(training)

        def run(module: torch.nn.Module = module) -> None:
            if training:
                module(x).output.sum().backward()
            else:
                with torch.no_grad():
                    module(x)

        with using_threads(arguments.threads):
            timing = time_call(run, min_run_time=1.0, threads=arguments.threads, min_runs=3)
        flops = pass_flops(module, n) * (3 if training else 1)
        efficiency = flops / timing.median_s / gemm
        table.add_row(
            label,
            str(module.score_mod_structure()),
            str(module.cpu_kernel(n)),
            f"{timing.median_s * 1e3:.0f}",
            f"{efficiency:.2f}",
        )
    Console().print(table)


if __name__ == "__main__":
    main()
