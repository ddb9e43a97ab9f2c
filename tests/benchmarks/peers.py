"""Our variants against their public peers, in one process, on the same config:
`torch.nn.MultiheadAttention` beside `vanilla`, lucidrains' `LinformerSelfAttention`
beside `linformer`, HF's `T5Attention` beside `t5_relative` and HF's
`LongformerSelfAttention` beside `longformer`, forward or forward+backward.

    python -m tests.benchmarks.peers --seq-lens 2048,4096 --pass forward_backward

Each pair is timed in alternating turns (ours, theirs, ours, …), each turn a
torch.utils.benchmark median, so both meet the same load; the table gives the median of
the turns' ratios (their time ÷ ours: above 1, ours is faster), each side's median time,
and our efficiency: our variant's FLOPs (×3 for forward+backward) ÷ our time ÷ the fp32
GEMM rate measured in the same run (before and after, the faster kept). fp32, batch 1,
d_model 512, 8 heads, on torch's current thread count. The peers come from `transformers`
and `linformer`, dev extras; their weights are their own initialisation (the parity
tests copy weights; timing does not need it).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch
from rich.console import Console
from rich.table import Table

from playground.registry import default_registry
from playground.run.instruments import gemm_flops_per_second, time_call
from playground.run.measurer import BACKWARD_FLOPS_FACTOR

D_MODEL, HEADS, WINDOW, SLOTS = 512, 8, 512, 256


def _torch_mha(seq_len: int) -> tuple[torch.nn.Module, Callable]:
    module = torch.nn.MultiheadAttention(D_MODEL, HEADS, batch_first=True)
    return module, lambda x: module(x, x, x, need_weights=False)[0]


def _lucidrains_linformer(seq_len: int) -> tuple[torch.nn.Module, Callable]:
    from linformer import LinformerSelfAttention

    # One E and one F per layer, shared by the heads: our linformer's default sharing.
    module = LinformerSelfAttention(D_MODEL, seq_len, k=SLOTS, heads=HEADS)
    return module, module


def _hf_t5(seq_len: int) -> tuple[torch.nn.Module, Callable]:
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    config = T5Config(d_model=D_MODEL, d_kv=D_MODEL // HEADS, num_heads=HEADS, dropout_rate=0.0)
    module = T5Attention(config, has_relative_attention_bias=True, layer_idx=0)
    return module, lambda x: module(x)[0]


def _hf_longformer(seq_len: int) -> tuple[torch.nn.Module, Callable]:
    from transformers import LongformerConfig
    from transformers.models.longformer.modeling_longformer import LongformerSelfAttention

    config = LongformerConfig(
        hidden_size=D_MODEL,
        num_attention_heads=HEADS,
        attention_window=[WINDOW],
        attention_probs_dropout_prob=0.0,
    )
    module = LongformerSelfAttention(config, layer_id=0)

    def call(x: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(x.shape[:2])
        mask[:, 0] = 10000.0  # token 0 global, as in ours
        return module(
            x,
            attention_mask=mask,
            is_index_masked=mask < 0,
            is_index_global_attn=mask > 0,
            is_global_attn=True,
        )[0]

    return module, call


@dataclass(frozen=True)
class Peer:
    variant: str
    """Our variant."""
    options: Callable[[int], dict]
    """Its options at a sequence length."""
    build: Callable[[int], tuple[torch.nn.Module, Callable]]
    """The peer module at a sequence length, and how to call it on x (B, N, d_model)."""


PEERS: dict[str, Peer] = {
    "MultiheadAttention": Peer("vanilla", lambda n: {}, _torch_mha),
    "LinformerSelfAttention": Peer(
        "linformer", lambda n: {"seq_len": n, "k": SLOTS}, _lucidrains_linformer
    ),
    "T5Attention": Peer("t5_relative", lambda n: {}, _hf_t5),
    "LongformerSelfAttention": Peer(
        "longformer", lambda n: {"attention_window": WINDOW, "global_tokens": [0]}, _hf_longformer
    ),
}


def _workload(module: torch.nn.Module, call: Callable, x: torch.Tensor, backward: bool):
    module.train(backward)
    x = x.detach().requires_grad_(backward)

    def run() -> None:
        if not backward:
            with torch.no_grad():
                call(x)
            return
        call(x).sum().backward()
        module.zero_grad(set_to_none=True)
        x.grad = None

    return run


def compare(peer: str, seq_len: int, backward: bool, turns: int, min_run_time: float):
    """(median ratio of their time to ours, our median s, their median s, our FLOPs)."""
    entry = PEERS[peer]
    ours = default_registry().build(entry.variant, D_MODEL, HEADS, **entry.options(seq_len))
    theirs, their_call = entry.build(seq_len)
    x = torch.randn(1, seq_len, D_MODEL)
    runs = (
        _workload(ours, lambda t: ours(t).output, x, backward),
        _workload(theirs, their_call, x, backward),
    )
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(turns):
        for run, kept in zip(runs, times, strict=True):
            kept.append(time_call(run, min_run_time).median_s)
    ratios = [theirs_s / ours_s for ours_s, theirs_s in zip(*times, strict=True)]
    flops = ours.count_flops(seq_len, seq_len) * (BACKWARD_FLOPS_FACTOR if backward else 1)
    return (
        statistics.median(ratios),
        statistics.median(times[0]),
        statistics.median(times[1]),
        flops,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.peers", description=__doc__)
    parser.add_argument("--seq-lens", default="2048,4096")
    parser.add_argument(
        "--pass",
        dest="pass_name",
        default="forward_backward",
        choices=("forward", "forward_backward"),
    )
    parser.add_argument("--peers", default=",".join(PEERS), help="comma-separated")
    parser.add_argument("--turns", type=int, default=3, help="alternating turns per side")
    parser.add_argument("--min-run-time", type=float, default=0.5)
    arguments = parser.parse_args(argv)
    try:
        seq_lens = [int(text) for text in arguments.seq_lens.split(",")]
    except ValueError:
        raise SystemExit(
            f"error: --seq-lens must be comma-separated integers, e.g. 2048,4096; "
            f"got {arguments.seq_lens!r}"
        ) from None
    if any(n < 1 for n in seq_lens):
        raise SystemExit(f"error: --seq-lens must be positive; got {arguments.seq_lens!r}")
    for peer in arguments.peers.split(","):
        if peer not in PEERS:
            raise SystemExit(f"error: unknown peer {peer!r}; one of {', '.join(PEERS)}")
    backward = arguments.pass_name == "forward_backward"
    gemm = gemm_flops_per_second()
    rows = []
    for peer in arguments.peers.split(","):
        for n in seq_lens:
            ratio, ours_s, theirs_s, flops = compare(
                peer, n, backward, arguments.turns, arguments.min_run_time
            )
            rows.append((PEERS[peer].variant, peer, n, ours_s, theirs_s, ratio, flops))
    gemm = max(gemm, gemm_flops_per_second())
    table = Table("ours", "peer", "n", "ours ms", "theirs ms", "ours faster by", "our efficiency")
    for variant, peer, n, ours_s, theirs_s, ratio, flops in rows:
        table.add_row(
            variant,
            peer,
            str(n),
            f"{ours_s * 1e3:.0f}",
            f"{theirs_s * 1e3:.0f}",
            f"{ratio:.2f}×",
            f"{flops / ours_s / gemm:.2f}",
        )
    console = Console()
    console.print(
        f"pass: {arguments.pass_name}, {torch.get_num_threads()} threads, "
        f"GEMM fp32 {gemm / 1e9:.1f} GFLOP/s (the faster of before and after)"
    )
    console.print(table)


if __name__ == "__main__":
    main()
