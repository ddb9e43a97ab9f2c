"""Associative recall beyond the training length (issue 45 part 3): a model trained on MQAR
at L is scored, unchanged, at longer lengths with proportionally more pairs; each length
is a row of its own, a length past a declared max_seq_len is `unsupported`, and the rows
hold what scoring the kept weights directly gives."""

from __future__ import annotations

import textwrap

import pytest
import torch

from playground.model.training import evaluate
from playground.registry import Registry
from playground.tasks import IGNORE
from playground.tasks.mqar import MQAR
from tests.run.test_language import (  # noqa: F401 (fixtures)
    CAPPED_PLUGIN,
    _no_gemm,
    _reset_default_registry,
    model_of,
    resume_runner,
    run_spec,
)

L = 16
LIMIT = 2 * L  # the capped variant's declared max_seq_len (CAPPED_PLUGIN at L = 16)


@pytest.fixture
def registry(write_plugin) -> Registry:
    path = write_plugin("capped.py", CAPPED_PLUGIN)
    return Registry.discover([path.parent], entry_points=False)


def spec(variants: str, *, top: str = "") -> str:
    return textwrap.dedent(
        f"""\
        name = "mqar_long"
        measures = ["accuracy"]
        accuracy_workers = 1
        {top}
        {variants}
        [[tasks]]
        name = "mqar"
        seq_len = {L}
        num_pairs = 2
        vocab_size = 32
        eval_lengths = [{2 * L}, {4 * L}]
        steps = 20
        batch_size = 8
        seeds = 2
        d_model = 16
        num_heads = 2
        num_layers = 1
        """
    )


def test_mqar_has_more_pairs_in_proportion_at_each_length():
    task = MQAR(seq_len=64, num_pairs=4, vocab_size=128)
    for factor in (2, 4, 8):
        longer = task.at_length(64 * factor)
        assert (longer.options.seq_len, longer.options.num_pairs) == (64 * factor, 4 * factor)
        assert longer.options.vocab_size == 128
        data = longer.test_split(0)
        assert data.tokens.shape[1] == 64 * factor
        assert int((data.labels[0] != IGNORE).sum()) == 4 * factor  # every pair queried once


class Lookup(torch.nn.Module):
    """An oracle with MQAR's lookup built in: at each query it answers the value that
    followed the same key earlier; `blind` answers from the query token alone."""

    def __init__(self, vocab: int, *, blind: bool = False) -> None:
        super().__init__()
        self.vocab, self.blind = vocab, blind

    def forward(self, tokens, mask=None, positions=None):
        logits = torch.zeros(*tokens.shape, self.vocab)
        for b, row in enumerate(tokens.tolist()):
            seen: dict[int, int] = {}
            for i, token in enumerate(row):
                if self.blind:
                    logits[b, i, self.vocab // 2 + token % (self.vocab // 2)] = 1.0
                elif token in seen:
                    logits[b, i, seen[token]] = 1.0
                if i > 0 and row[i - 1] not in seen and row[i - 1] != 0:
                    seen[row[i - 1]] = token
        return logits[positions] if positions is not None else logits


@pytest.mark.parametrize("factor", [1, 2, 4, 8])
def test_a_model_that_looks_keys_up_recalls_at_every_length_and_a_blind_one_is_at_chance(factor):
    task = MQAR(seq_len=32, num_pairs=4, vocab_size=128)
    data = task.at_length(32 * factor).test_split(0)
    assert evaluate(Lookup(128), data) == 1.0
    assert evaluate(Lookup(128, blind=True), data) < 3 * task.chance  # chance 1/64


def test_a_row_per_length_with_the_scaled_task_and_unsupported_past_a_limit(registry, tmp_path):
    variants = '[[variants]]\nname = "vanilla"\n[[variants]]\nname = "capped"\n'
    store = run_spec(registry, tmp_path, spec(variants, top="save_weights = true"))
    rows = {row["cell"]: row for row in store.rows()}
    assert len(rows) == 2 * 3
    vanilla = {row["eval_length"]: row for row in rows.values() if row["variant"] == "vanilla"}
    trained = vanilla[L]
    assert trained["train_length"] == L and "evaluations" not in trained
    for length, row in vanilla.items():
        assert row["status"] == "ok", row.get("error")
        assert row["task_options"]["num_pairs"] == 2 * length // L
        suffix = "" if length == L else f" at n={length}"
        assert row["task_label"] == trained["task_label"] + suffix
        assert row["cell"] == trained["cell"] + ("" if length == L else f"|eval_len={length}")
        pairs = 2 * length // L
        assert len(row["accuracy_per_seed"]) == 2
        assert row["accuracy_scored"] == MQAR(seq_len=L, num_pairs=2).num_test * pairs
        # the row holds the trained model scored there, not a model trained there
        for index, seed in enumerate(("0", "1")):
            model = model_of(trained, registry, seed, store)
            data = MQAR(**trained["task_options"]).at_length(length).test_split(int(seed))
            assert row["accuracy_per_seed"][index] == evaluate(model, data)
    capped = {row["eval_length"]: row for row in rows.values() if row["variant"] == "capped"}
    assert capped[LIMIT]["status"] == "ok"
    assert capped[4 * L]["status"] == "unsupported"
    assert f"sequences of {4 * L} tokens (its limit is {LIMIT})" in capped[4 * L]["error"]
    assert "accuracy_mean" not in capped[4 * L]  # not inherited from the trained length
    assert resume_runner(registry, store).pending() == []


def test_mad_recall_scales_its_pairs_and_names_its_odd_lengths():
    from playground.errors import ConfigError
    from playground.tasks.mad.recall import InContextRecall, NoisyInContextRecall

    for kind in (InContextRecall, NoisyInContextRecall):
        task = kind()  # sequences of 128 tokens, the model sees 127
        longer = task.at_length(2 * task.seq_len + 1)
        assert type(longer) is kind and longer.seq_len == 255
        assert longer.test_split(0).tokens.shape[1] == 255
        assert longer.chance == task.chance and longer.vocab_size == task.vocab_size
        with pytest.raises(ConfigError, match="score at 255 or 257"):
            task.at_length(256)


def test_a_window_of_one_sees_no_key_and_recalls_at_chance_at_every_length(registry, tmp_path):
    """A model whose every layer sees only the current token cannot know which value a
    query's key had: at chance at L and past it, however it trained."""
    variants = '[[variants]]\nname = "sliding_window"\nwindow = 1\n'
    store = run_spec(registry, tmp_path, spec(variants))
    rows = store.rows()
    assert sorted(row["eval_length"] for row in rows) == [L, 2 * L, 4 * L]
    for row in rows:
        assert row["status"] == "ok", row.get("error")
        assert row["chance"] == pytest.approx(1 / 16)
        assert row["accuracy_mean"] < 2 * row["chance"], row["eval_length"]
