"""T5 relative position bias: T5's buckets (hand-checked and against HF), the module against
HF's T5Attention, the fast path's blocking and bias cache, and bias sharing across layers."""

from __future__ import annotations

import inspect

import pytest
import torch

import playground
from playground.contract import flops_exponent
from playground.decoding import TokenCache
from playground.testing import check_attention
from tests.variants.decoding import decoded_in_place

T5Relative = playground.get_variant("t5_relative")
relative_position_bucket = inspect.getmodule(T5Relative).relative_position_bucket

D_MODEL, HEADS = 32, 4

# (relative position j − i, bucket) for num_buckets 32, max_distance 128, worked by hand.
BIDIRECTIONAL_BUCKETS = [
    (0, 0), (-1, 1), (-7, 7), (-8, 8), (-12, 9), (-16, 10), (-32, 12), (-64, 14), (-90, 14),
    (-91, 15), (-128, 15), (-1000, 15), (1, 17), (8, 24), (16, 26), (64, 30), (90, 30),
    (91, 31), (1000, 31),
]  # fmt: skip
CAUSAL_BUCKETS = [
    (5, 0), (1, 0), (0, 0), (-1, 1), (-15, 15), (-16, 16), (-32, 21), (-64, 26), (-112, 30),
    (-113, 31), (-1000, 31),
]  # fmt: skip


@pytest.mark.parametrize(
    ("bidirectional", "expected"), [(True, BIDIRECTIONAL_BUCKETS), (False, CAUSAL_BUCKETS)]
)
def test_buckets_match_hand_checked_values(bidirectional, expected):
    relative = torch.tensor([r for r, _ in expected])
    buckets = relative_position_bucket(relative, bidirectional, 32, 128)
    assert buckets.tolist() == [b for _, b in expected]


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (8, 20), (64, 256), (6, 7)])
def test_buckets_equal_huggingface(bidirectional, num_buckets, max_distance):
    modeling_t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    relative = torch.arange(-300, 301)
    theirs = modeling_t5.T5Attention._relative_position_bucket(
        relative, bidirectional, num_buckets, max_distance
    )
    ours = relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
    assert torch.equal(ours, theirs)


def hf_t5_attention_like(module, is_decoder: bool):
    """HF's T5Attention with `module`'s weights copied in."""
    transformers = pytest.importorskip("transformers")
    modeling_t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    config = transformers.T5Config(
        d_model=D_MODEL,
        d_kv=D_MODEL // HEADS,
        num_heads=HEADS,
        relative_attention_num_buckets=module.config.num_buckets,
        relative_attention_max_distance=module.config.max_distance,
        dropout_rate=0.0,
        is_decoder=is_decoder,
    )
    config._attn_implementation = "eager"
    theirs = modeling_t5.T5Attention(config, has_relative_attention_bias=True, layer_idx=0)
    with torch.no_grad():
        for mine, their_name in (
            ("q_proj", "q"),
            ("k_proj", "k"),
            ("v_proj", "v"),
            ("out_proj", "o"),
        ):
            getattr(theirs, their_name).weight.copy_(getattr(module, mine).weight)
        theirs.relative_attention_bias.weight.copy_(module.relative_attention_bias.weight)
    return theirs.eval()


def additive_mask(keep: torch.Tensor, n_q: int, is_causal: bool) -> torch.Tensor:
    """HF's mask convention: (B, 1, Nq, Nk) float, 0 to keep and a large negative to drop."""
    allowed = keep[:, None, None, :].expand(-1, 1, n_q, -1)
    if is_causal:
        allowed = allowed & torch.ones(n_q, keep.shape[1], dtype=torch.bool).tril()
    return torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)


