"""Our variants against their public peers, in one process, on the same config: HF's
`T5Attention` beside `t5_relative` and HF's `LongformerSelfAttention` beside
`longformer`, forward or forward+backward.

    python -m tests.benchmarks.peers --seq-lens 2048,4096 --pass forward_backward

Each pair is timed in alternating turns (ours, theirs, ours, …), each turn a
torch.utils.benchmark median, so both meet the same load; the table gives the median of
the turns' ratios (their time ÷ ours: above 1, ours is faster) and each side's median
time. fp32, batch 1, d_model 512, 8 heads, on torch's current thread count. The peers
come from `transformers`, a dev extra; their weights are their own initialisation (the
parity tests copy weights; timing does not need it).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
from rich.console import Console
from rich.table import Table

from playground.measure import time_call
from playground.registry import default_registry

D_MODEL, HEADS, WINDOW = 512, 8, 512


def _hf_t5() -> tuple[torch.nn.Module, Callable]:
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    config = T5Config(d_model=D_MODEL, d_kv=D_MODEL // HEADS, num_heads=HEADS, dropout_rate=0.0)
    module = T5Attention(config, has_relative_attention_bias=True, layer_idx=0)
    return module, lambda x: module(x)[0]


def _hf_longformer() -> tuple[torch.nn.Module, Callable]:
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


PEERS: dict[str, tuple[str, dict, Callable[[], tuple[torch.nn.Module, Callable]]]] = {
    "T5Attention": ("t5_relative", {}, _hf_t5),
    "LongformerSelfAttention": (
        "longformer",
        {"attention_window": WINDOW, "global_tokens": [0]},
        _hf_longformer,
    ),
}
"""peer -> (our variant, its options, a builder of the peer module and its call)."""


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
    """(median ratio of their time to ours, our median s, their median s)."""
    variant, options, build_peer = PEERS[peer]
    ours = default_registry().build(variant, D_MODEL, HEADS, **options)
    theirs, their_call = build_peer()
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
    return statistics.median(ratios), statistics.median(times[0]), statistics.median(times[1])


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
    table = Table("ours", "peer", "n", "ours ms", "theirs ms", "ours faster by")
    for peer in arguments.peers.split(","):
        if peer not in PEERS:
            raise SystemExit(f"error: unknown peer {peer!r}; one of {', '.join(PEERS)}")
        for n in seq_lens:
            ratio, ours_s, theirs_s = compare(
                peer,
                n,
                arguments.pass_name == "forward_backward",
                arguments.turns,
                arguments.min_run_time,
            )
            table.add_row(
                PEERS[peer][0],
                peer,
                str(n),
                f"{ours_s * 1e3:.0f}",
                f"{theirs_s * 1e3:.0f}",
                f"{ratio:.2f}×",
            )
    console = Console()
    console.print(f"pass: {arguments.pass_name}, {torch.get_num_threads()} threads")
    console.print(table)


if __name__ == "__main__":
    main()
