"""Task generators: labels checked against independent oracles and hand-evaluated
examples, determinism, disjoint splits, and clear errors for bad options."""

from __future__ import annotations

import pytest
import torch

from playground.errors import ConfigError, InvalidInput
from playground.registry import Registry
from playground.tasks import IGNORE, PAD, example_fingerprints
from playground.tasks.listops import TOKEN_ID, VOCABULARY, ListOps, evaluate
from playground.tasks.mqar import MQAR
from playground.tasks.positional import Lookback


def test_builtin_tasks_are_registered(bundled_registry: Registry) -> None:
    assert {"mqar", "listops", "lookback"} <= set(bundled_registry.task_names())
    assert bundled_registry.get_task("mqar") is MQAR
    assert not [e for e in bundled_registry.errors if "playground.tasks" in e.source]


# --- MQAR -------------------------------------------------------------------------
def _mqar_oracle(tokens: list[int], num_pairs: int) -> dict[int, int]:
    """Expected label at each query position, read off the pairs by hand."""
    pairs = {tokens[2 * i]: tokens[2 * i + 1] for i in range(num_pairs)}
    return {p: pairs[t] for p, t in enumerate(tokens) if p >= 2 * num_pairs and t in pairs}


def test_mqar_hand_built_sequence() -> None:
    # keys 3, 5; values 40, 33; queries: 5 at position 6, 3 at position 7.
    tokens = [3, 40, 5, 33, 0, 0, 5, 3]
    assert _mqar_oracle(tokens, 2) == {6: 33, 7: 40}


@pytest.mark.parametrize("placement", ["random", "end"])
def test_mqar_labels_are_the_values_of_the_queried_keys(placement: str) -> None:
    task = MQAR(seq_len=32, num_pairs=4, vocab_size=32, query_placement=placement)
    data = task.generate(64, seed=3)
    half = task.options.vocab_size // 2
    for tokens, labels in zip(data.tokens.tolist(), data.labels.tolist(), strict=True):
        keys = tokens[0:8:2]
        assert len(set(keys)) == 4 and all(1 <= k < half for k in keys)
        assert all(half <= v < 32 for v in tokens[1:8:2])
        expected = _mqar_oracle(tokens, 4)
        scored = {p: label for p, label in enumerate(labels) if label != IGNORE}
        assert scored == expected and len(scored) == 4  # each key queried exactly once
        # The answer is never in the input at a query, nor anywhere after the pairs.
        assert all(t < half for t in tokens[8:])
        if placement == "end":
            assert sorted(scored) == list(range(28, 32))


def test_mqar_far_setting_puts_queries_beyond_a_window() -> None:
    task = MQAR(seq_len=256, num_pairs=16, query_placement="end")
    data = task.generate(8, seed=0)
    for tokens, labels in zip(data.tokens, data.labels, strict=True):
        for position in (labels != IGNORE).nonzero().flatten().tolist():
            key_position = tokens[:32].tolist().index(int(tokens[position]))
            assert position - key_position >= 256 - 3 * 16 + 1


# --- ListOps ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("[MAX 2 9 [MIN 4 7 ] 0 ]", 9),
        ("[SM 3 [MED 1 8 6 ] 9 ]", 8),  # MED 1 8 6 = 6; 3 + 6 + 9 = 18
        ("[MED 1 2 ]", 1),  # median 1.5, truncated as LRA's int(median)
        ("[MED 3 9 4 7 ]", 5),  # median 5.5
        ("[SM 9 9 9 ]", 7),
        ("[MIN [MAX 1 5 ] [SM 4 4 ] 6 ]", 5),
        ("7", 7),
    ],
)
def test_listops_evaluates_hand_checked_expressions(expression: str, value: int) -> None:
    assert evaluate(expression.split()) == value


@pytest.mark.parametrize("expression", ["[MAX 2 9", "[MAX 2 ] ]", "[FOO 1 2 ]", "1 2"])
def test_listops_rejects_malformed_expressions(expression: str) -> None:
    with pytest.raises(InvalidInput):
        evaluate(expression.split())


