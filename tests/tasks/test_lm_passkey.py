"""The lm task's passkey format (issue 45 part 2): training windows that carry a needle and
end with its key, the probe's prompts built from the test split, the options that set
them, and the corpora the format refuses (Mohtashami & Jaggi 2023, "Landmark Attention",
§4.2; Kamradt's needle in a haystack; RULER, Hsieh et al. 2024)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from playground.errors import ConfigError
from playground.tasks import IGNORE, LanguageTask
from playground.tasks.lm import ByteLanguageModelling, passkey
from playground.tasks.lm.corpus import CorpusError, load_corpus
from playground.tasks.lm.passkey import END, MARK, QUERY
from tests.tasks.text_corpus import write_corpus

SEQ_LEN = 64
DIGITS = 5
NEEDLE = passkey.needle_length(DIGITS)
FILLER = SEQ_LEN + 1 - passkey.overhead(DIGITS)  # filler bytes of a training window


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("passkey") / "text", files=12, size=4000)


def make_task(corpus: Path, **options) -> ByteLanguageModelling:
    return ByteLanguageModelling(corpus=str(corpus), seq_len=SEQ_LEN, eval_bytes=512, **options)


def whole(tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The bytes a window of next-byte labels was cut from: its tokens and the last label."""
    return torch.cat([tokens, labels[:, -1:]], dim=1)


def marks(row: torch.Tensor) -> list[int]:
    return (row == MARK).nonzero().flatten().tolist()


# --- training windows ------------------------------------------------------------------
def test_fraction_zero_leaves_the_training_windows_as_they_were(corpus: Path) -> None:
    """The recipe before passkeys: windows of L + 1 bytes at offsets drawn from the seed.
    Neither the default options nor a probe without passkey training changes a byte."""
    stream = load_corpus(str(corpus)).streams["train"]
    generator = torch.Generator().manual_seed(11)
    starts = torch.randint(0, stream.numel() - SEQ_LEN, (200,), generator=generator)
    expected = torch.stack([stream[s : s + SEQ_LEN + 1].long() for s in starts.tolist()])
    for options in ({}, {"passkey_fraction": 0.0}, {"passkey_depths": [0.0, 0.5, 1.0]}):
        data = make_task(corpus, **options).generate(200, seed=11)
        assert torch.equal(data.tokens, expected[:, :-1]), options
        assert torch.equal(data.labels, expected[:, 1:]), options


def test_a_carrying_window_answers_its_query_with_the_key_of_its_needle(corpus: Path) -> None:
    data = make_task(corpus, passkey_fraction=1.0).generate(300, seed=3)
    keys, queries = set(), set()
    for row in whole(data.tokens, data.labels):
        needle, query = marks(row)  # one needle, one query, nothing else marked
        assert query >= needle + NEEDLE  # the query comes after the whole needle
        assert bytes(row[query : query + len(QUERY)].tolist()) == QUERY
        assert bytes(row[needle : needle + len(QUERY)].tolist()) == QUERY
        key = row[needle + len(QUERY) : needle + len(QUERY) + DIGITS]
        assert int(row[needle + NEEDLE - 1]) == END
        answer = row[query + len(QUERY) : query + len(QUERY) + DIGITS]
        assert torch.equal(answer, key)  # the answer is the needle's key
        assert bytes(key.tolist()).isdigit()
        keys.add(bytes(key.tolist()))
        queries.add(query)
    assert len(keys) > 290  # fresh keys, not one key learnt by heart
    # the query anywhere from right after a needle at 0 to the window's end
    assert min(queries) == NEEDLE and max(queries) == SEQ_LEN + 1 - DIGITS - len(QUERY)