@pytest.mark.parametrize("impl", ["fast", "reference"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_module_equals_huggingface_t5_attention(impl, is_causal):
    torch.manual_seed(0)
    module = playground.build(
        "t5_relative", D_MODEL, HEADS, impl=impl, scale=1.0, bias=False, block_size=32
    ).eval()
    with torch.no_grad():  # nn.Embedding's N(0, 1) init; spread it so buckets matter
        module.relative_attention_bias.weight.mul_(3.0)
    theirs = hf_t5_attention_like(module, is_decoder=is_causal)
    n = 150  # past max_distance, so the clamped buckets are used too
    x = torch.randn(2, n, D_MODEL)
    keep = torch.ones(2, n, dtype=torch.bool)
    keep[1, -20:] = False
    keep[1, 40] = False
    with torch.no_grad():
        ours = module(x, attention_mask=keep, is_causal=is_causal).output
        expected = theirs(x, mask=additive_mask(keep, n, is_causal))[0]
    assert (ours - expected).abs().max().item() < 1e-5
    assert torch.equal(
        module.logit_bias(n, n, bidirectional=not is_causal), theirs.compute_bias(n, n)
    )


def test_bias_follows_the_bucket_table():
    """With q zeroed, attention weights are softmax_j(table[bucket(j − i), h])."""
    module = playground.build("t5_relative", D_MODEL, HEADS, num_buckets=8, max_distance=6)
    with torch.no_grad():
        module.q_proj.weight.zero_()
        module.q_proj.bias.zero_()
    weights = module(torch.randn(1, 10, D_MODEL), need_weights=True).weights[0]  # (H, N, N)
    table = module.relative_attention_bias.weight.detach()  # (8, H)
    # bidirectional, 4 buckets per side, exact below 2: j − i = -1 → 1, -3 → 2, +1 → 5, +7 → 7
    for i, j, bucket in ((5, 4, 1), (5, 2, 2), (5, 6, 5), (2, 9, 7), (3, 3, 0)):
        buckets = relative_position_bucket(torch.arange(10) - i, True, 8, 6)  # (N,)
        assert buckets[j].item() == bucket
        torch.testing.assert_close(weights[:, i], table[buckets].softmax(dim=0).t())


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize(("n_q", "n_k", "block_size"), [(37, 150, 16), (150, 37, 16), (64, 64, 7)])
def test_fast_blocks_match_reference(n_q, n_k, block_size, is_causal, padding):
    """Blocked fast path = dense reference: outputs and bias-table gradients, at lengths
    past max_distance, with partial blocks and cross-attention both ways."""
    torch.manual_seed(0)
    fast = playground.build("t5_relative", D_MODEL, HEADS, block_size=block_size)
    reference = playground.build("t5_relative", D_MODEL, HEADS, impl="reference")
    reference.load_state_dict(fast.state_dict())
    query, memory = torch.randn(2, n_q, D_MODEL), torch.randn(2, n_k, D_MODEL)
    keep = torch.ones(2, n_k, dtype=torch.bool)
    keep[1, 3 : n_k // 2] = False
    mask = keep if padding else None
    upstream = torch.randn(2, n_q, D_MODEL)
    outputs = []
    for module in (fast, reference):
        output = module(query, memory, attention_mask=mask, is_causal=is_causal).output
        (output * upstream).sum().backward()
        outputs.append(output)
    torch.testing.assert_close(outputs[0], outputs[1], atol=1e-5, rtol=0)
    table_grads = [m.relative_attention_bias.weight.grad for m in (fast, reference)]
    assert table_grads[1].abs().max() > 0
    torch.testing.assert_close(table_grads[0], table_grads[1], atol=1e-5, rtol=0)


def test_fast_path_never_serves_a_stale_bias():
    """The fast path caches buckets, not bias values: a trained table is seen at once."""
    torch.manual_seed(0)
    fast = playground.build("t5_relative", D_MODEL, HEADS).eval()
    reference = playground.build("t5_relative", D_MODEL, HEADS, impl="reference").eval()
    x = torch.randn(1, 20, D_MODEL)
    with torch.no_grad():
        fast(x)  # fills the cache
        fast.relative_attention_bias.weight.add_(torch.randn(32, HEADS))
        reference.load_state_dict(fast.state_dict())
        torch.testing.assert_close(fast(x).output, reference(x).output, atol=1e-5, rtol=0)
    table_before = fast.relative_attention_bias.weight.detach().clone()
    optimizer = torch.optim.SGD(fast.parameters(), lr=0.1)
    fast(x).output.square().sum().backward()
    optimizer.step()
    reference.load_state_dict(fast.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(fast(x).output, reference(x).output, atol=1e-5, rtol=1e-5)
    assert not torch.equal(fast.relative_attention_bias.weight, table_before)  # it did train


def test_layers_can_share_one_bias_table():
    torch.manual_seed(0)
    first = playground.build("t5_relative", D_MODEL, HEADS)
    second = playground.build("t5_relative", D_MODEL, HEADS)
    x = torch.randn(1, 12, D_MODEL)
    before = second(x).output.detach()
    second.share_relative_bias_with(first)
    assert second.relative_attention_bias.weight is first.relative_attention_bias.weight
    assert not torch.equal(second(x).output, before)  # it now uses first's table
    (first(x).output.sum() + second(second(x).output).output.sum()).backward()
    shared = first.relative_attention_bias.weight
    with torch.no_grad():
        shared.add_(1.0)
    assert torch.equal(second.relative_attention_bias.weight, shared)
    stack = torch.nn.ModuleList([first, second])
    assert sum(p is shared for p in stack.parameters()) == 1  # one parameter, not two

    other_buckets = playground.build("t5_relative", D_MODEL, HEADS, num_buckets=16)
    with pytest.raises(ValueError, match="num_buckets"):
        other_buckets.share_relative_bias_with(first)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"num_buckets": 31}, "num_buckets must be an even integer"),
        ({"num_buckets": 2}, "num_buckets must be an even integer >= 4"),
        ({"max_distance": 16}, "max_distance must exceed"),
        ({"scale": 0.0}, "scale must be a positive"),
        ({"dropout": 1.0}, "dropout must be in"),
        ({"block_size": 0}, "block_size must be a positive"),
    ],
)
def test_invalid_options_are_refused(options, message):
    with pytest.raises(playground.ConfigError, match=message):
        playground.build("t5_relative", D_MODEL, HEADS, **options)