def test_listops_generated_labels_match_the_expressions() -> None:
    task = ListOps(min_length=8, max_length=40, max_depth=4, max_args=4)
    data = task.generate(200, seed=1)
    assert data.tokens.shape == (200, 41) and data.labels.shape == (200,)
    assert data.attention_mask is not None
    assert torch.equal(data.attention_mask, data.tokens != PAD)
    assert (data.tokens[:, 0] == TOKEN_ID["[CLS]"]).all()
    lengths = data.attention_mask.sum(dim=1) - 1  # without [CLS]
    assert lengths.min() >= 8 and lengths.max() <= 40
    for tokens, mask, label in zip(data.tokens, data.attention_mask, data.labels, strict=True):
        expression = [VOCABULARY[t] for t in tokens[mask][1:].tolist()]
        assert evaluate(expression) == int(label)
    assert len(set(data.labels.tolist())) > 3  # not a degenerate generator


def test_listops_respects_the_depth_bound() -> None:
    task = ListOps(min_length=4, max_length=64, max_depth=3)
    data = task.generate(100, seed=0)
    opening = torch.isin(data.tokens, torch.tensor([TOKEN_ID[o] for o in VOCABULARY[12:16]]))
    closing = data.tokens == TOKEN_ID["]"]
    depth = (opening.long() - closing.long()).cumsum(dim=1)
    assert depth.max() <= 2  # operators at depths 1 and 2; depth 3 holds digits only


# --- the positional task ------------------------------------------------------------
def test_lookback_labels_are_the_tokens_offset_places_back() -> None:
    task = Lookback(seq_len=20, offset=3, vocab_size=10)
    data = task.generate(50, seed=0)
    assert (data.labels[:, :3] == IGNORE).all()
    assert torch.equal(data.labels[:, 3:], data.tokens[:, :-3])
    assert data.tokens.min() >= 1 and data.tokens.max() < 10


# --- every task -----------------------------------------------------------------------
TASKS = [
    MQAR(seq_len=32, num_pairs=4),
    ListOps(max_length=32),
    Lookback(seq_len=32),
]


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_generation_is_deterministic(task) -> None:
    first, again, other = task.generate(16, seed=5), task.generate(16, seed=5), task.generate(16, 6)
    assert torch.equal(first.tokens, again.tokens) and torch.equal(first.labels, again.labels)
    assert not torch.equal(first.tokens, other.tokens)


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_train_and_test_splits_are_disjoint(task) -> None:
    train, test = task.split(seed=0, num_train=512, num_test=128)
    assert len(test) == 128 and len(train) > 400
    assert not set(example_fingerprints(train)) & set(example_fingerprints(test))


def test_split_drops_train_examples_that_repeat_test_ones() -> None:
    task = Lookback(seq_len=3, offset=1, vocab_size=3)  # only 8 possible sequences
    train, test = task.split(seed=0, num_train=200, num_test=2)
    validation = task.validation_split(seed=0, num_examples=2)
    assert len(train) < 200  # duplicates of the held-out sets were removed...
    for held_out in (test, validation):  # ...all of them
        assert not set(example_fingerprints(train)) & set(example_fingerprints(held_out))


def test_a_split_with_nothing_left_to_train_on_says_so() -> None:
    task = Lookback(seq_len=3, offset=1, vocab_size=3)  # 8 sequences, 16 held out
    with pytest.raises(ConfigError, match="nothing is left to train on"):
        task.split(seed=0, num_train=200, num_test=8)


def test_the_validation_split_is_a_stream_of_its_own() -> None:
    """Neither the train nor the test stream of any small seed, nor seed 0's train stream
    (a seed past 2³² wraps onto it in torch's generator)."""
    task = MQAR()
    validation = task.validation_split(seed=0, num_examples=64)
    for seed in range(4):
        for stream in (2 * seed, 2 * seed + 1):
            assert not torch.equal(task.generate(64, stream).tokens, validation.tokens)
    assert not torch.equal(task.validation_split(1, 64).tokens, validation.tokens)