def test_the_needle_and_query_are_hidden_in_the_windows_own_bytes(corpus: Path) -> None:
    """Take the needle and the query with its key out of a carrying window and what is
    left is the start of the window drawn without passkeys (same seed, same offsets); the
    needle is drawn from the window's start to the last place before the query, and the
    query's end uniformly over the window."""
    plain = make_task(corpus).generate(2000, seed=5)
    carried = make_task(corpus, passkey_fraction=1.0).generate(2000, seed=5)
    original = whole(plain.tokens, plain.labels)
    depths, ends = [], []
    span = len(QUERY) + DIGITS
    for row, before in zip(whole(carried.tokens, carried.labels), original, strict=True):
        at, query = marks(row)
        filler = torch.cat([row[:at], row[at + NEEDLE : query], row[query + span :]])
        assert torch.equal(filler, before[:FILLER])
        depths.append(at)
        ends.append(query + span)
    counts = torch.bincount(torch.tensor(ends), minlength=SEQ_LEN + 2)
    assert counts[: NEEDLE + span].sum() == 0 and counts[NEEDLE + span] > 0
    assert counts[SEQ_LEN + 1] > 0  # a key may end the window, as the probe's does
    halves = counts[NEEDLE + span :].split((SEQ_LEN + 2 - NEEDLE - span) // 2)
    assert abs(int(halves[0].sum()) - int(halves[1].sum())) < 200  # about 1000 each
    assert min(depths) == 0 and FILLER - 5 < max(depths) <= FILLER  # the needle spans the filler


def test_a_fraction_puts_a_needle_in_about_that_share_of_windows(corpus: Path) -> None:
    data = make_task(corpus, passkey_fraction=0.25).generate(4000, seed=9)
    carrying = int((data.tokens == MARK).any(dim=1).sum())
    assert abs(carrying - 1000) < 4 * (4000 * 0.25 * 0.75) ** 0.5  # 4 σ of a binomial


# --- the probe's prompts -----------------------------------------------------------------
def test_prompts_have_the_length_and_label_only_the_keys_digits(corpus: Path) -> None:
    task = make_task(corpus, passkey_depths=[0.5], passkey_trials=8)
    for length in (passkey.minimum_length(DIGITS), 100, 300):
        data = task.passkey_prompts(length, 0.5)
        assert data.tokens.shape == data.labels.shape == (8, length)
        assert data.attention_mask is None
        scored = data.labels != IGNORE
        assert scored[:, -DIGITS:].all() and not scored[:, :-DIGITS].any()
        for row, labels in zip(data.tokens, data.labels, strict=True):
            needle, query = marks(row)
            assert query == length - DIGITS + 1 - len(QUERY)  # the query ends the prompt …
            key = row[needle + len(QUERY) : needle + len(QUERY) + DIGITS]
            assert torch.equal(labels[-DIGITS:], key)  # … and is answered by the needle's key
            assert torch.equal(row[-DIGITS + 1 :], key[:-1])  # teacher forced: the key so far


def test_depth_zero_and_one_put_the_needle_at_the_fillers_start_and_end(corpus: Path) -> None:
    task = make_task(corpus, passkey_depths=[0.0, 1.0], passkey_trials=4)
    length = 120
    filler = length + 1 - passkey.overhead(DIGITS)
    start = task.passkey_prompts(length, 0.0).tokens
    assert (start[:, 0] == MARK).all()  # the needle opens the prompt
    end = task.passkey_prompts(length, 1.0).tokens
    assert (end[:, filler] == MARK).all() and (end[:, filler + NEEDLE - 1] == END).all()
    assert (end[:, filler + NEEDLE] == MARK).all()  # the query right after it
    middle = task.passkey_prompts(length, 0.25).tokens
    assert (middle[:, round(0.25 * filler)] == MARK).all()


def test_prompts_are_held_out_text_at_fixed_offsets(corpus: Path) -> None:
    """The filler is the test split's, trial t's from byte t · (S − F) // trials."""
    task = make_task(corpus, passkey_depths=[0.5], passkey_trials=4)
    test = task.corpus.streams["test"].long()
    length = 200
    filler = length + 1 - passkey.overhead(DIGITS)
    data = task.passkey_prompts(length, 0.5)
    for trial, row in enumerate(whole(data.tokens, data.labels)):
        at = marks(row)[0]
        text = torch.cat([row[:at], row[at + NEEDLE : filler + NEEDLE]])
        offset = trial * (test.numel() - filler) // 4
        assert torch.equal(text, test[offset : offset + filler])


def test_prompts_are_the_same_every_time_and_keys_differ_between_cells(corpus: Path) -> None:
    first = make_task(corpus, passkey_depths=[0.5])
    again = make_task(corpus, passkey_depths=[0.5], passkey_trials=32)
    data = first.passkey_prompts(150, 0.5)
    assert torch.equal(data.tokens, again.passkey_prompts(150, 0.5).tokens)
    assert torch.equal(data.labels, again.passkey_prompts(150, 0.5).labels)
    keys = {bytes(row[-DIGITS:].tolist()) for row in data.labels}
    assert len(keys) > 28  # a key per trial
    other_depth = first.passkey_prompts(150, 0.25).labels[:, -DIGITS:]
    other_length = first.passkey_prompts(151, 0.5).labels[:, -DIGITS:]
    assert not torch.equal(other_depth, data.labels[:, -DIGITS:])
    assert not torch.equal(other_length, data.labels[:, -DIGITS:])


def test_a_prompt_too_short_for_the_key_names_the_minimum(corpus: Path) -> None:
    task = make_task(corpus, passkey_depths=[0.5])
    shortest = passkey.minimum_length(DIGITS)
    assert shortest == 36  # needle 11, query 5, key 5 and 16 bytes of filler, less one
    with pytest.raises(ConfigError, match=f"at least {shortest}"):
        task.passkey_prompts(shortest - 1, 0.5)
    with pytest.raises(ConfigError, match=r"depth must be in \[0, 1\]"):
        task.passkey_prompts(100, 1.5)
    with pytest.raises(ConfigError, match="test split holds"):
        task.passkey_prompts(10_000, 0.5)


def test_a_task_without_a_probe_says_so() -> None:
    class Plain(LanguageTask):
        name = "plain"

    task = Plain()
    assert task.passkey_depths == ()
    with pytest.raises(ConfigError, match="task 'plain' has no passkey probe"):
        task.passkey_prompts(128, 0.5)


# --- the corpus and the options -----------------------------------------------------------
def test_the_standard_library_holds_neither_marker_byte() -> None:
    assert passkey.first_marked(load_corpus().streams) is None
    task = ByteLanguageModelling(passkey_depths=[0.5], seq_len=64)
    assert task.passkey_prompts(64, 0.5).tokens.shape == (32, 64)


@pytest.mark.parametrize("byte", [MARK, END])
def test_a_corpus_holding_a_marker_byte_is_refused_with_passkeys_on(
    tmp_path: Path, byte: int
) -> None:
    directory = write_corpus(tmp_path / "marked", files=12, size=4000)
    path = directory / "doc_03.txt"
    path.write_bytes(path.read_bytes()[:100] + bytes([byte]) + path.read_bytes()[100:])
    make_task(directory)  # without passkeys the byte is text like any other
    for options in ({"passkey_fraction": 0.1}, {"passkey_depths": [0.5]}):
        with pytest.raises(CorpusError, match=f"holds the byte {byte:#04x}"):
            make_task(directory, **options)
    with pytest.raises(CorpusError, match="passkey format keeps for itself"):
        make_task(directory).passkey_prompts(100, 0.5)


def test_spec_lists_become_tuples_of_floats(corpus: Path) -> None:
    task = make_task(corpus, passkey_depths=[0, 0.5, 1], passkey_fraction=1)
    assert task.options.passkey_depths == (0.0, 0.5, 1.0)
    assert all(isinstance(depth, float) for depth in task.passkey_depths)
    assert task.options.passkey_fraction == 1.0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"passkey_fraction": -0.1}, r"passkey_fraction must be a number in \[0, 1\]"),
        ({"passkey_fraction": 1.5}, r"passkey_fraction must be a number in \[0, 1\]"),
        ({"passkey_fraction": float("nan")}, r"passkey_fraction must be a number in \[0, 1\]"),
        ({"passkey_fraction": True}, "passkey_fraction"),
        ({"passkey_depths": [0.5, 1.2]}, r"passkey_depths must be a list of numbers in \[0, 1\]"),
        ({"passkey_depths": [-0.5]}, r"passkey_depths must be a list of numbers in \[0, 1\]"),
        ({"passkey_depths": [float("inf")]}, "passkey_depths must be a list of numbers"),
        ({"passkey_depths": [0.5, 0.5]}, "lists a depth twice"),
        ({"passkey_depths": 0.5}, "passkey_depths"),
        ({"passkey_trials": 0}, "passkey_trials must be a positive integer"),
        ({"passkey_digits": 0}, "passkey_digits must be a positive integer"),
        ({"passkey_digits": 2.0}, "passkey_digits"),
        (
            {"passkey_depths": [0.5], "seq_len": 32},
            "seq_len 32 is too short for a passkey of 5 digits: a window needs at least 36",
        ),
        (
            {"passkey_fraction": 0.5, "seq_len": 64, "passkey_digits": 20},
            "needs at least 66 tokens",
        ),
    ],
)
def test_bad_passkey_options_are_refused_by_name(corpus: Path, options, message: str) -> None:
    settings = {"corpus": str(corpus), "eval_bytes": 512, "seq_len": SEQ_LEN, **options}
    with pytest.raises(ConfigError, match=message):
        ByteLanguageModelling(**settings)


def test_a_short_window_is_fine_without_passkeys(corpus: Path) -> None:
    assert make_task(corpus, passkey_fraction=0.0).seq_len == SEQ_LEN
    assert ByteLanguageModelling(corpus=str(corpus), seq_len=16, eval_bytes=512).seq_len == 16


def test_an_evaluation_length_too_short_for_the_probe_is_refused_before_training(
    corpus: Path,
) -> None:
    """The spec refuses it (Task.check_eval_length), rather than the run recording that
    length as an error after training."""
    shortest = passkey.minimum_length(DIGITS)
    probed = make_task(corpus, passkey_depths=[0.5])
    with pytest.raises(ConfigError, match=f"needs at least {shortest} tokens"):
        probed.check_eval_length(shortest - 1)
    probed.check_eval_length(shortest)
    make_task(corpus).check_eval_length(shortest - 1)  # no probe: any length that fits