def test_default_scale_and_flops():
    module = playground.build("t5_relative", 512, 8)
    assert module.scale == pytest.approx(1 / 8)
    assert playground.build("t5_relative", 512, 8, scale=1.0).scale == 1.0
    # 4 projections of 2·n·d², Q Kᵀ and P V of 2·n²·d each, the bias add n²·H
    assert module.count_flops(100, 100) == 4 * 2 * 100 * 512**2 + 4 * 100**2 * 512 + 100**2 * 8
    assert flops_exponent(T5Relative) == pytest.approx(2.0, abs=0.05)  # quadratic


def test_contract_suite_with_default_options():
    """The contract suite runs with small buckets (suite_options); T5's default buckets
    pass the checks they bear on too: parity of the fast path, causality, gradients,
    padding. (Blocks, partial and causal, are the suite options' 5; one block here keeps
    the suite from testing n = block_size + 1, which the default would make 257.)"""
    from playground.testing import checks

    report = check_attention(
        "t5_relative",
        checks=[
            checks.check_fast_matches_reference,
            checks.check_causality,
            checks.check_padding_invariance,
            checks.check_gradients_reach_every_parameter,
            checks.check_large_magnitude_inputs,
        ],
        options={"num_buckets": 32, "max_distance": 128, "block_size": 1024},
    )
    assert report.ok, report.failures


def test_training_memory_stays_below_one_dense_score_matrix():
    """Backward recomputes each query block, so forward+backward never holds the
    (H, n, n) probabilities of all blocks at once."""
    from playground.run.instruments import peak_memory_bytes
    from playground.run.measurer import Workload as workload

    def peak(n: int, block_size: int) -> int:
        module = playground.build("t5_relative", d_model=64, num_heads=8, block_size=block_size)
        return peak_memory_bytes(workload(module, torch.randn(1, n, 64), "forward_backward"))

    # far below one dense (H, n, n) float32 matrix of scores
    assert peak(512, 64) < 8 * 512 * 512 * 4 / 4
    # and with blocks, doubling n doubles memory (linear), not ×4
    assert peak(1024, 64) < 2.2 * peak(512, 64)


def test_the_bias_table_starts_as_t5_initialises_it():
    """T5 draws the table from N(0, 1/d_model), not nn.Embedding's N(0, 1): biases of about
    ±1 per distance at the start slow training (MQAR learned on fewer seeds)."""
    torch.manual_seed(0)
    table = playground.build("t5_relative", 256, 8, num_buckets=32).relative_attention_bias
    assert table.weight.std().item() == pytest.approx(256**-0.5, rel=0.2)


# --- decoding: a key/value cache; the bias looked up per step -----------------------------
def test_the_decoding_state_is_a_key_value_cache():
    """A float32 key and value per token and head (2·B·H·L·d·4) and a real-token flag
    (B·L), allocated once for max_length = L; no bias is kept."""
    torch.manual_seed(0)
    module = playground.build("t5_relative", D_MODEL, HEADS, **T5Relative.suite_options).eval()
    state = decoded_in_place(module, batch=2, length=12)
    assert isinstance(state, TokenCache)
    assert state.nbytes == 2 * 2 * HEADS * 12 * (D_MODEL // HEADS) * 4 + 2 * 12