@pytest.mark.parametrize(
    ("cls", "options", "message"),
    [
        (MQAR, {"num_pairs": 40, "vocab_size": 64}, "distinct keys"),
        (MQAR, {"seq_len": 10, "num_pairs": 4}, "3 × num_pairs"),
        (MQAR, {"query_placement": "middle"}, "must be one of"),
        (MQAR, {"pairs": 4}, "has no option 'pairs'"),
        (MQAR, {"num_pair": 4}, r"has no option 'num_pair' \(did you mean 'num_pairs'\?\)"),
        (MQAR, {"seq_len": "64"}, "must be an integer"),
        (ListOps, {"min_length": 50, "max_length": 20}, "min_length <= max_length"),
        (Lookback, {"offset": 64}, "offset must be between"),
    ],
)
def test_bad_options_raise_config_error(cls, options, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        cls(**options)


def test_label_names_changed_options() -> None:
    assert MQAR().label == "mqar"
    assert MQAR(seq_len=128, num_pairs=8).label == "mqar(seq_len=128, num_pairs=8)"


# --- ListOps options no expression satisfies (issue 30 §4) ------------------------------
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"operator_probability": 1.0}, r"no ListOps expression .* shortest expression has 1534"),
        (
            {"max_args": 2, "min_length": 5, "max_length": 5},
            r"no ListOps expression has between min_length = 5 and max_length = 5",
        ),
        (
            {"min_length": 60, "max_length": 64, "operator_probability": 0.05},
            r"only a share .* draws; widen the length range",
        ),
    ],
)
def test_listops_options_no_expression_satisfies_are_refused(options, message) -> None:
    """These passed validation and then made the generator loop forever."""
    with pytest.raises(ConfigError, match=message):
        ListOps(**options)


def test_listops_options_that_only_some_trees_satisfy_still_work() -> None:
    # operator_probability = 1 is fine where the full trees fit; lengths 4 only: 2 digits
    for options in ({"max_depth": 2, "operator_probability": 1.0}, {"max_args": 2}):
        task = ListOps(min_length=4, max_length=4, **options)
        assert (task.generate(8, seed=0).tokens != PAD).sum(dim=1).eq(5).all()  # [CLS] + 4


def test_listops_acceptance_rate_matches_sampling() -> None:
    """The exact length distribution behind the check agrees with the generator."""
    import random

    from playground.tasks.listops import _TooLong, acceptance_rate, possible_lengths

    task = ListOps(min_length=10, max_length=30, max_depth=5, max_args=4, operator_probability=0.4)
    rng, accepted, lengths, draws = random.Random(0), 0, set(), 20_000
    for _ in range(draws):
        tokens: list[str] = []
        try:
            task._grow(rng, 1, tokens)
        except _TooLong:
            continue
        lengths.add(len(tokens))
        accepted += len(tokens) >= 10
    assert accepted / draws == pytest.approx(acceptance_rate(task.options), abs=0.01)
    assert sorted(lengths) == possible_lengths(task.options)


def test_listops_sampling_is_bounded_even_if_every_draw_is_rejected(monkeypatch) -> None:
    from playground.tasks import listops

    task = ListOps(max_length=32)

    def too_long(rng, depth, tokens):
        raise listops._TooLong

    monkeypatch.setattr(task, "_grow", too_long)
    monkeypatch.setattr(listops, "acceptance_rate", lambda options: 0.5)
    with pytest.raises(InvalidInput, match=r"no ListOps expression .* in 80 draws"):
        task.generate(1, seed=0)


@pytest.mark.parametrize("seq_len", [-5, 0, 1])
def test_a_bad_lookback_seq_len_is_named_not_reported_as_an_offset(seq_len) -> None:
    with pytest.raises(ConfigError, match=rf"seq_len must be at least 2 .*got {seq_len}"):
        Lookback(seq_len=seq_len)
