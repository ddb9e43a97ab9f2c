"""Our decoding step against HF's LlamaAttention and linear attention's recurrence
(decode_peers.py): the pairs agree where their math is the same, both sides step at a
fixed position, and the comparison reports real times. `test_decode_step` is the
pytest-benchmark form (`--bench-seq-lens 4096 --benchmark-enable -n 0` times it)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from playground.registry import default_registry
from tests.benchmarks import decode_peers
from tests.benchmarks.decode_peers import D_MODEL, DECODE_PEERS, HEADS


def ours(variant: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return default_registry().build(variant, D_MODEL, HEADS, bias=False).eval()


@torch.no_grad()
def test_llama_attention_with_our_weights_decodes_as_our_rope():
    """HF's own prefill (its forward over the prompt, causal, into a DynamicCache) and
    three steps, against ours."""
    from transformers import DynamicCache

    rope = ours("rope")
    attention, rotary = decode_peers.llama_attention(rope, positions=16)
    prompt, tokens = torch.randn(1, 12, D_MODEL), torch.randn(1, 3, D_MODEL)
    causal = torch.full((12, 12), float("-inf")).triu(1)[None, None]  # additive, (1, 1, P, P)
    cache = DynamicCache(config=attention.config)
    position_embeddings = rotary(prompt, torch.arange(12)[None])
    theirs = [attention(prompt, position_embeddings, causal, cache=cache)[0]]
    expected, state = rope.prefill(prompt)
    expected = [expected]
    for t in range(3):
        token = tokens[:, t : t + 1]
        theirs.append(
            attention(token, rotary(token, torch.tensor([[12 + t]])), None, cache=cache)[0]
        )
        expected.append(rope.decode_step(token, state)[0])
    assert (torch.cat(theirs, dim=1) - torch.cat(expected, dim=1)).abs().max() < 1e-5


# Not `variant`: conftest.py parametrizes a test that names it over the quick spec.
@pytest.mark.parametrize(
    ("peer", "ours_name"),
    [(peer, variant) for peer, entry in DECODE_PEERS.items() for variant in entry.variants],
)
def test_compare_decode_checks_then_times_both_sides(peer, ours_name):
    row = decode_peers.compare_decode(peer, ours_name, 32, turns=1, min_run_time=0.01)
    assert row.ours_s > 0 and row.theirs_s > 0
    assert row.ratio == pytest.approx(row.theirs_s / row.ours_s)
    if ours_name in DECODE_PEERS[peer].same_math:
        assert row.error is not None and row.error < 1e-5
    else:
        assert row.error is None
    assert row.state_bytes > 0


@torch.no_grad()
@pytest.mark.parametrize("peer", ["Llama+DynamicCache", "Llama+StaticCache"])
def test_both_sides_step_at_the_same_position_every_time(peer):
    """A rewound cache: the second step's output is the first's, and differs from a
    step one position on."""
    rope = ours("rope")
    prompt, token = torch.randn(1, 20, D_MODEL), torch.randn(1, 1, D_MODEL)
    our_step, _ = decode_peers._our_step(rope, prompt, token)
    their_step = DECODE_PEERS[peer].build(rope, prompt, token)
    for step in (our_step, their_step):
        assert torch.equal(step(), step())
    longer = torch.cat([prompt, token], dim=1)
    assert not torch.allclose(our_step(), decode_peers._our_step(rope, longer, token)[0]())


def test_a_peer_that_disagrees_stops_the_run(monkeypatch):
    swapped = (("k_proj", "q_proj"), ("q_proj", "k_proj"), ("v_proj", "v_proj"))
    monkeypatch.setattr(decode_peers, "PORTED", (*swapped, ("out_proj", "o_proj")))
    with pytest.raises(AssertionError, match="disagree"):
        decode_peers.compare_decode("Llama+StaticCache", "rope", 16, turns=1, min_run_time=0.01)


def test_main_prints_the_ratios_of_one_run(capsys):
    linear_only = ["--peers", f"recurrence (eqs. 18-20),{decode_peers.LENGTH_PEER}"]
    rows = decode_peers.main(
        ["--seq-lens", "16,32", "--turns", "1", "--min-run-time", "0.01", *linear_only]
    )
    assert [(row.peer, row.context) for row in rows] == [
        ("recurrence (eqs. 18-20)", 16),
        ("recurrence (eqs. 18-20)", 32),
        (decode_peers.LENGTH_PEER, 16),
        (decode_peers.LENGTH_PEER, 32),
    ]
    printed = capsys.readouterr().out
    assert "ours faster by" in printed and "linear: our step at n=32 takes" in printed


def test_unknown_peers_and_bad_lengths_are_refused():
    with pytest.raises(SystemExit, match="unknown peer"):
        decode_peers.main(["--peers", "NoSuchAttention", "--seq-lens", "16"])
    for text in ("1024,abc", "0"):
        with pytest.raises(SystemExit, match="--seq-lens"):
            decode_peers.main(["--seq-lens", text])


SIDES = [
    ("ours", "vanilla"),
    ("ours", "rope"),
    ("Llama+DynamicCache", "rope"),
    ("Llama+StaticCache", "rope"),
    ("ours", "linear"),
    ("recurrence (eqs. 18-20)", "linear"),
]


@pytest.mark.parametrize(("side", "ours_name"), SIDES, ids=[f"{s}-{v}" for s, v in SIDES])
def test_decode_step(benchmark, side, ours_name, context_length):
    """One step after `context_length` tokens (pytest-benchmark; once in the smoke run)."""
    module = ours(ours_name)
    prompt, token = torch.randn(1, context_length, D_MODEL), torch.randn(1, 1, D_MODEL)
    with torch.no_grad():
        if side == "ours":
            step = decode_peers._our_step(module, prompt, token)[0]
        else:
            step = DECODE_PEERS[side].build(module, prompt, token)
        step()
    benchmark.group = f"decode n={context_length}"
    benchmark.extra_info.update(side=side, variant=ours_name, context=context_length)
    output = benchmark(torch.no_grad()(step))
    assert output.shape == (1, 1, D_MODEL) and bool(torch.isfinite(output).all())
