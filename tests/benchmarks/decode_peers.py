"""Our decoding step against its public peers, in one process: one generated token after
a context of n tokens, batch 1, fp32, no grad, d_model 512, 8 heads of 64, no biases.

- `vanilla` and `rope` beside HF transformers' own decoding: `LlamaAttention` (eager
  attention) with its DynamicCache and with its StaticCache;
- `linear` beside the recurrent form of its paper (Katharopoulos et al. 2020, §3.4,
  eqs. 18–20), written plainly below from the equations, and beside its own step at
  1024 tokens (a fixed-size state: there "ours faster by" is the step at 1024 tokens ÷
  the step at n, 1 when length costs nothing).

    python -m tests.benchmarks.decode_peers                 # n = 1k, 4k, 16k (linear: 32k too)
    python -m tests.benchmarks.decode_peers --seq-lens 4096 --threads 1

Before any timing each pair's outputs are compared where the math is the same (rope
against Llama with our weights ported, linear against its recurrence; vanilla has no
rotation, so Llama is only its timing peer): a disagreement stops the run. Both sides
step at the same position again and again: a key/value cache is rewound after each step
(HF's by its own `crop`), so the context stays at n. HF gets its most favourable setting:
its rotary cos/sin for the new position are computed once, outside the timed step (a
Llama model shares them across layers), no attention mask (every kept token is real),
and a StaticCache of exactly n + 1 slots.

Each pair is timed in alternating turns (ours, theirs, ours, …), each turn a
torch.utils.benchmark median, so both meet the same load; the table gives the median of
the turns' ratios (their time ÷ ours: above 1, ours is faster) and the time to read our
state once at the memory bandwidth measured in the same process (a step's floor: softmax
decoding reads every kept key and value), then how much linear attention's step rises
from 1024 tokens to each longer context. The load average before and after is printed:
rows timed minutes apart may meet different loads (the two sides of a row meet the
same), so on a shared machine compare within rows, and prefer `--threads 1` (threads that
wait on each other under contention make a step's time meaningless). The peers come from
`transformers`, a dev extra.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

from playground.contract import AttentionVariant
from playground.decoding import DecodingState, TokenCache
from playground.registry import default_registry
from playground.run.decode_cost import memory_bandwidth
from playground.run.instruments import time_call
from tests.benchmarks.peers import D_MODEL, HEADS

AGREEMENT = 1e-4
"""Largest |ours − theirs| allowed in the step's fp32 outputs where the math is the same."""
PORTED = (("q_proj", "q_proj"), ("k_proj", "k_proj"), ("v_proj", "v_proj"), ("out_proj", "o_proj"))
"""Our projection -> Llama's."""
SHORT_CONTEXT = 1024
"""The length a fixed-size state's step at longer ones is timed against."""
LENGTH_PEER = f"ours at n={SHORT_CONTEXT}"


def _our_step(
    module: AttentionVariant, prompt: torch.Tensor, token: torch.Tensor
) -> tuple[Callable, DecodingState]:
    """Our `decode_step` of `token` after `prompt`, at the same position at every call,
    and the state it steps."""
    length = prompt.shape[1]
    _, state = module.prefill(prompt, max_length=length + 1)  # a cache allocated once

    def step() -> torch.Tensor:
        output, _ = module.decode_step(token, state)
        state.length = length  # the next step overwrites this one's slot
        if isinstance(state, TokenCache):
            state.count = length
        return output

    return step, state


def llama_attention(ours: AttentionVariant, positions: int) -> tuple[Any, Any]:
    """HF's LlamaAttention (eager) with `ours`'s projections, and its rotary embedding for
    `positions` positions."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    config = LlamaConfig(
        hidden_size=D_MODEL,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        head_dim=D_MODEL // HEADS,
        attention_bias=False,
        max_position_embeddings=positions,
        attn_implementation="eager",
    )
    attention = LlamaAttention(config, layer_idx=0).eval()
    with torch.no_grad():
        for our_name, their_name in PORTED:
            getattr(attention, their_name).weight.copy_(getattr(ours, our_name).weight)
    return attention, LlamaRotaryEmbedding(config)


def _hf_llama_step(
    cache_kind: str, ours: AttentionVariant, prompt: torch.Tensor, token: torch.Tensor
) -> Callable:
    """LlamaAttention, our weights ported, one step after its cache holds the prompt."""
    from transformers import DynamicCache, StaticCache
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    length = prompt.shape[1]
    attention, rotary = llama_attention(ours, length + 1)
    # The cache as HF's prefill leaves it: rotated keys and values, (1, H, n, d) each.
    keys, values = (
        projection(prompt).view(1, length, HEADS, -1).transpose(1, 2)
        for projection in (attention.k_proj, attention.v_proj)
    )
    cos, sin = rotary(prompt, torch.arange(length)[None])
    keys = apply_rotary_pos_emb(keys, keys, cos, sin)[1]
    cache = (
        DynamicCache(config=attention.config)
        if cache_kind == "dynamic"
        else StaticCache(config=attention.config, max_cache_len=length + 1)
    )
    cache.update(keys, values, 0)
    position_embeddings = rotary(token, torch.tensor([[length]]))

    def step() -> torch.Tensor:
        output = attention(token, position_embeddings, None, cache=cache)[0]
        cache.crop(-1)  # back to the prompt: the next step is at the same position
        return output

    return step


def _recurrent_linear_step(ours, prompt: torch.Tensor, token: torch.Tensor) -> Callable:
    """Katharopoulos et al. 2020, §3.4, as an RNN, with our projections:

        S_i = S_(i−1) + φ(K_i) V_iᵀ,   z_i = z_(i−1) + φ(K_i)          (eqs. 18, 19)
        V'_i = φ(Q_i)ᵀ S_i / (φ(Q_i)ᵀ z_i + ε)                          (eq. 20)

    φ = elu + 1 (§3.2.1), ε = 1e-6 (the paper's code), per head, batch 1."""

    def phi(x: torch.Tensor) -> torch.Tensor:
        return F.elu(x) + 1

    def heads(projection: str, x: torch.Tensor) -> torch.Tensor:
        return getattr(ours, projection)(x)[0].view(x.shape[1], HEADS, -1)  # (n, H, d)

    keys, values = phi(heads("k_proj", prompt)), heads("v_proj", prompt)
    kv = torch.einsum("nhd,nhe->hde", keys, values)  # S after the prompt (H, d, d)
    normaliser = keys.sum(dim=0)  # z after the prompt (H, d)

    def step() -> torch.Tensor:
        q, k, v = (heads(name, token)[0] for name in ("q_proj", "k_proj", "v_proj"))  # (H, d)
        q, k = phi(q), phi(k)
        kv.add_(k[:, :, None] * v[:, None, :])  # eq. 18
        normaliser.add_(k)  # eq. 19
        numerator = (q[:, None, :] @ kv)[:, 0]  # (H, d)
        denominator = (q * normaliser).sum(dim=-1, keepdim=True) + 1e-6  # (H, 1), eq. 20
        return ours.out_proj((numerator / denominator).reshape(1, 1, D_MODEL))

    return step


def _our_step_at(
    context: int, ours: AttentionVariant, prompt: torch.Tensor, token: torch.Tensor
) -> Callable:
    """Our own step after the prompt's first `context` tokens: a length's peer."""
    return _our_step(ours, prompt[:, :context], token)[0]


@dataclass(frozen=True)
class DecodePeer:
    variants: tuple[str, ...]
    """Our variants timed against it."""
    same_math: tuple[str, ...]
    """Those of them whose outputs must agree with its own before anything is timed."""
    build: Callable[[AttentionVariant, torch.Tensor, torch.Tensor], Callable]
    """Its step (a call returning the new token's output), given our module (whose
    weights it takes), the prompt (1, n, d_model) and the token (1, 1, d_model)."""
    seq_lens: tuple[int, ...]
    """The context lengths timed unless --seq-lens says otherwise."""


DECODE_PEERS: dict[str, DecodePeer] = {
    "Llama+DynamicCache": DecodePeer(
        ("vanilla", "rope"), ("rope",), partial(_hf_llama_step, "dynamic"), (1024, 4096, 16384)
    ),
    "Llama+StaticCache": DecodePeer(
        ("vanilla", "rope"), ("rope",), partial(_hf_llama_step, "static"), (1024, 4096, 16384)
    ),
    # A fixed-size state: its step should cost the same at every length, which our own
    # step at 1024 tokens, timed in the same turns, shows through any change of load.
    "recurrence (eqs. 18-20)": DecodePeer(
        ("linear",), ("linear",), _recurrent_linear_step, (1024, 4096, 16384, 32768)
    ),
    LENGTH_PEER: DecodePeer(
        ("linear",), (), partial(_our_step_at, SHORT_CONTEXT), (4096, 16384, 32768)
    ),
}


@dataclass(frozen=True)
class DecodeComparison:
    variant: str
    peer: str
    context: int
    ours_s: float
    """Median time of our step."""
    theirs_s: float
    ratio: float
    """Median over the turns of their time ÷ ours: above 1, ours is faster."""
    error: float | None
    """max |ours − theirs| of the first step where the math is the same, else None."""
    state_bytes: int
    """Our state's bytes: a step reads at least these."""


@torch.no_grad()
def compare_decode(
    peer: str,
    variant: str,
    context: int,
    turns: int,
    min_run_time: float,
    threads: int | None = None,
    seed: int = 0,
) -> DecodeComparison:
    """One step after `context` tokens, ours and the peer's, checked, then timed in turns."""
    entry = DECODE_PEERS[peer]
    torch.manual_seed(seed)
    ours = default_registry().build(variant, D_MODEL, HEADS, bias=False).eval()
    prompt, token = torch.randn(1, context, D_MODEL), torch.randn(1, 1, D_MODEL)
    our_step, state = _our_step(ours, prompt, token)
    steps = (our_step, entry.build(ours, prompt, token))
    ours_out, theirs_out = (step() for step in steps)
    error = None
    if variant in entry.same_math:
        error = float((ours_out - theirs_out).abs().max())
        if not error <= AGREEMENT:
            raise AssertionError(
                f"{variant} and {peer} disagree by {error:.3g} (> {AGREEMENT}) after "
                f"{context} tokens: fix the port before timing them"
            )
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(turns):
        for step, kept in zip(steps, times, strict=True):
            kept.append(time_call(step, min_run_time, threads).median_s)
    ratios = [theirs_s / ours_s for ours_s, theirs_s in zip(*times, strict=True)]
    return DecodeComparison(
        variant,
        peer,
        context,
        statistics.median(times[0]),
        statistics.median(times[1]),
        statistics.median(ratios),
        error,
        state.nbytes,
    )


def report_decode(rows: list[DecodeComparison], bandwidth: float, console: Console) -> None:
    """The table (with the time to read our state once at `bandwidth` bytes/s), then how
    much a fixed-size state's step rises from SHORT_CONTEXT to each longer context."""
    table = Table(
        "ours", "peer", "n", "ours ms", "theirs ms", "ours faster by", "max |Δ|", "state read ms"
    )
    for row in rows:
        table.add_row(
            row.variant,
            row.peer,
            str(row.context),
            f"{row.ours_s * 1e3:.3f}",
            f"{row.theirs_s * 1e3:.3f}",
            f"{row.ratio:.2f}×",
            "-" if row.error is None else f"{row.error:.1e}",
            f"{row.state_bytes / bandwidth * 1e3:.3f}",
        )
    console.print(table)
    for row in rows:
        if row.peer == LENGTH_PEER:  # timed in the same turns: the load cancels
            console.print(
                f"{row.variant}: our step at n={row.context} takes {1 / row.ratio - 1:+.1%} "
                f"vs n={SHORT_CONTEXT}"
            )


def load_average() -> str:
    return " ".join(f"{load:.2f}" for load in os.getloadavg())


def main(argv: list[str] | None = None) -> list[DecodeComparison]:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.decode_peers", description=__doc__
    )
    parser.add_argument("--seq-lens", help="comma-separated context lengths (default: each peer's)")
    parser.add_argument("--peers", default=",".join(DECODE_PEERS), help="comma-separated")
    parser.add_argument("--turns", type=int, default=3, help="alternating turns per side")
    parser.add_argument("--min-run-time", type=float, default=0.5)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's count)")
    arguments = parser.parse_args(argv)
    try:
        seq_lens = (
            [int(part) for part in arguments.seq_lens.split(",")] if arguments.seq_lens else []
        )
    except ValueError:
        raise SystemExit(
            f"error: --seq-lens must be comma-separated integers, e.g. 1024,4096; "
            f"got {arguments.seq_lens!r}"
        ) from None
    if any(n < 1 for n in seq_lens):
        raise SystemExit(f"error: --seq-lens must be positive; got {arguments.seq_lens!r}")
    peers = arguments.peers.split(",")
    for peer in peers:
        if peer not in DECODE_PEERS:
            raise SystemExit(f"error: unknown peer {peer!r}; one of {', '.join(DECODE_PEERS)}")
    console = Console(width=120)
    console.print(
        f"one decoding step, B=1, fp32, {arguments.threads or torch.get_num_threads()} threads; "
        f"load average {load_average()} before"
    )
    rows = [
        compare_decode(peer, variant, n, arguments.turns, arguments.min_run_time, arguments.threads)
        for peer in peers
        for variant in DECODE_PEERS[peer].variants
        for n in seq_lens or DECODE_PEERS[peer].seq_lens
    ]
    bandwidth = memory_bandwidth(threads=arguments.threads).bytes_per_s
    console.print(
        f"load average {load_average()} after; memory bandwidth {bandwidth / 1e9:.1f} GB/s "
        f"(torch.mv, the same threads)"
    )
    report_decode(rows, bandwidth, console)
    return rows


if __name__ == "__main__":
    main()
